#include "outbox/interceptor.hpp"

namespace outbox {
namespace {

class BeforeInterceptor final : public EventInterceptor {
 public:
  explicit BeforeInterceptor(std::function<void(const EventEnvelope&)> fn) : fn_(std::move(fn)) {}
  void before_dispatch(const EventEnvelope& e) override { fn_(e); }

 private:
  std::function<void(const EventEnvelope&)> fn_;
};

class AfterInterceptor final : public EventInterceptor {
 public:
  explicit AfterInterceptor(std::function<void(const EventEnvelope&, const DeliveryResult&)> fn)
      : fn_(std::move(fn)) {}
  void after_dispatch(const EventEnvelope& e, const DeliveryResult& result) override {
    fn_(e, result);
  }

 private:
  std::function<void(const EventEnvelope&, const DeliveryResult&)> fn_;
};

}  // namespace

std::shared_ptr<EventInterceptor> EventInterceptor::before(
    std::function<void(const EventEnvelope&)> fn) {
  return std::make_shared<BeforeInterceptor>(std::move(fn));
}

std::shared_ptr<EventInterceptor> EventInterceptor::after(
    std::function<void(const EventEnvelope&, const DeliveryResult&)> fn) {
  return std::make_shared<AfterInterceptor>(std::move(fn));
}

}  // namespace outbox
