#include "outbox/retry_policy.hpp"

#include <gtest/gtest.h>

namespace {

using std::chrono::milliseconds;

TEST(ExponentialBackoffRetryPolicy, DoublesUpToMaxWithoutJitter) {
  outbox::ExponentialBackoffRetryPolicy p(milliseconds(200), milliseconds(60000), false);
  EXPECT_EQ(p.compute_delay(1), milliseconds(200));
  EXPECT_EQ(p.compute_delay(2), milliseconds(400));
  EXPECT_EQ(p.compute_delay(5), milliseconds(3200));
  EXPECT_EQ(p.compute_delay(20), milliseconds(60000));
  EXPECT_EQ(p.compute_delay(1000), milliseconds(60000));
  EXPECT_EQ(p.compute_delay(0), milliseconds(200));
}

TEST(ExponentialBackoffRetryPolicy, JitterStaysInHalfToOneAndAHalf) {
  outbox::ExponentialBackoffRetryPolicy p(milliseconds(1000), milliseconds(60000));
  for (int i = 0; i < 1000; ++i) {
    auto d = p.compute_delay(1);
    EXPECT_GE(d, milliseconds(500));
    EXPECT_LE(d, milliseconds(1500));
  }
}

TEST(ExponentialBackoffRetryPolicy, TheMaximumIsAHardCapWithJitter) {
  // Once max * 1.5: a configured backoff_max of 5 minutes waited up to 7.5.
  outbox::ExponentialBackoffRetryPolicy p(milliseconds(1000), milliseconds(2000));
  for (int attempts = 1; attempts < 40; ++attempts) {
    for (int i = 0; i < 100; ++i) {
      EXPECT_LE(p.compute_delay(attempts), milliseconds(2000)) << attempts;
    }
  }
}

TEST(ExponentialBackoffRetryPolicy, RejectsBadBounds) {
  EXPECT_THROW(outbox::ExponentialBackoffRetryPolicy(milliseconds(0), milliseconds(10)),
               std::invalid_argument);
  EXPECT_THROW(outbox::ExponentialBackoffRetryPolicy(milliseconds(100), milliseconds(10)),
               std::invalid_argument);
}

}  // namespace
