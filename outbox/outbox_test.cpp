// The Outbox composite on the in-memory outbox (outbox::testing): the acceptance tests of the
// library contract (atomicity, the hot path, the downgrade to the poller, retries up to DEAD) and
// the modes. End to end on a real SQLite file: tests/outbox_sqlite_test.cpp.

#include "outbox/outbox.hpp"

#include <gtest/gtest.h>

#include "outbox/errors.hpp"
#include "outbox/metrics.hpp"
#include "tests/support/memory_fixture.hpp"
#include "tests/support/outbox_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::Gate;
using testing::wait_until;

class OutboxTest : public testing::OutboxFixture<testing::MemoryFixture> {};

// Acceptance 1: a rolled-back transaction leaves no row and delivers nothing.
TEST_F(OutboxTest, AcceptanceAtomicity) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("OrderPlaced"), [&](const auto&) { ++calls; });
  auto ob = Outbox::single_node(options());
  ob.start();
  std::string id;
  {
    auto t = tx->begin();
    id = *ob.writer().write(EventType::of("OrderPlaced"), R"({"id":"o1"})");
    t.rollback();
  }
  ob.poller()->poll();
  ob.close();
  EXPECT_FALSE(row(id));
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(metrics->snapshot().hot_enqueued, 0);
}

// Acceptance 2: commit → the hot path delivers and the row is DONE, without the poller.
TEST_F(OutboxTest, AcceptanceCommitAndFastPath) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("OrderPlaced"), [&](const EventEnvelope& e) {
    EXPECT_EQ(e.payload_json(), R"({"id":"o1"})");
    ++calls;
  });
  auto ob = Outbox::single_node(options());
  ob.start();
  auto id = commit_one(ob, "OrderPlaced", R"({"id":"o1"})");
  ASSERT_TRUE(wait_status(id, EventStatus::Done));
  ob.close();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(metrics->snapshot().hot_enqueued, 1);
  EXPECT_EQ(metrics->snapshot().cold_enqueued, 0);
}

// Acceptance 3: a full hot queue downgrades to the poller; the write still succeeds.
TEST_F(OutboxTest, AcceptanceQueueOverflowDowngrade) {
  Gate gate;
  std::atomic<bool> blocked{false};
  std::atomic<int> delivered{0};
  listeners->register_listener(EventType::of("Block"), [&](const auto&) {
    blocked = true;
    gate.wait();
  });
  listeners->register_listener(EventType::of("E"), [&](const auto&) { ++delivered; });
  auto o = options();
  o.dispatcher.worker_count = 1;
  o.dispatcher.hot_queue_capacity = 1;
  auto ob = Outbox::single_node(o);
  ob.start();
  // The poller's first cycle runs at start; let it pass so only this test's poll() calls poll.
  ASSERT_TRUE(wait_until([&] { return ob.poller()->completed_cycles() >= 1; }));
  auto block = commit_one(ob, "Block");
  ASSERT_TRUE(wait_until([&] { return blocked.load(); }));
  auto queued = commit_one(ob, "E");   // fills the hot queue
  auto dropped = commit_one(ob, "E");  // hot queue full: dropped, stays NEW
  EXPECT_EQ(metrics->snapshot().hot_dropped, 1);
  EXPECT_EQ(status(dropped), EventStatus::New);
  gate.open();
  ASSERT_TRUE(wait_status(queued, EventStatus::Done));
  EXPECT_EQ(status(dropped), EventStatus::New);
  ASSERT_TRUE(wait_until([&] {
    ob.poller()->poll();
    return status(dropped) == EventStatus::Done;
  }));
  ob.close();
  EXPECT_EQ(delivered.load(), 2);
  EXPECT_EQ(status(block), EventStatus::Done);
}

// Acceptance 4: a listener that keeps failing goes RETRY with growing attempts, then DEAD.
TEST_F(OutboxTest, AcceptanceRetryThenDead) {
  // A clock ahead of the rows' creation that only the test moves: a retry is due only when the
  // test says so, so every state can be observed.
  auto clock = std::make_shared<testing::ManualClock>(std::chrono::system_clock::now() + 1min);
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("Bad"), [&](const auto&) {
    ++calls;
    throw std::runtime_error("broker down");
  });
  auto o = options();
  o.dispatcher.max_attempts = 3;
  o.clock = clock;
  auto ob = Outbox::single_node(o);
  ob.start();
  auto id = commit_one(ob, "Bad");
  for (int attempt = 1; attempt <= 2; ++attempt) {
    ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_failure == attempt; }));
    EXPECT_EQ(status(id), EventStatus::Retry);
    EXPECT_EQ(row(id)->attempts, attempt);
    EXPECT_EQ(ob.poller()->poll(), 0);  // not due yet
    clock->advance(1s);
    EXPECT_EQ(ob.poller()->poll(), 1);
  }
  ASSERT_TRUE(wait_status(id, EventStatus::Dead));
  ob.close();
  EXPECT_EQ(row(id)->attempts, 3);
  EXPECT_EQ(row(id)->last_error, "broker down");
  EXPECT_EQ(calls.load(), 3);
}

TEST_F(OutboxTest, DelayedEventSkipsTheHotPathAndIsPolledWhenDue) {
  auto clock = std::make_shared<testing::ManualClock>();
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("Reminder"), [&](const auto&) { ++calls; });
  auto o = options();
  o.clock = clock;
  auto ob = Outbox::single_node(o);
  ob.start();
  std::string id;
  {
    auto t = tx->begin();
    id = *ob.writer().write(EventEnvelope::builder(EventType::of("Reminder"))
                                .occurred_at(clock->now())
                                .deliver_after(30s)
                                .payload_json("{}")
                                .build());
    t.commit();
  }
  EXPECT_EQ(metrics->snapshot().hot_enqueued, 0);
  EXPECT_EQ(ob.poller()->poll(), 0);
  clock->advance(30s);
  EXPECT_EQ(ob.poller()->poll(), 1);
  ASSERT_TRUE(wait_status(id, EventStatus::Done));
  ob.close();
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(OutboxTest, MultiNodeRequiresClaimLockingAndClaimsPolledRows) {
  EXPECT_THROW(Outbox::multi_node(options()), std::invalid_argument);
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("E"), [&](const auto&) { ++calls; });
  // A row written by a writer-only process (no hot path): the multi-node poller must claim it.
  {
    auto w = Outbox::writer_only({.tx_context = tx_context, .store = store});
    EXPECT_EQ(w.dispatcher(), nullptr);
    EXPECT_EQ(w.poller(), nullptr);
    commit_one(w, "E");
  }
  auto o = options();
  o.claim_locking = ClaimLocking{"node-a", std::chrono::milliseconds(60000)};
  auto ob = Outbox::multi_node(o);
  ob.start();
  ASSERT_TRUE(wait_until([&] {
    ob.poller()->poll();
    return count(EventStatus::Done) == 1;
  }));
  ob.close();
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(OutboxTest, CloseDrainsAndLaterWritesStayForTheNextProcess) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("E"), [&](const auto&) { ++calls; });
  auto ob = Outbox::single_node(options());
  ob.start();
  for (int i = 0; i < 50; ++i) {
    commit_one(ob, "E");
  }
  ob.close();
  EXPECT_EQ(calls.load(), 50);
  auto late = commit_one(ob, "E");  // the writer still works; the dispatcher refuses
  EXPECT_EQ(status(late), EventStatus::New);
  EXPECT_EQ(metrics->snapshot().hot_dropped, 1);
  ob.close();
}

}  // namespace
}  // namespace outbox
