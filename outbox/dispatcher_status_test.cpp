// The dispatcher's outcomes: retries, deferrals, DEAD, and status writes that fail.
#include "outbox/dispatcher.hpp"
#include "outbox/dispatcher_writer_hook.hpp"

#include <gtest/gtest.h>

#include <array>
#include <map>
#include <mutex>

#include "outbox/errors.hpp"
#include "outbox/in_flight_tracker.hpp"
#include "outbox/interceptor.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/metrics.hpp"
#include "outbox/poller.hpp"
#include "outbox/retry_policy.hpp"
#include "tests/support/dispatcher_fixture.hpp"
#include "tests/support/failing_store.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::BatchRegistry;
using testing::DispatcherTest;
using testing::Gate;
using testing::wait_until;

// A poller with claim locking that runs only when polled: each poll() writes the DONE marks
// waiting for the flusher before its claim.
OutboxPoller::Options polled_by_hand(std::shared_ptr<sql::ConnectionProvider> pool,
                                     std::shared_ptr<OutboxStore> store, OutboxDispatcher& d) {
  return {.connection_provider = std::move(pool),
          .store = std::move(store),
          .handler = std::make_shared<DispatcherPollerHandler>(d),
          .interval = std::chrono::hours(1),
          .claim_locking = ClaimLocking{"marks", std::chrono::hours(1)}};
}

TEST_F(DispatcherTest, UnroutableGoesDeadOnceWithoutCountingAnAttempt) {
  OutboxDispatcher d(options());
  d.start();
  d.enqueue_hot(queued(committed("Nobody", "u1")));
  ASSERT_TRUE(wait_status("u1", EventStatus::Dead));
  auto r = row("u1");
  EXPECT_EQ(r->attempts, 0);
  EXPECT_NE(r->last_error->find("no listener"), std::string::npos);
  d.close();
  EXPECT_EQ(metrics->snapshot().dispatch_dead, 1);
  EXPECT_EQ(metrics->snapshot().dispatch_failure, 0);
}

TEST_F(DispatcherTest, PermanentFailureGoesDeadAtOnceWithItsReason) {
  listeners->register_listener(EventType::of("P"), [](const EventEnvelope&) {
    throw PermanentFailure("HTTP 400: bad amount");
  });
  OutboxDispatcher d(options());
  d.start();
  d.enqueue_hot(queued(committed("P", "p1")));  // attempts 0 of max 3: no retry even so
  ASSERT_TRUE(wait_status("p1", EventStatus::Dead));
  auto r = row("p1");
  EXPECT_EQ(r->attempts, 1);
  EXPECT_EQ(r->last_error, "HTTP 400: bad amount");
  d.close();
  EXPECT_EQ(metrics->snapshot().dispatch_dead, 1);
}

TEST_F(DispatcherTest, FailureRetriesWithBackoffThenDeadAtMaxAttempts) {
  listeners->register_listener(
      EventType::of("F"), [](const EventEnvelope&) { throw std::runtime_error("downstream"); });
  OutboxDispatcher d(options());
  d.start();
  const auto before = std::chrono::system_clock::now();
  auto e = committed("F", "f1");
  d.enqueue_hot(queued(e));
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_failure == 1; }));
  auto r = row("f1");
  EXPECT_EQ(r->attempts, 1);
  EXPECT_EQ(r->last_error, "downstream");
  EXPECT_GE(r->available_at, before + 1000ms);
  // Second failure (attempts 1 → 2) retries; third reaches max_attempts = 3 and goes DEAD.
  d.enqueue_cold(queued(e, 1));
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_failure == 2; }));
  EXPECT_EQ(row("f1")->attempts, 2);
  EXPECT_EQ(status("f1"), EventStatus::Retry);
  d.enqueue_cold(queued(e, 2));
  ASSERT_TRUE(wait_status("f1", EventStatus::Dead));
  EXPECT_EQ(row("f1")->attempts, 3);
  d.close();
  EXPECT_EQ(metrics->snapshot().dispatch_failure, 2);
  EXPECT_EQ(metrics->snapshot().dispatch_dead, 1);
}

TEST_F(DispatcherTest, RetryLaterDefersWithoutCountingOrCountsWhenAsked) {
  listeners->register_listener(EventType::of("Later"), [](const EventEnvelope&) {
    throw RetryLater(std::chrono::minutes(2), "rate limited");
  });
  listeners->register_listener(EventType::of("Counted"), [](const EventEnvelope&) {
    throw RetryLater(std::chrono::minutes(3), "busy", true);
  });
  OutboxDispatcher d(options());
  d.start();
  const auto before = std::chrono::system_clock::now();
  auto later = committed("Later", "l1");
  d.enqueue_hot(queued(later, 2));  // even at attempts = max - 1 a deferral never goes DEAD
  auto counted = committed("Counted", "c1");
  d.enqueue_hot(queued(counted));
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_failure == 2; }));
  EXPECT_EQ(status("l1"), EventStatus::Retry);
  EXPECT_EQ(status("c1"), EventStatus::Retry);
  EXPECT_EQ(row("l1")->attempts, 0);
  EXPECT_GE(row("l1")->available_at, before + 2min);
  EXPECT_EQ(row("l1")->last_error, "rate limited");
  EXPECT_EQ(row("c1")->attempts, 1);
  EXPECT_GE(row("c1")->available_at, before + 3min);
  // A counted retry at the last attempt goes DEAD.
  d.enqueue_cold(queued(counted, 2));
  ASSERT_TRUE(wait_status("c1", EventStatus::Dead));
}

TEST_F(DispatcherTest, RetryLaterWithoutAWaitCountsTheAttemptAndBacksOff) {
  listeners->register_listener(EventType::of("Now"), [](const EventEnvelope&) {
    throw RetryLater(std::chrono::milliseconds(0), "again");
  });
  listeners->register_listener(EventType::of("Past"), [](const EventEnvelope&) {
    throw RetryLater(std::chrono::milliseconds(-5000), "again");
  });
  OutboxDispatcher d(options());
  d.start();
  const auto before = std::chrono::system_clock::now();
  auto now = committed("Now", "n1");
  d.enqueue_hot(queued(now));
  auto past = committed("Past", "p1");
  d.enqueue_hot(queued(past, 2));
  ASSERT_TRUE(wait_status("p1", EventStatus::Dead));  // the last attempt: DEAD, not forever
  ASSERT_TRUE(wait_status("n1", EventStatus::Retry));
  EXPECT_EQ(row("n1")->attempts, 1);
  EXPECT_GT(row("n1")->available_at, before);  // the retry policy's backoff, not zero
}

TEST_F(DispatcherTest, StatusWriteFailureIsCountedNotRetried) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) { ++calls; });
  auto o = options();
  o.store = std::make_shared<testing::FailingDoneStore>(store, "s1");
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("A", "s1")));
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().status_update_failure == 1; }));
  d.close();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(metrics->snapshot().dispatch_failure, 0);
  EXPECT_EQ(status("s1"), EventStatus::New);  // left for the poller
}

TEST_F(DispatcherTest, DoneMarksAreBatchedByWindowAndSizeAndFlushedOnClose) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) { ++calls; });
  auto o = options();
  o.done_batch_window = std::chrono::hours(1);  // only the size limit or close() flush
  o.done_batch_max = 3;
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("A", "w1")));
  d.enqueue_hot(queued(committed("A", "w2")));
  ASSERT_TRUE(wait_until([&] { return calls.load() == 2; }));
  EXPECT_EQ(status("w1"), EventStatus::New);  // delivered, DONE mark waiting for its batch
  EXPECT_EQ(metrics->snapshot().dispatch_success, 0);
  d.enqueue_hot(queued(committed("A", "w3")));  // third mark fills the batch
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_success == 3; }));
  EXPECT_EQ(count(EventStatus::Done), 3);
  d.enqueue_hot(queued(committed("A", "w4")));
  ASSERT_TRUE(wait_until([&] { return calls.load() == 4; }));
  EXPECT_EQ(status("w4"), EventStatus::New);
  d.close();  // writes the waiting mark
  EXPECT_EQ(status("w4"), EventStatus::Done);
}

TEST_F(DispatcherTest, APollCycleWritesTheWaitingDoneMarksOnItsConnectionBeforeItsQuery) {
  // The poller takes the database's write lock for its claim anyway (SQLite has one): the marks
  // go with it instead of waiting for the flusher's window (an hour here) or its full batch.
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) { ++calls; });
  auto o = options();
  o.done_batch_window = std::chrono::hours(1);
  o.done_batch_max = 100;
  OutboxDispatcher d(o);
  d.start();
  OutboxPoller poller(polled_by_hand(pool, store, d));
  d.enqueue_hot(queued(committed("A", "m1")));
  d.enqueue_hot(queued(committed("A", "m2")));
  ASSERT_TRUE(wait_until([&] { return calls.load() == 2; }));
  EXPECT_EQ(status("m1"), EventStatus::New);  // waiting for the window
  EXPECT_EQ(poller.poll(), 0);                // nothing to claim: both are in flight here
  EXPECT_EQ(count(EventStatus::Done), 2);
  EXPECT_EQ(metrics->snapshot().dispatch_success, 2);
  EXPECT_EQ(poller.poll(), 0);  // nothing waited: nothing written twice
  EXPECT_EQ(metrics->snapshot().dispatch_success, 2);
  poller.close();
  d.close();
}

// Counts releases per id; throws on the n-th release when asked (a user's tracker may).
class CountingTracker final : public InFlightTracker {
 public:
  explicit CountingTracker(int throw_on_call = -1) : throw_on_call_(throw_on_call) {}
  bool try_acquire(std::string_view id) override { return inner_.try_acquire(id); }
  void release(std::string_view id) override {
    std::lock_guard lock(mutex_);
    if (++calls_ == throw_on_call_) {
      throw std::runtime_error("tracker down");
    }
    ++released_[std::string(id)];
    inner_.release(id);
  }
  bool contains(std::string_view id) const override { return inner_.contains(id); }
  std::map<std::string, int> released() {
    std::lock_guard lock(mutex_);
    return released_;
  }

 private:
  int throw_on_call_;
  std::mutex mutex_;
  int calls_ = 0;
  std::map<std::string, int> released_;
  DefaultInFlightTracker inner_;
};

// A batch of written marks is settled in chunks of 64 ids under one lock hold each: every id is
// released once whatever the batch's size, and what a throwing tracker let through is counted.
TEST_F(DispatcherTest, WrittenDoneMarksAreSettledOnceEachAndCountedWhenATrackerThrows) {
  std::array<std::atomic<int>, 2> calls{};
  for (const int throw_on : {-1, 3}) {
    SCOPED_TRACE(throw_on);
    const int k = throw_on < 0 ? 0 : 1;
    const std::string type = k == 0 ? "A" : "B";
    listeners->register_listener(EventType::of(type),
                                 [&calls, k](const EventEnvelope&) { ++calls[k]; });
    auto tracker = std::make_shared<CountingTracker>(throw_on);
    auto o = options();
    o.worker_count = 1;
    o.in_flight_tracker = tracker;
    o.done_batch_window = std::chrono::hours(1);
    o.done_batch_max = 1000;
    const auto before = metrics->snapshot().dispatch_success;
    const int done_before = count(EventStatus::Done);
    OutboxDispatcher d(o);
    d.start();
    OutboxPoller poller(polled_by_hand(pool, store, d));
    const int n = throw_on < 0 ? 129 : 5;  // three chunks; or one whose third release throws
    for (int i = 0; i < n; ++i) {
      d.enqueue_hot(queued(committed(type, type + std::to_string(i))));
    }
    ASSERT_TRUE(wait_until([&] { return calls[k].load() == n; }));
    poller.poll();  // writes the marks, then settles them (the poller's cycle catches a throw)
    EXPECT_EQ(count(EventStatus::Done) - done_before, n);
    const auto released = tracker->released();
    EXPECT_EQ(static_cast<int>(released.size()), throw_on < 0 ? n : 2);
    for (const auto& [id, times] : released) {
      EXPECT_EQ(times, 1) << id;
    }
    EXPECT_EQ(metrics->snapshot().dispatch_success - before, throw_on < 0 ? n : 2);
    poller.close();
    d.close();
  }
}

// Found by the hostile round on the staged hand-over: after any poll cycle the flusher left full
// batches alone for a whole window. Only a poller draining a backlog (back-to-back cycles) takes
// them over now.
TEST_F(DispatcherTest, AFullDoneBatchIsWrittenAtOnceAfterAPollCycleThatDoesNotDrain) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) { ++calls; });
  auto o = options();
  o.done_batch_window = std::chrono::hours(1);
  o.done_batch_max = 2;
  OutboxDispatcher d(o);
  d.start();
  // A claiming poller writes the waiting marks before its claim (a poll without claims is a read
  // and leaves them to the flusher).
  OutboxPoller poller(polled_by_hand(pool, store, d));
  d.enqueue_hot(queued(committed("A", "f1")));
  ASSERT_TRUE(wait_until([&] { return calls.load() == 1; }));
  EXPECT_EQ(poller.poll(), 0);  // writes f1's mark on the poll's connection
  EXPECT_EQ(count(EventStatus::Done), 1);
  for (const char* id : {"f2", "f3", "f4", "f5"}) {
    d.enqueue_hot(queued(committed("A", id)));
  }
  ASSERT_TRUE(wait_until([&] { return calls.load() == 5; }));
  // 4 marks wait, done_batch_max = 2: written as soon as 2 wait, not after the hour.
  EXPECT_TRUE(wait_until([&] { return count(EventStatus::Done) == 5; }));
  poller.close();
  d.close();
}

// The last cycle of a drain follows a full page but reads a short one: the poller then waits its
// interval, so full batches may not be left to a next cycle (they waited the whole window).
class DrainMarksTest : public DispatcherTest {
 protected:
  void drain_then_finish(std::optional<ClaimLocking> claims);
};

void DrainMarksTest::drain_then_finish(std::optional<ClaimLocking> claims) {
  auto o = options();
  std::atomic<int> calls{0};
  std::atomic<bool> go{false};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) {
    wait_until([&] { return go.load(); }, 30s);
    ++calls;
  });
  for (int i = 0; i < 26; ++i) {
    store->insert_new(*pool->acquire(), EventEnvelope::builder(EventType::of("A"))
                                            .event_id("w" + std::to_string(100 + i))
                                            .payload_json("{}")
                                            .build());
  }
  o.done_batch_window = std::chrono::hours(1);
  o.done_batch_max = 2;
  OutboxDispatcher d(o);
  d.start();
  OutboxPoller poller({.connection_provider = pool,
                       .store = store,
                       .handler = std::make_shared<DispatcherPollerHandler>(d),
                       .batch_size = 10,
                       .interval = std::chrono::hours(1),
                       .claim_locking = claims});
  poller.start();
  // Full, full, short page; then the poller waits its hour.
  ASSERT_TRUE(wait_until([&] {
    return poller.completed_cycles() >= 3 && poller.next_wait() == std::chrono::hours(1);
  }));
  go = true;  // 26 marks come now, done_batch_max = 2: 13 full batches
  ASSERT_TRUE(wait_until([&] { return calls.load() == 26; }));
  EXPECT_TRUE(wait_until([&] { return count(EventStatus::Done) == 26; }))
      << count(EventStatus::Done) << " of 26 DONE";
  poller.close();
  d.close();
}

TEST_F(DrainMarksTest, FullDoneBatchesAfterTheLastCycleOfADrainAreWrittenAtOnce) {
  drain_then_finish(std::nullopt);
}

TEST_F(DrainMarksTest, FullDoneBatchesAfterTheLastCycleOfAStagedDrainAreWrittenAtOnce) {
  drain_then_finish(ClaimLocking{"staged", 5min});
}

// From the hostile round on the staged hand-over: an event the poller re-claims (its own claim,
// older than the grace) while its hot delivery runs; the staged hand-over of that page is held
// up until after the event completed and its DONE mark was written by the next cycle. The stale
// row must not be delivered again.
class GateCodec final : public JsonCodec {
 public:
  std::optional<std::string> to_json(const Headers& h) const override {
    return JsonCodec::default_codec().to_json(h);
  }
  Headers parse_object(std::string_view json) const override {
    if (json.find("gate") != std::string_view::npos) {
      entered = true;
      wait_until([&] { return open.load(); }, std::chrono::seconds(10));
    }
    return JsonCodec::default_codec().parse_object(json);
  }
  mutable std::atomic<bool> entered{false};
  std::atomic<bool> open{false};
};

TEST_F(DispatcherTest, ALateStagedHandOverOfAnEventCompletedMeanwhileDeliversNothing) {
  std::atomic<int> calls{0};
  std::atomic<bool> go{false};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope& e) {
    ++calls;
    if (e.event_id() == "x1" && calls.load() == 1) {
      wait_until([&] { return go.load(); }, std::chrono::seconds(10));
    }
  });
  auto o = options();
  o.claim_owner = "n";
  o.claim_timeout = std::chrono::seconds(2);
  o.done_batch_window = std::chrono::hours(1);
  o.done_batch_max = 100;
  OutboxDispatcher d(o);
  d.start();
  auto e = EventEnvelope::builder(EventType::of("A"))
               .event_id("x1")
               .payload_json("{}")
               .header("k", "gate")
               .build();
  ASSERT_TRUE(d.reserve("x1"));
  store->insert_new(*pool->acquire(), e, "n");
  ASSERT_TRUE(d.enqueue_hot(queued(e), true));
  ASSERT_TRUE(wait_until([&] { return calls.load() == 1; }));
  GateCodec codec;
  OutboxPoller poller({.connection_provider = pool,
                       .store = store,
                       .handler = std::make_shared<DispatcherPollerHandler>(d),
                       .interval = std::chrono::milliseconds(20),
                       .claim_locking = ClaimLocking{"n", std::chrono::milliseconds(1000)},
                       .head_rescan_interval = std::chrono::milliseconds(0),
                       .json_codec = &codec});
  poller.start();
  // After the grace (100 ms) the poller re-claims x1 and the stage blocks decoding it.
  ASSERT_TRUE(wait_until([&] { return codec.entered.load(); }));
  go = true;  // the hot delivery ends; its DONE mark waits for the next cycle
  ASSERT_TRUE(wait_until([&] { return status("x1") == EventStatus::Done; }));
  codec.open = true;  // the late hand-over of the stale page
  const auto c0 = poller.completed_cycles();
  ASSERT_TRUE(wait_until([&] { return poller.completed_cycles() >= c0 + 3; }));
  poller.close();
  d.close();
  EXPECT_EQ(calls.load(), 1);
}

// Found breaking issue 11: a deadlock on a RETRY/DEAD write was taken for a refused value and the
// listener's message replaced by "(message not storable) …".
TEST_F(DispatcherTest, ADeadlockedStatusWriteIsWrittenAgainWithItsMessage) {
  class DeadlockOnce final : public testing::ForwardingStore {
   public:
    using ForwardingStore::ForwardingStore;
    int mark_retry(sql::Connection& c, std::string_view id, Timestamp now,
                   std::chrono::milliseconds d, std::string_view e, std::string_view o) override {
      if (!failed_.exchange(true)) {
        throw StoreError("deadlock detected", "40P01");
      }
      return inner_->mark_retry(c, id, now, d, e, o);
    }

   private:
    std::atomic<bool> failed_{false};
  };
  listeners->register_listener(
      EventType::of("A"), [](const EventEnvelope&) { throw std::runtime_error("broker said no"); });
  auto o = options();
  o.store = std::make_shared<DeadlockOnce>(store);
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("A", "dl1")));
  ASSERT_TRUE(wait_status("dl1", EventStatus::Retry));
  EXPECT_EQ(row("dl1")->last_error, "broker said no");
  EXPECT_EQ(metrics->snapshot().status_update_failure, 0);
}

}  // namespace
// Found breaking leases: in ordered mode a deferral retried in place went on after the process
// lost its lease (the new holder delivered the same event meanwhile). The retry now stops, and
// the event and those behind it stay in the table for the holder.
TEST_F(DispatcherTest, AnOrderedDeferralStopsWhenTheProcessMayNoLongerDeliver) {
  std::atomic<bool> active{true};
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("Held"), [&](const EventEnvelope&) {
    if (++calls == 2) {
      active = false;  // the lease went elsewhere
    }
    throw RetryLater(std::chrono::milliseconds(1), "429", false);
  });
  auto o = options();
  o.ordered = true;
  o.worker_count = 1;
  o.max_attempts = 1;
  o.active = [&] { return active.load(); };
  OutboxDispatcher dispatcher(o);
  dispatcher.start();
  const auto e = committed("Held", "h1");
  ASSERT_TRUE(dispatcher.enqueue_hot(queued(e), false));
  // Released once the worker gave it up.
  ASSERT_TRUE(wait_until([&] {
    if (dispatcher.reserve(e.event_id())) {
      dispatcher.release_reservation(e.event_id());
      return true;
    }
    return false;
  }));
  const int after = calls.load();
  dispatcher.close();
  EXPECT_EQ(after, 2);
  EXPECT_EQ(calls.load(), 2);
  EXPECT_EQ(status(e.event_id()), EventStatus::New);
}

// Without the lease (Options::active false) a worker leaves what it takes in the table: no
// listener runs, no status is written, and the event is free for the poller of the holder.
TEST_F(DispatcherTest, WhileNotActingTakenEventsStayInTheTable) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("E"), [&](const EventEnvelope&) { ++calls; });
  auto o = options();
  o.active = [] { return false; };
  OutboxDispatcher dispatcher(o);
  EXPECT_FALSE(dispatcher.acting());
  dispatcher.start();
  const auto e = committed("E", "idle-1");
  ASSERT_TRUE(dispatcher.enqueue_cold(queued(e)));
  ASSERT_TRUE(wait_until([&] { return dispatcher.inactive_dropped() == 1; }));
  // Released from the ledger right after it was counted.
  ASSERT_TRUE(wait_until([&] {
    if (dispatcher.reserve(e.event_id())) {
      dispatcher.release_reservation(e.event_id());
      return true;
    }
    return false;
  }));
  dispatcher.close();
  EXPECT_EQ(calls.load(), 0);
  EXPECT_EQ(status(e.event_id()), EventStatus::New);
  EXPECT_EQ(row(e.event_id())->attempts, 0);
}

}  // namespace outbox
