#pragma once
// Several writer hooks behind the writer's one: the Outbox's own hot path, then the caller's
// (a commit notifier, a subscription's wake-up).

#include <memory>
#include <utility>
#include <vector>

#include "outbox/log.hpp"
#include "outbox/writer.hpp"

namespace outbox::internal {

class WriterHookChain final : public WriterHook {
 public:
  explicit WriterHookChain(std::vector<std::shared_ptr<WriterHook>> hooks)
      : hooks_(std::move(hooks)) {}

  // Each transforms what the one before returned; an empty result suppresses the write.
  std::vector<EventEnvelope> before_write(std::vector<EventEnvelope> events) override {
    for (const auto& hook : hooks_) {
      if (events.empty()) {
        break;
      }
      events = hook->before_write(std::move(events));
    }
    return events;
  }
  void after_write(const std::vector<EventEnvelope>& events) override {
    each("after_write", [&](WriterHook& hook) { hook.after_write(events); });
  }
  void after_commit(const std::vector<EventEnvelope>& events) override {
    each("after_commit", [&](WriterHook& hook) { hook.after_commit(events); });
  }
  void after_rollback(const std::vector<EventEnvelope>& events) override {
    each("after_rollback", [&](WriterHook& hook) { hook.after_rollback(events); });
  }
  void after_unknown_outcome(const std::vector<EventEnvelope>& events) override {
    each("after_unknown_outcome", [&](WriterHook& hook) { hook.after_unknown_outcome(events); });
  }
  std::string_view lock_owner() const override {
    for (const auto& hook : hooks_) {
      if (const auto owner = hook->lock_owner(); !owner.empty()) {
        return owner;
      }
    }
    return {};
  }

 private:
  // One hook that throws must not keep the next from running (the hot path, then a wake-up).
  template <typename Fn>
  void each(const char* what, Fn&& fn) {
    for (const auto& hook : hooks_) {
      try {
        fn(*hook);
      } catch (const std::exception& e) {
        log(LogLevel::Error, std::string("WriterHook::") + what + " threw: " + e.what());
      } catch (...) {
        log(LogLevel::Error,
            std::string("WriterHook::") + what + " threw a non-standard exception");
      }
    }
  }

  std::vector<std::shared_ptr<WriterHook>> hooks_;
};

}  // namespace outbox::internal
