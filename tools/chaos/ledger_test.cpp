// The chaos ledger's verdicts on hand-made runs: each kind of failure is named and counted.

#include "ledger.hpp"

#include <gtest/gtest.h>

namespace outbox::chaos {
namespace {

LedgerInput three_committed(bool ordered) {
  LedgerInput in;
  in.ordered = ordered;
  in.committed = {{"a1", "a", 1}, {"a2", "a", 2}, {"b1", "b", 1}};
  for (const auto& c : in.committed) {
    in.rows[c.event_id] = RowState::Done;
  }
  return in;
}

TEST(ChaosLedger, ACleanRunIsClean) {
  auto in = three_committed(true);
  in.receipts = {{"a1", "a", 1}, {"b1", "b", 1}, {"a2", "a", 2}};
  const auto r = check(in);
  EXPECT_TRUE(r.clean());
  EXPECT_EQ(r.committed, 3u);
  EXPECT_EQ(r.delivered, 3u);
  EXPECT_EQ(r.duplicates, 0u);
  EXPECT_TRUE(r.problems.empty());
}

TEST(ChaosLedger, ARepeatIsADuplicateAndALateOneIsReported) {
  auto in = three_committed(true);
  // a1 again right away (a re-send after a failure), then once more after a2 (late).
  in.receipts = {{"a1", "a", 1, "relay-0"},
                 {"a1", "a", 1, "relay-0"},
                 {"a2", "a", 2, "relay-1"},
                 {"a1", "a", 1, "relay-0"},
                 {"b1", "b", 1, "relay-1"}};
  const auto r = check(in);
  EXPECT_TRUE(r.clean());
  EXPECT_EQ(r.duplicates, 2u);
  EXPECT_EQ(r.late_duplicates, 1u);
  EXPECT_EQ(r.order_violations, 0u);
  ASSERT_EQ(r.notes.size(), 1u);
  EXPECT_EQ(r.notes[0], "late duplicate: a #1 again after #2, from relay-0");
}

TEST(ChaosLedger, AnEventBeforeItsPredecessorIsAnOrderViolation) {
  auto in = three_committed(true);
  in.receipts = {{"a2", "a", 2}, {"a1", "a", 1}, {"b1", "b", 1}};
  const auto r = check(in);
  EXPECT_FALSE(r.clean());
  EXPECT_EQ(r.order_violations, 1u);
  ASSERT_FALSE(r.problems.empty());
  EXPECT_NE(r.problems[0].find("a #2 arrived before #1"), std::string::npos) << r.problems[0];
  // Without an order to keep, the same arrivals are fine.
  in.ordered = false;
  EXPECT_TRUE(check(in).clean());
}

TEST(ChaosLedger, AnEventAfterADeadPredecessorIsTheDeadEventNotAnOrderViolation) {
  auto in = three_committed(true);
  in.rows["a1"] = RowState::Dead;
  in.receipts = {{"a2", "a", 2}, {"b1", "b", 1}};
  auto r = check(in);
  EXPECT_EQ(r.order_violations, 0u);
  EXPECT_EQ(r.dead, 1u);
  EXPECT_FALSE(r.clean());
  // DEAD but delivered after its successor all the same: the consumer saw them out of order.
  in.receipts = {{"a2", "a", 2}, {"a1", "a", 1}, {"b1", "b", 1}};
  r = check(in);
  EXPECT_EQ(r.order_violations, 1u);
  // Still pending and never delivered: overtaken, whatever else happens to it.
  in.rows["a1"] = RowState::Pending;
  in.receipts = {{"a2", "a", 2}, {"b1", "b", 1}};
  r = check(in);
  EXPECT_EQ(r.order_violations, 1u);
  EXPECT_EQ(r.stuck, 1u);
}

TEST(ChaosLedger, PastADeadEventTheEventsBeforeItMustStillHaveArrivedFirst) {
  LedgerInput in;
  in.ordered = true;
  in.committed = {{"a1", "a", 1}, {"a2", "a", 2}, {"a3", "a", 3}, {"a4", "a", 4}};
  for (const auto& c : in.committed) {
    in.rows[c.event_id] = RowState::Done;
  }
  in.rows["a2"] = RowState::Dead;
  in.rows["a3"] = RowState::Dead;
  // #1, then #4 past two DEAD events: in order.
  in.receipts = {{"a1", "a", 1}, {"a4", "a", 4}};
  EXPECT_EQ(check(in).order_violations, 0u);
  // #4 before #1: out of order, though its own predecessors are DEAD.
  in.receipts = {{"a4", "a", 4}, {"a1", "a", 1}};
  const auto before = check(in);
  EXPECT_EQ(before.order_violations, 1u);
  ASSERT_FALSE(before.problems.empty());
  EXPECT_NE(before.problems[0].find("a #4 arrived before #1"), std::string::npos)
      << before.problems[0];
  // #1 never arrived and is still pending: #4 overtook it.
  in.rows["a1"] = RowState::Pending;
  in.receipts = {{"a4", "a", 4}};
  const auto r = check(in);
  EXPECT_EQ(r.order_violations, 1u);
  EXPECT_EQ(r.stuck, 1u);
  // Everything before #4 DEAD and never delivered: nothing was overtaken.
  in.rows["a1"] = RowState::Dead;
  EXPECT_EQ(check(in).order_violations, 0u);
}

TEST(ChaosLedger, UndeliveredEventsAreLostStuckOrDeadByTheirRow) {
  auto in = three_committed(false);
  in.committed.push_back({"c1", "c", 1});  // its row is gone
  in.rows["a2"] = RowState::Pending;
  in.rows["b1"] = RowState::Dead;
  in.receipts = {};
  const auto r = check(in);
  EXPECT_EQ(r.lost, 2u);  // a1 (DONE, never received) and c1 (no row)
  EXPECT_EQ(r.stuck, 1u);
  EXPECT_EQ(r.dead, 1u);
  EXPECT_EQ(r.delivered, 0u);
  EXPECT_FALSE(r.clean());
}

TEST(ChaosLedger, ADeliveryNobodyCommittedIsCaughtAndNamed) {
  auto in = three_committed(false);
  in.rolled_back = {"x1"};
  in.receipts = {{"a1", "a", 1}, {"a2", "a", 2}, {"b1", "b", 1}, {"x1", "x", 1}, {"y1", "y", 1}};
  const auto r = check(in);
  EXPECT_EQ(r.uncommitted_delivered, 2u);
  EXPECT_FALSE(r.clean());
  ASSERT_EQ(r.problems.size(), 2u);
  EXPECT_NE(r.problems[0].find("rolled back by its writer"), std::string::npos);
  EXPECT_NE(r.problems[1].find("never committed"), std::string::npos);
}

TEST(ChaosLedger, ADeliveryTheOutboxDidNotRecordIsUnacknowledged) {
  auto in = three_committed(false);
  in.rows["a2"] = RowState::Pending;  // delivered, but its row would be sent again
  in.receipts = {{"a1", "a", 1}, {"a2", "a", 2}, {"b1", "b", 1}};
  auto r = check(in);
  EXPECT_EQ(r.unacknowledged, 1u);
  EXPECT_FALSE(r.clean());
  // Subscriptions leave rows NEW: what counts is what the cursor has not passed.
  in.rows_acknowledge = false;
  EXPECT_TRUE(check(in).clean());
  in.unread = 2;
  r = check(in);
  EXPECT_EQ(r.unacknowledged, 2u);
  EXPECT_FALSE(r.clean());
}

TEST(ChaosLedger, TheCommittedRowDecidesKeyAndOrderAndTheDeliveryIsComparedWithIt) {
  auto in = three_committed(true);
  // Bodies #1, #2 on a2 and a1: the ids arrived in the wrong order whatever the bodies say.
  in.receipts = {{"a2", "a", 1}, {"a1", "a", 2}, {"b1", "b", 1}};
  const auto r = check(in);
  EXPECT_EQ(r.order_violations, 1u);
  EXPECT_EQ(r.mismatched, 2u);
  EXPECT_FALSE(r.clean());
}

TEST(ChaosLedger, ASequenceCommittedTwiceIsReported) {
  auto in = three_committed(true);
  in.committed.push_back({"a2bis", "a", 2});
  in.rows["a2bis"] = RowState::Done;
  in.receipts = {{"a1", "a", 1}, {"a2", "a", 2}, {"a2bis", "a", 2}, {"b1", "b", 1}};
  const auto r = check(in);
  EXPECT_EQ(r.mismatched, 1u);
  EXPECT_FALSE(r.clean());
}

TEST(ChaosLedger, ARunThatCommittedNothingIsNotClean) {
  LedgerInput in;
  EXPECT_FALSE(check(in).clean());
}

TEST(ChaosLedger, ProblemsAreCappedPerKind) {
  LedgerInput in;
  for (int i = 0; i < 20; ++i) {
    in.committed.push_back({"e" + std::to_string(i), "k", i + 1});
  }
  const auto r = check(in);
  EXPECT_EQ(r.lost, 20u);
  EXPECT_EQ(r.problems.size(), 5u);
}

}  // namespace
}  // namespace outbox::chaos
