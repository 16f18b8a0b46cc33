#include "outbox/clock.hpp"

#include <cstdio>

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

std::string format_rfc3339(Timestamp t) {
  const auto us = to_micros(t);
  auto days = std::chrono::floor<std::chrono::days>(
      std::chrono::sys_time<std::chrono::microseconds>(std::chrono::microseconds(us)));
  const std::chrono::year_month_day ymd(days);
  std::int64_t rem =
      us - std::chrono::duration_cast<std::chrono::microseconds>(days.time_since_epoch()).count();
  const auto micros = rem % 1000000;
  rem /= 1000000;
  char buf[40];
  std::snprintf(buf, sizeof buf, "%04d-%02u-%02uT%02d:%02d:%02d.%06dZ", int(ymd.year()),
                unsigned(ymd.month()), unsigned(ymd.day()), int(rem / 3600), int(rem / 60 % 60),
                int(rem % 60), int(micros));
  return buf;
}

}  // namespace outbox
