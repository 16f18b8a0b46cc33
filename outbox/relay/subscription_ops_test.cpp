#include "outbox/relay/subscription_ops.hpp"

#include <gtest/gtest.h>

namespace outbox::relay {
namespace {

TEST(ParseRfc3339, ReadsZonesAndFractionsAndRefusesDatesThatDoNotExist) {
  EXPECT_EQ(to_micros(parse_rfc3339("1970-01-01T00:00:01Z")), 1000000);
  EXPECT_EQ(to_micros(parse_rfc3339("1970-01-01T01:00:00.5+01:00")), 500000);
  EXPECT_EQ(to_micros(parse_rfc3339("1970-01-01T00:00:00.000001Z")), 1);
  EXPECT_EQ(parse_rfc3339("2016-12-31T23:59:60Z"), parse_rfc3339("2017-01-01T00:00:00Z"));
  for (const char* bad : {"2026-02-31T00:00:00Z", "2026-13-01T00:00:00Z", "2026-01-01T00:00:00",
                          "2026-01-01T00:00:00+24:00", "2026-01-01T00:00:00+01:60",
                          "2026-01-01T00:00:00.Z", "yesterday", "2026-01-01T00:00:00+1:00"}) {
    EXPECT_THROW(parse_rfc3339(bad), std::invalid_argument) << bad;
  }
}

TEST(ParseRfc3339, TimesBeyondWhatAClockHoldsGoToTheNearestEnd) {
  const auto late = parse_rfc3339("9999-12-31T23:59:59Z");
  const auto early = parse_rfc3339("1600-01-01T00:00:00Z");
  EXPECT_GT(late, parse_rfc3339("2261-06-01T00:00:00Z"));
  EXPECT_LT(early, parse_rfc3339("1678-06-01T00:00:00Z"));
  EXPECT_LT(early, late);
}

}  // namespace
}  // namespace outbox::relay
