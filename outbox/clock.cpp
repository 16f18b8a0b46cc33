#include "outbox/clock.hpp"

namespace outbox {
namespace {

class SystemClock final : public Clock {
 public:
  Timestamp now() const override { return std::chrono::system_clock::now(); }
};

}  // namespace

std::shared_ptr<Clock> Clock::system() {
  static const std::shared_ptr<Clock> instance = std::make_shared<SystemClock>();
  return instance;
}

}  // namespace outbox
