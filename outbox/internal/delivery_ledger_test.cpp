#include "outbox/internal/delivery_ledger.hpp"

#include <gtest/gtest.h>

#include "outbox/in_flight_tracker.hpp"

namespace outbox::internal {
namespace {

using Check = DeliveryLedger::ColdCheck;

TEST(DeliveryLedger, AnEventIsHeldOnceUntilFinished) {
  DefaultInFlightTracker tracker;
  DeliveryLedger ledger(tracker, false);
  EXPECT_TRUE(ledger.reserve("e1", std::chrono::steady_clock::now()));
  EXPECT_FALSE(ledger.acquire("e1"));           // the poller cannot queue a reserved event
  EXPECT_FALSE(ledger.take_reservation("e1"));  // no claim time kept without claims
  ledger.running("e1");
  EXPECT_EQ(ledger.running_ids().count("e1"), 1u);
  ledger.finish("e1");
  EXPECT_TRUE(ledger.running_ids().empty());
  EXPECT_TRUE(ledger.acquire("e1"));
}

TEST(DeliveryLedger, ReservationsKeepTheirClaimTimeWithClaims) {
  DefaultInFlightTracker tracker;
  DeliveryLedger ledger(tracker, true);
  const auto at = std::chrono::steady_clock::now();
  ASSERT_TRUE(ledger.reserve("e1", at));
  EXPECT_EQ(ledger.take_reservation("e1"), at);
  EXPECT_FALSE(ledger.take_reservation("e1"));  // consumed
  ASSERT_TRUE(ledger.reserve("e2", at));
  ledger.release_reservation("e2");
  EXPECT_TRUE(ledger.acquire("e2"));
}

TEST(DeliveryLedger, CompletionsDuringAScanAreStaleForItOnly) {
  DefaultInFlightTracker tracker;
  DeliveryLedger ledger(tracker, false);
  ASSERT_TRUE(ledger.acquire("e1"));
  const auto scan = ledger.begin_scan();  // its query may read e1 while still pending
  ledger.finish("e1");
  EXPECT_EQ(ledger.check_cold("e1", scan), Check::CompletedDuringScan);
  EXPECT_EQ(ledger.check_cold("e2", scan), Check::Ok);
  ledger.end_scan(scan);
  EXPECT_EQ(ledger.check_cold("e1", ledger.begin_scan()), Check::Ok);  // a new read is fresh
}

TEST(DeliveryLedger, InvalidatedScansAreRefused) {
  DefaultInFlightTracker tracker;
  DeliveryLedger ledger(tracker, false);
  ASSERT_TRUE(ledger.acquire("head"));
  const auto before = ledger.begin_scan();
  ledger.finish("head");
  ledger.invalidate_scans();
  EXPECT_EQ(ledger.check_cold("later", before), Check::ScanInvalidated);
  EXPECT_EQ(ledger.check_cold("later", ledger.begin_scan()), Check::Ok);
}

}  // namespace
}  // namespace outbox::internal
