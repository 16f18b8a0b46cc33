#include "outbox/internal/outcome_policy.hpp"

#include <gtest/gtest.h>

#include "outbox/errors.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/store.hpp"

namespace outbox::internal {
namespace {

using namespace std::chrono_literals;
using Outcome = StatusChange::Outcome;

class FixedPolicy final : public RetryPolicy {
 public:
  std::chrono::milliseconds compute_delay(int attempts) const override {
    return std::chrono::milliseconds(attempts * 100);
  }
};

TEST(OutcomePolicy, EachResultLeadsToItsStatus) {
  const FixedPolicy policy;
  EXPECT_EQ(decide_status(DeliveryResult::delivered(), 0, 3, policy).outcome, Outcome::Done);

  const auto failed = decide_status(DeliveryResult::failed("boom"), 0, 3, policy);
  EXPECT_EQ(failed.outcome, Outcome::Retry);
  EXPECT_EQ(failed.delay, 100ms);  // the policy's delay for the first attempt
  EXPECT_EQ(failed.message, "boom");
  EXPECT_TRUE(failed.count_attempt);
  EXPECT_EQ(decide_status(DeliveryResult::failed("boom"), 2, 3, policy).outcome, Outcome::Dead);

  const auto permanent = decide_status(DeliveryResult::permanent("no"), 0, 3, policy);
  EXPECT_EQ(permanent.outcome, Outcome::Dead);
  EXPECT_TRUE(permanent.count_attempt);

  const DeliveryResult unroutable{.kind = DeliveryResult::Kind::Unroutable, .message = "x"};
  const auto dead = decide_status(unroutable, 0, 3, policy);
  EXPECT_EQ(dead.outcome, Outcome::Dead);
  EXPECT_FALSE(dead.count_attempt);
}

TEST(OutcomePolicy, RetryLaterDefersUncountedOrCountsWhenAsked) {
  const FixedPolicy policy;
  const auto deferred = decide_status(DeliveryResult::retry_later(5s, "busy"), 9, 3, policy);
  EXPECT_EQ(deferred.outcome, Outcome::Deferred);  // never DEAD, whatever the attempts
  EXPECT_EQ(deferred.delay, 5s);

  const auto counted = decide_status(DeliveryResult::retry_later(5s, "busy", true), 0, 3, policy);
  EXPECT_EQ(counted.outcome, Outcome::Retry);
  EXPECT_EQ(counted.delay, 5s);
  EXPECT_EQ(decide_status(DeliveryResult::retry_later(5s, "busy", true), 2, 3, policy).outcome,
            Outcome::Dead);
}

TEST(OutcomePolicy, RetryLaterWithoutAWaitIsACountedAttemptWithTheBackoff) {
  const FixedPolicy policy;
  // "Retry-After: 0" must not make a tight loop: the attempt counts and the policy's delay holds.
  const auto zero = decide_status(DeliveryResult::retry_later(0ms, "now"), 1, 3, policy);
  EXPECT_EQ(zero.outcome, Outcome::Retry);
  EXPECT_EQ(zero.delay, 200ms);
  EXPECT_EQ(decide_status(DeliveryResult::retry_later(-5s, "past"), 2, 3, policy).outcome,
            Outcome::Dead);
}

TEST(OutcomePolicy, DelaysAreClampedToTheLongestStored) {
  const FixedPolicy policy;
  const auto far =
      decide_status(DeliveryResult::retry_later(std::chrono::hours(24 * 365), "x"), 0, 3, policy);
  EXPECT_EQ(far.delay, kMaxRetryDelay);
}

TEST(DeliveryResult, ExceptionsMapToResultsAndAreKept) {
  auto from = [](auto e) { return DeliveryResult::from_exception(std::make_exception_ptr(e)); };
  EXPECT_EQ(from(PermanentFailure("p")).kind, DeliveryResult::Kind::Permanent);
  EXPECT_EQ(from(UnroutableEventError("u")).kind, DeliveryResult::Kind::Unroutable);
  const auto later = from(RetryLater(3s, "later", true));
  EXPECT_EQ(later.kind, DeliveryResult::Kind::RetryLater);
  EXPECT_EQ(later.delay, 3s);
  EXPECT_TRUE(later.count_attempt);
  const auto plain = from(std::runtime_error("plain"));
  EXPECT_EQ(plain.kind, DeliveryResult::Kind::Failed);
  EXPECT_EQ(plain.message, "plain");
  EXPECT_TRUE(plain.exception != nullptr);
  EXPECT_EQ(DeliveryResult::from_exception(std::make_exception_ptr(42)).message,
            "non-standard exception");
}

}  // namespace
}  // namespace outbox::internal
