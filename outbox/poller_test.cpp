#include "outbox/poller.hpp"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "outbox/change_watcher.hpp"
#include "outbox/dispatcher.hpp"
#include "outbox/errors.hpp"
#include "outbox/metrics.hpp"
#include "tests/support/failing_store.hpp"
#include "tests/support/memory_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;

// Records what a poll cycle hands over, with a configurable capacity.
class RecordingHandler final : public OutboxPollerHandler {
 public:
  bool handle(const EventEnvelope& e, int attempts) override {
    std::lock_guard lock(mutex);
    ids.push_back(e.event_id());
    last_attempts = attempts;
    return static_cast<int>(ids.size()) < stop_after;
  }
  int available_capacity() const override { return capacity; }
  void begin_cycle(PollCycle&) override { ++cycles; }

  std::mutex mutex;
  std::vector<std::string> ids;
  int last_attempts = -1;
  int capacity = INT_MAX;
  int stop_after = INT_MAX;
  std::atomic<int> cycles{0};
};

// Rows another producer wrote with broken headers JSON (the ids given); with `dead_mark_fails` the
// DEAD mark they get fails too (a full disk).
class BrokenHeaders final : public testing::ForwardingStore {
 public:
  BrokenHeaders(std::shared_ptr<OutboxStore> inner, std::set<std::string> ids,
                bool dead_mark_fails = false)
      : ForwardingStore(std::move(inner)),
        ids_(std::move(ids)),
        dead_mark_fails_(dead_mark_fails) {}
  std::vector<OutboxEvent> poll_pending(sql::Connection& c, Timestamp now,
                                        std::chrono::microseconds skip, int limit,
                                        const PendingKey* after) override {
    auto rows = inner_->poll_pending(c, now, skip, limit, after);
    for (auto& r : rows) {
      if (ids_.contains(r.event_id)) {
        r.headers_json = R"({"k": 42)";
      }
    }
    return rows;
  }
  std::vector<OutboxEvent> claim_pending(sql::Connection& c, std::string_view owner, Timestamp now,
                                         std::chrono::milliseconds lock,
                                         std::chrono::microseconds skip, int limit,
                                         const PendingKey* after) override {
    auto rows = inner_->claim_pending(c, owner, now, lock, skip, limit, after);
    for (auto& r : rows) {
      if (ids_.contains(r.event_id)) {
        r.headers_json = R"({"k": 42)";
      }
    }
    return rows;
  }
  int mark_dead(sql::Connection& c, std::string_view id, Timestamp now, std::string_view e,
                bool count, std::string_view o) override {
    if (dead_mark_fails_) {
      throw StoreError("disk full");
    }
    return inner_->mark_dead(c, id, now, e, count, o);
  }

 private:
  std::set<std::string> ids_;
  bool dead_mark_fails_;
};

class PollerTest : public testing::MemoryFixture {
 protected:
  OutboxPoller::Options options() {
    return {.connection_provider = pool,
            .store = store,
            .handler = handler,
            .batch_size = 50,
            .interval = 10s,
            .metrics = metrics,
            .clock = clock};
  }
  void insert(const std::string& id, Timestamp at, std::string type = "A") {
    store->insert_new(*pool->acquire(), EventEnvelope::builder(EventType::of(type))
                                            .event_id(id)
                                            .occurred_at(at)
                                            .payload_json("{}")
                                            .build());
  }

  std::shared_ptr<testing::ManualClock> clock = std::make_shared<testing::ManualClock>();
  std::shared_ptr<RecordingHandler> handler = std::make_shared<RecordingHandler>();
  std::shared_ptr<InMemoryMetrics> metrics = std::make_shared<InMemoryMetrics>();
};

TEST_F(PollerTest, FullPagesResumeAfterTheLastRowAndShortPagesGoBackToTheHead) {
  for (int i = 0; i < 10; ++i) {
    insert("r" + std::to_string(i), clock->now() - std::chrono::seconds(100 - i));
  }
  auto o = options();
  o.batch_size = 3;
  o.head_rescan_interval = std::chrono::hours(1);
  OutboxPoller poller(o);
  auto cycle = [&] {
    handler->ids.clear();
    poller.poll();
    return handler->ids;
  };
  using Ids = std::vector<std::string>;
  EXPECT_EQ(cycle(), (Ids{"r0", "r1", "r2"}));  // from the head
  EXPECT_EQ(cycle(), (Ids{"r3", "r4", "r5"}));  // resumes: r0–r2 are still pending, not re-read
  insert("late", clock->now() - 200s);          // committed late with an older created_at
  EXPECT_EQ(cycle(), (Ids{"r6", "r7", "r8"}));
  EXPECT_EQ(cycle(), (Ids{"r9"}));                // short page: the end
  EXPECT_EQ(cycle(), (Ids{"late", "r0", "r1"}));  // so the next cycle starts from the head

  auto every = options();
  every.batch_size = 3;
  every.head_rescan_interval = 0ms;
  OutboxPoller from_head(every);
  for (int i = 0; i < 2; ++i) {
    handler->ids.clear();
    from_head.poll();
    EXPECT_EQ(handler->ids, (Ids{"late", "r0", "r1"}));
  }
}

TEST_F(PollerTest, AfterARefusalTheNextPageStartsAtTheRefusedRow) {
  for (int i = 0; i < 6; ++i) {
    insert("r" + std::to_string(i), clock->now() - std::chrono::seconds(100 - i));
  }
  auto o = options();
  o.batch_size = 3;
  o.head_rescan_interval = std::chrono::hours(1);
  OutboxPoller poller(o);
  handler->stop_after = 2;  // takes r0, refuses r1 (queue full)
  poller.poll();
  EXPECT_EQ(handler->ids, (std::vector<std::string>{"r0", "r1"}));
  handler->ids.clear();
  handler->stop_after = INT_MAX;
  poller.poll();
  EXPECT_EQ(handler->ids, (std::vector<std::string>{"r1", "r2", "r3"}));
}

TEST_F(PollerTest, ARefusalInALaterChunkResumesAtTheRefusedRowPastUndecodableOnes) {
  const auto id = [](int i) {
    std::string n = std::to_string(i);
    return "r" + std::string(3 - n.size(), '0') + n;
  };
  for (int i = 0; i < 150; ++i) {
    insert(id(i), clock->now() - std::chrono::seconds(1000 - i));
  }
  auto o = options();
  // Broken headers on a row before the refusal and one after it.
  o.store = std::make_shared<BrokenHeaders>(store, std::set<std::string>{"r070", "r100"});
  o.batch_size = 150;
  o.head_rescan_interval = std::chrono::hours(1);
  OutboxPoller poller(o);
  handler->stop_after = 99;  // r000–r069 and r071–r098 taken, r099 refused (queue full)
  EXPECT_EQ(poller.poll(), 98);
  EXPECT_EQ(handler->ids.back(), "r099");
  EXPECT_EQ(row("r070")->status, EventStatus::Dead);
  EXPECT_EQ(row("r099")->status, EventStatus::New);
  EXPECT_EQ(row("r100")->status, EventStatus::New);  // behind the refusal: not looked at yet
  handler->ids.clear();
  handler->stop_after = INT_MAX;
  poller.poll();
  ASSERT_GE(handler->ids.size(), 2u);
  EXPECT_EQ(handler->ids[0], "r099");
  EXPECT_EQ(handler->ids[1], "r101");
  EXPECT_EQ(row("r100")->status, EventStatus::Dead);
}

TEST_F(PollerTest, AFailingDeadMarkHoldsBackNoOtherRow) {
  for (int i = 0; i < 5; ++i) {
    insert("g" + std::to_string(i), clock->now() - std::chrono::seconds(100 - i));
  }
  insert("bad", clock->now() - 50s);
  insert("after", clock->now() - 40s);
  auto o = options();
  o.store = std::make_shared<BrokenHeaders>(store, std::set<std::string>{"bad"}, true);
  OutboxPoller poller(o);
  // A DEAD mark that keeps failing (a full disk) held back every row behind it, cycle after cycle.
  EXPECT_EQ(poller.poll(), 6);
  EXPECT_EQ(handler->ids, (std::vector<std::string>{"g0", "g1", "g2", "g3", "g4", "after"}));
  EXPECT_EQ(row("bad")->status, EventStatus::New);  // read again next cycle
  EXPECT_EQ(metrics->snapshot().status_update_failure, 1);
}

TEST_F(PollerTest, HandsPendingRowsOverOldestFirstAndRecordsLag) {
  insert("b", clock->now() - 2s);
  insert("a", clock->now() - 3s);
  OutboxPoller p(options());
  EXPECT_EQ(p.poll(), 2);
  EXPECT_EQ(handler->ids, (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(handler->last_attempts, 0);
  EXPECT_EQ(metrics->snapshot().oldest_lag_ms, 3000);
  EXPECT_EQ(handler->cycles.load(), 1);
}

TEST_F(PollerTest, SkipsTheCycleWithoutCapacityAndLimitsToCapacity) {
  for (int i = 0; i < 5; ++i) {
    insert("e" + std::to_string(i), clock->now() - 1s);
  }
  handler->capacity = 0;
  OutboxPoller p(options());
  EXPECT_EQ(p.poll(), 0);
  EXPECT_TRUE(handler->ids.empty());
  handler->capacity = 3;
  EXPECT_EQ(p.poll(), 3);
}

TEST_F(PollerTest, HandlerRefusalStopsTheCycle) {
  for (int i = 0; i < 5; ++i) {
    insert("e" + std::to_string(i), clock->now() - 1s);
  }
  handler->stop_after = 2;
  OutboxPoller p(options());
  EXPECT_EQ(p.poll(), 1);
  EXPECT_EQ(handler->ids.size(), 2u);
}

TEST_F(PollerTest, SkipRecentLeavesYoungRowsToTheHotPath) {
  insert("old", clock->now() - 5s);
  insert("young", clock->now() - 100ms);
  auto o = options();
  o.skip_recent = 1s;
  OutboxPoller p(o);
  EXPECT_EQ(p.poll(), 1);
  EXPECT_EQ(handler->ids, std::vector<std::string>{"old"});
}

TEST_F(PollerTest, UndecodableHeadersGoDeadWithTheError) {
  insert("good", clock->now() - 1s);
  insert("bad", clock->now() - 2s);
  auto o = options();
  o.store = std::make_shared<BrokenHeaders>(store, std::set<std::string>{"bad"});
  OutboxPoller p(o);
  EXPECT_EQ(p.poll(), 1);
  EXPECT_EQ(handler->ids, std::vector<std::string>{"good"});
  auto r = row("bad");
  EXPECT_EQ(r->status, EventStatus::Dead);
  EXPECT_NE(r->last_error->find("decode failure"), std::string::npos) << *r->last_error;
  EXPECT_EQ(metrics->snapshot().dispatch_dead, 1);
}

TEST_F(PollerTest, ClaimLockingTakesEachRowOnceUntilExpiry) {
  for (int i = 0; i < 4; ++i) {
    insert("c" + std::to_string(i), clock->now() - 1s);
  }
  auto o1 = options();
  o1.claim_locking = ClaimLocking{"node-1", std::chrono::milliseconds(60000)};
  auto other = std::make_shared<RecordingHandler>();
  auto o2 = o1;
  o2.claim_locking->owner = "node-2";
  o2.handler = other;
  OutboxPoller p1(o1);
  OutboxPoller p2(o2);
  EXPECT_EQ(p1.poll(), 4);
  EXPECT_EQ(p2.poll(), 0);
  EXPECT_EQ(row("c0")->locked_by, "node-1");
  clock->advance(61s);
  EXPECT_EQ(p2.poll(), 4);  // node-1 never finished: its claims expired
  EXPECT_EQ(row("c3")->locked_by, "node-2");
  EXPECT_EQ(p1.owner(), "node-1");
}

// Counts before_query() calls (where a dispatcher writes its DONE marks on SQLite).
class BeforeQueryHandler final : public OutboxPollerHandler {
 public:
  bool handle(const EventEnvelope&, int) override { return true; }
  void before_query(sql::Connection&) override { ++calls; }
  int calls = 0;
};

// A claim that takes nothing may not take the write lock (SQLite), so the write-lock work waits
// for a claim after one that took rows: a relay draining only message groups leaves its DONE
// marks to the flusher's thread.
TEST_F(PollerTest, WorkBeforeAClaimIsDoneWhileClaimsTakeRows) {
  auto counting = std::make_shared<BeforeQueryHandler>();
  auto o = options();
  o.claim_locking = ClaimLocking{"node-1", std::chrono::milliseconds(60000)};
  o.handler = counting;
  OutboxPoller poller(o);
  EXPECT_EQ(poller.poll(), 0);
  EXPECT_EQ(counting->calls, 1);  // nothing known yet: as before a claim that takes rows
  EXPECT_EQ(poller.poll(), 0);
  EXPECT_EQ(counting->calls, 1);
  insert("r1", clock->now() - 1s);
  EXPECT_EQ(poller.poll(), 1);
  EXPECT_EQ(counting->calls, 1);  // the claim before took nothing
  insert("r2", clock->now() - 1s);
  EXPECT_EQ(poller.poll(), 1);
  EXPECT_EQ(counting->calls, 2);
  EXPECT_EQ(poller.poll(), 0);
  EXPECT_EQ(counting->calls, 3);
  EXPECT_EQ(poller.poll(), 0);
  EXPECT_EQ(counting->calls, 3);
}

// Counts claims; each claim waits while `hold` is set (a slow statement).
class CountingClaims final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::vector<OutboxEvent> claim_pending(sql::Connection& c, std::string_view owner, Timestamp now,
                                         std::chrono::milliseconds lock,
                                         std::chrono::microseconds skip, int limit,
                                         const PendingKey* after) override {
    auto rows = inner_->claim_pending(c, owner, now, lock, skip, limit, after);
    claims.fetch_add(1);
    return rows;
  }
  std::atomic<int> claims{0};
};

// Takes events while it has room (a queue nobody drains) and records each; the first event it
// is given waits until `release` returns true (at most 10 s).
class RoomHandler final : public OutboxPollerHandler {
 public:
  bool handle(const EventEnvelope& e, int) override {
    if (first.exchange(false)) {
      waited_out = !wait_until([&] { return release(); }, hold);
    }
    std::lock_guard lock(mutex);
    if (static_cast<int>(ids.size()) >= room) {
      ++refused;
      return false;
    }
    ids.push_back(e.event_id());
    return true;
  }
  int available_capacity() const override {
    int left;
    {
      std::lock_guard lock(mutex);
      left = room - static_cast<int>(ids.size());
    }
    after_room_read();
    return left;
  }
  void end_cycle(PollCycle&) override { ended.fetch_add(1); }
  std::size_t count() const {
    std::lock_guard lock(mutex);
    return ids.size();
  }

  mutable std::mutex mutex;
  std::vector<std::string> ids;
  int room = INT_MAX;
  int refused = 0;
  std::atomic<bool> first{true};
  std::function<bool()> release = [] { return true; };
  std::chrono::milliseconds hold = 10s;  // the longest the first event waits for `release`
  bool waited_out = false;
  // Called by available_capacity() after it read the room (a hook to interleave the stage).
  std::function<void()> after_room_read = [] {};
  std::atomic<int> ended{0};  // cycles ended (a staged one after its hand-over)
};

TEST_F(PollerTest, ABackgroundClaimOfTheNextPageDoesNotWaitForTheLastPagesHandOver) {
  // With claim locking the rows a cycle claimed are this node's alone, so the next claim needs
  // nothing from their hand-over: the poller's thread runs it while another hands the page
  // over (on SQLite that thread then holds the write lock and little else).
  for (int i = 0; i < 200; ++i) {
    insert("s" + std::to_string(1000 + i), clock->now() - 1s);
  }
  auto counting = std::make_shared<CountingClaims>(store);
  auto slow = std::make_shared<RoomHandler>();
  slow->release = [&] { return counting->claims.load() >= 2; };
  auto o = options();
  o.store = counting;
  o.handler = slow;
  o.claim_locking = ClaimLocking{"staged", 1h};
  OutboxPoller p(o);
  p.start();
  ASSERT_TRUE(wait_until([&] { return slow->count() == 200; }));
  p.close();
  EXPECT_FALSE(slow->waited_out);  // the second claim ran while the first page was held up
  auto ids = slow->ids;
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::unique(ids.begin(), ids.end()), ids.end());  // each row handed over once
  EXPECT_EQ(ids.front(), "s1000");
  EXPECT_EQ(ids.back(), "s1199");
}

TEST_F(PollerTest, ABackgroundClaimLeavesRoomForThePageStillBeingHandedOver) {
  for (int i = 0; i < 300; ++i) {
    insert("q" + std::to_string(1000 + i), clock->now() - 1s);
  }
  auto counting = std::make_shared<CountingClaims>(store);
  auto slow = std::make_shared<RoomHandler>();
  slow->room = 120;
  // The first page waits until the poller has come back for more (or 10 s passed): the next
  // claim must count the 50 rows not yet handed over against the room.
  slow->release = [&] { return counting->claims.load() >= 2; };
  auto o = options();
  o.store = counting;
  o.handler = slow;
  o.interval = 5ms;
  o.claim_locking = ClaimLocking{"room", 1h};
  OutboxPoller p(o);
  p.start();
  ASSERT_TRUE(wait_until([&] { return slow->count() == 120; }));
  ASSERT_TRUE(wait_until([&] { return p.completed_cycles() >= 6; }));
  p.close();
  EXPECT_EQ(slow->refused, 0);  // never claimed more than there was room for
  EXPECT_EQ(slow->count(), 120u);
  for (int i = 120; i < 300; ++i) {
    EXPECT_FALSE(row("q" + std::to_string(1000 + i))->locked_by.has_value()) << i;
  }
}

// From the hostile round on the staged hand-over: the stage moving its page into the queue
// between the next cycle's two reads (the room, the rows still staged) made them count nowhere,
// and the claim took rows the queue then refused (they waited for the own-claim grace).
TEST_F(PollerTest, ABackgroundClaimNeverCountsAStagedPageAsRoom) {
  for (int i = 0; i < 300; ++i) {
    insert("r" + std::to_string(1000 + i), clock->now() - 1s);
  }
  auto counting = std::make_shared<CountingClaims>(store);
  auto slow = std::make_shared<RoomHandler>();
  slow->room = 60;
  std::atomic<bool> released{false};
  slow->release = [&] { return released.load(); };
  // The first page waits in the stage until the next cycle has read the room; then it goes over
  // and ends before that cycle reads what is still staged.
  slow->after_room_read = [&] {
    if (counting->claims.load() >= 1 && !released.exchange(true)) {
      wait_until([&] { return slow->ended.load() >= 1; });
    }
  };
  auto o = options();
  o.store = counting;
  o.handler = slow;
  o.interval = 5ms;
  o.claim_locking = ClaimLocking{"race", 1h};
  OutboxPoller p(o);
  p.start();
  ASSERT_TRUE(wait_until([&] { return slow->count() == 60; }));
  ASSERT_TRUE(wait_until([&] { return p.completed_cycles() >= 6; }));
  p.close();
  EXPECT_EQ(slow->refused, 0);
  for (int i = 60; i < 300; ++i) {
    EXPECT_FALSE(row("r" + std::to_string(1000 + i))->locked_by.has_value()) << i;
  }
}

TEST_F(PollerTest, AFailingDeadMarkInAStagedPageHoldsBackNoOtherRow) {
  for (int i = 0; i < 10; ++i) {
    insert("d" + std::to_string(i), clock->now() - 1s);
  }
  auto o = options();
  o.store = std::make_shared<BrokenHeaders>(store, std::set<std::string>{"d3"}, true);
  auto all = std::make_shared<RoomHandler>();
  o.handler = all;
  o.claim_locking = ClaimLocking{"settles", 1h};
  OutboxPoller p(o);
  p.start();
  // The rows after d3 waited for the own-claim grace, or for ever while its DEAD mark failed.
  ASSERT_TRUE(wait_until([&] { return all->count() == 9; }));
  p.close();
  EXPECT_EQ(row("d3")->status, EventStatus::New);  // claimed, looked at again after the grace
  EXPECT_GE(metrics->snapshot().status_update_failure, 1);
}

// A poll() beside the background loop hands its rows over after the page the stage still holds
// (it handed them over at once, before the rows claimed earlier).
TEST_F(PollerTest, APollCallHandsItsRowsOverAfterTheStagedPage) {
  insert("p1", clock->now() - 2s);
  auto slow = std::make_shared<RoomHandler>();
  std::atomic<bool> entered{false};
  // p1 waits in the stage until p2 was handed over (it never is with the page order kept), 1 s
  // at most.
  slow->release = [&] {
    entered = true;
    std::lock_guard lock(slow->mutex);
    return std::find(slow->ids.begin(), slow->ids.end(), "p2") != slow->ids.end();
  };
  slow->hold = 1s;
  auto o = options();
  o.handler = slow;
  o.claim_locking = ClaimLocking{"order", 1h};
  OutboxPoller p(o);
  p.start();
  ASSERT_TRUE(wait_until([&] { return entered.load(); }));
  insert("p2", clock->now() - 1s);
  EXPECT_EQ(p.poll(), 1);
  p.close();
  EXPECT_EQ(slow->ids, (std::vector<std::string>{"p1", "p2"}));
}

TEST_F(PollerTest, ARowAStagedHandOverCannotDecodeGoesDeadAndTheRestOfThePageGoesOver) {
  for (int i = 0; i < 10; ++i) {
    insert("d" + std::to_string(i), clock->now() - 1s);
  }
  auto o = options();
  o.store = std::make_shared<BrokenHeaders>(store, std::set<std::string>{"d3", "d7"});
  auto all = std::make_shared<RoomHandler>();
  o.handler = all;
  o.claim_locking = ClaimLocking{"settles", 1h};
  OutboxPoller p(o);
  p.start();
  ASSERT_TRUE(wait_until([&] {
    return all->count() == 8 && row("d3")->status == EventStatus::Dead &&
           row("d7")->status == EventStatus::Dead;
  }));
  p.close();
  EXPECT_NE(row("d7")->last_error->find("decode failure"), std::string::npos);
  EXPECT_EQ(metrics->snapshot().dispatch_dead, 2);
}

TEST_F(PollerTest, GeneratesAnOwnerWhenNoneIsGiven) {
  auto o = options();
  o.claim_locking = ClaimLocking{};
  OutboxPoller p(o);
  EXPECT_EQ(p.owner().rfind("poller-", 0), 0u);
}

TEST_F(PollerTest, BackgroundLoopPollsAndStartAfterCloseThrows) {
  insert("bg", clock->now() - 1s);
  auto o = options();
  o.interval = 5ms;
  OutboxPoller p(o);
  p.start();
  p.start();  // idempotent while running
  ASSERT_TRUE(wait_until([&] { return p.completed_cycles() >= 3; }));
  EXPECT_GE(handler->cycles.load(), 3);  // each completed cycle began with begin_cycle()
  p.close();
  p.close();
  EXPECT_THROW(p.start(), std::logic_error);
}

TEST_F(PollerTest, PollAfterCloseHandsNothingOver) {
  insert("late", clock->now() - 1s);
  OutboxPoller p(options());
  p.close();
  EXPECT_EQ(p.poll(), 0);  // the handler (a closed dispatcher) may already be gone
  std::lock_guard lock(handler->mutex);
  EXPECT_TRUE(handler->ids.empty());
  EXPECT_EQ(handler->cycles.load(), 0);
}

TEST_F(PollerTest, DatabaseErrorsAreLoggedNotThrownAndBackOff) {
  auto o = options();
  o.interval = 1s;
  // Every read fails, as on a table that is gone.
  class Unreachable final : public testing::ForwardingStore {
   public:
    using ForwardingStore::ForwardingStore;
    std::vector<OutboxEvent> poll_pending(sql::Connection&, Timestamp, std::chrono::microseconds,
                                          int, const PendingKey*) override {
      throw StoreError("no such table: missing");
    }
  };
  o.store = std::make_shared<Unreachable>(store);
  OutboxPoller p(o);
  EXPECT_EQ(p.next_wait(), 1s);
  EXPECT_EQ(p.poll(), 0);
  EXPECT_EQ(p.next_wait(), 2s);
  p.poll();
  EXPECT_EQ(p.next_wait(), 4s);
  for (int i = 0; i < 5; ++i) {
    p.poll();
  }
  EXPECT_EQ(p.next_wait(), 16s);
  auto slow = options();
  slow.interval = 10s;
  slow.store = o.store;
  OutboxPoller q(slow);
  for (int i = 0; i < 4; ++i) {
    q.poll();
  }
  EXPECT_EQ(q.next_wait(), 30s);  // capped
  OutboxPoller healthy(options());
  healthy.poll();
  EXPECT_EQ(healthy.next_wait(), 10s);
}

TEST_F(PollerTest, AdaptiveWaitsStartAtTheFloorAfterWorkAndDoubleBackToTheInterval) {
  auto o = options();
  o.interval = 500ms;
  o.adaptive_floor = 10ms;
  o.claim_locking = ClaimLocking{"adaptive", 1h};  // each row is handed over once
  OutboxPoller p(o);
  EXPECT_EQ(p.poll(), 0);
  EXPECT_EQ(p.next_wait(), 500ms);  // idle since it started: the interval
  insert("a", clock->now() - 1s);
  EXPECT_EQ(p.poll(), 1);
  EXPECT_EQ(p.next_wait(), 10ms);
  for (auto expected : {20ms, 40ms, 80ms, 160ms, 320ms, 500ms, 500ms}) {
    EXPECT_EQ(p.poll(), 0);
    EXPECT_EQ(p.next_wait(), expected);
  }
  insert("b", clock->now() - 1s);
  EXPECT_EQ(p.poll(), 1);
  EXPECT_EQ(p.next_wait(), 10ms);  // work again: back to the floor
}

TEST_F(PollerTest, AFullQueueIsLookedAtAgainWithinATenthOfTheIntervalAndAtMost100Ms) {
  handler->capacity = 0;
  auto o = options();
  o.interval = 500ms;
  OutboxPoller short_interval(o);
  short_interval.poll();
  EXPECT_EQ(short_interval.next_wait(), 50ms);
  o.interval = 1h;  // with wake-ups: nothing else would look again when room frees up
  OutboxPoller long_interval(o);
  long_interval.poll();
  EXPECT_EQ(long_interval.next_wait(), 100ms);
}

// Hints by hand, as a LISTEN connection or a data_version reader gives them.
class ManualWatcher final : public ChangeWatcher {
 public:
  void start(std::function<void(Signal)> s) override {
    std::lock_guard lock(mutex);
    signal = std::move(s);
  }
  void close() override { closed = true; }
  void send(Signal s) {
    std::lock_guard lock(mutex);
    signal(s);
  }
  bool started() {
    std::lock_guard lock(mutex);
    return static_cast<bool>(signal);
  }
  std::mutex mutex;
  std::function<void(Signal)> signal;
  std::atomic<bool> closed{false};
};

TEST_F(PollerTest, AChangeHintStartsACycleAtOnceAndTheWatcherStopsWithThePoller) {
  auto watcher = std::make_shared<ManualWatcher>();
  auto o = options();
  o.interval = 1h;  // only hints can start a second cycle
  o.change_watcher = watcher;
  o.claim_locking = ClaimLocking{"hinted", 1h};
  OutboxPoller p(o);
  p.start();
  ASSERT_TRUE(wait_until([&] { return watcher->started() && p.completed_cycles() >= 1; }));
  watcher->send(ChangeWatcher::Signal::Connected);  // the first: a poll, not a reconnect
  ASSERT_TRUE(wait_until([&] { return p.completed_cycles() >= 2; }));
  insert("hinted", clock->now() - 1s);
  watcher->send(ChangeWatcher::Signal::Changed);
  ASSERT_TRUE(wait_until([&] {
    std::lock_guard lock(handler->mutex);
    return handler->ids == std::vector<std::string>{"hinted"};
  }));
  EXPECT_EQ(metrics->snapshot().wakeups, 1);
  EXPECT_EQ(metrics->snapshot().wakeups_empty, 0);
  const auto cycles = p.completed_cycles();
  watcher->send(ChangeWatcher::Signal::Changed);  // nothing new: an empty wake-up
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().wakeups_empty == 1; }));
  EXPECT_GT(p.completed_cycles(), cycles);
  watcher->send(ChangeWatcher::Signal::Connected);  // again: the connection was lost meanwhile
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().wakeup_reconnects == 1; }));
  p.close();
  EXPECT_TRUE(watcher->closed.load());
}

TEST_F(PollerTest, OptionsAreValidated) {
  auto bad = [&](auto mutate) {
    auto o = options();
    mutate(o);
    EXPECT_THROW(OutboxPoller{o}, std::invalid_argument);
  };
  bad([](auto& o) { o.connection_provider = nullptr; });
  bad([](auto& o) { o.store = nullptr; });
  bad([](auto& o) { o.handler = nullptr; });
  bad([](auto& o) { o.batch_size = 0; });
  bad([](auto& o) { o.interval = 0ms; });
  bad([](auto& o) { o.skip_recent = -1us; });
  bad([](auto& o) { o.claim_locking = ClaimLocking{"x", 0ms}; });
  // Durations that would wrap the clock (a lock expiry that wraps lets two nodes share rows).
  bad([](auto& o) { o.claim_locking = ClaimLocking{"x", kMaxDuration + 1ms}; });
  bad([](auto& o) { o.interval = std::chrono::hours(24 * 999999); });
  bad([](auto& o) { o.claim_locking = ClaimLocking{std::string(129, 'o'), 1s}; });
  bad([](auto& o) { o.adaptive_floor = -1ms; });
  bad([](auto& o) { o.adaptive_floor = o.interval + 1ms; });
}

}  // namespace
}  // namespace outbox
