#include "outbox/clock.hpp"

#include <gtest/gtest.h>

namespace outbox {
namespace {

TEST(Clock, FormatsRfc3339InUtcWithMicroseconds) {
  EXPECT_EQ(format_rfc3339(from_micros(0)), "1970-01-01T00:00:00.000000Z");
  // 2026-11-22T14:15:45.123456Z
  EXPECT_EQ(format_rfc3339(from_micros(1795356945123456)), "2026-11-22T14:15:45.123456Z");
  EXPECT_EQ(format_rfc3339(from_micros(951782400000001)), "2000-02-29T00:00:00.000001Z");
}

}  // namespace
}  // namespace outbox
