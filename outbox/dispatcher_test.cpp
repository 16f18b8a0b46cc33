// The dispatcher: delivery, queues, reservations, scans, lifecycle.
#include "outbox/dispatcher.hpp"
#include "outbox/dispatcher_writer_hook.hpp"

#include <gtest/gtest.h>

#include "outbox/errors.hpp"
#include "outbox/interceptor.hpp"
#include "outbox/metrics.hpp"
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

TEST_F(DispatcherTest, DeliversAndMarksDone) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope& e) {
    EXPECT_EQ(e.event_id(), "e1");
    ++calls;
  });
  OutboxDispatcher d(options());
  d.start();
  ASSERT_TRUE(d.enqueue_hot(queued(committed("A", "e1"))));
  ASSERT_TRUE(wait_status("e1", EventStatus::Done));
  EXPECT_EQ(calls.load(), 1);
  d.close();
  auto m = metrics->snapshot();
  EXPECT_EQ(m.hot_enqueued, 1);
  EXPECT_EQ(m.dispatch_success, 1);
}

TEST_F(DispatcherTest, InterceptorsRunInOrderAndReverseAndSeeTheError) {
  std::mutex m;
  std::vector<std::string> trace;
  auto rec = [&](std::string s) {
    std::lock_guard lock(m);
    trace.push_back(std::move(s));
  };
  listeners->register_listener(EventType::of("X"), [&](const EventEnvelope&) {
    rec("listener");
    throw std::runtime_error("no");
  });
  auto o = options();
  o.worker_count = 1;
  o.interceptors = {
      EventInterceptor::before([&](const EventEnvelope&) { rec("before1"); }),
      EventInterceptor::before([&](const EventEnvelope&) { rec("before2"); }),
      EventInterceptor::after([&](const EventEnvelope&, const DeliveryResult& r) {
        rec(r.ok() ? "after1" : "after1:err");
      }),
      EventInterceptor::after([&](const EventEnvelope&, const DeliveryResult&) {
        rec("after2");
        throw std::runtime_error("ignored");
      }),
  };
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("X", "i1")));
  ASSERT_TRUE(wait_status("i1", EventStatus::Retry));
  d.close();
  EXPECT_EQ(trace,
            (std::vector<std::string>{"before1", "before2", "listener", "after2", "after1:err"}));
}

TEST_F(DispatcherTest, ThrowingBeforeInterceptorFailsTheEvent) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("X"), [&](const EventEnvelope&) { ++calls; });
  auto o = options();
  o.interceptors = {
      EventInterceptor::before([](const EventEnvelope&) { throw std::runtime_error("vetoed"); })};
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("X", "v1")));
  ASSERT_TRUE(wait_status("v1", EventStatus::Retry));
  EXPECT_EQ(row("v1")->last_error, "vetoed");
  EXPECT_EQ(calls.load(), 0);
}

TEST_F(DispatcherTest, SameEventQueuedTwiceIsDeliveredOnce) {
  Gate gate;
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) {
    ++calls;
    gate.wait();
  });
  OutboxDispatcher d(options());
  d.start();
  auto e = committed("A", "d1");
  EXPECT_TRUE(d.enqueue_hot(queued(e)));
  ASSERT_TRUE(wait_until([&] { return calls.load() == 1; }));
  EXPECT_TRUE(d.enqueue_cold(queued(e)));  // in flight: accepted as a duplicate, not queued
  EXPECT_TRUE(d.enqueue_hot(queued(e)));
  EXPECT_EQ(d.cold_queue_remaining_capacity(), 1000);
  gate.open();
  ASSERT_TRUE(wait_status("d1", EventStatus::Done));
  d.close();
  EXPECT_EQ(calls.load(), 1);
}

TEST_F(DispatcherTest, EventCompletedDuringAScanIsNotQueuedByThatScan) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) { ++calls; });
  OutboxDispatcher d(options());
  d.start();
  auto e = committed("A", "r1");
  const auto token = d.begin_scan();  // the poller's query would now read r1 as NEW
  d.enqueue_hot(queued(e));
  ASSERT_TRUE(wait_status("r1", EventStatus::Done));
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_success == 1; }));
  EXPECT_TRUE(d.enqueue_cold(queued(e)));  // the stale read is dropped
  d.end_scan(token);
  d.close();
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(metrics->snapshot().cold_enqueued, 0);
}

TEST_F(DispatcherTest, WriterHookReservesBeforeCommitSoThePollerCannotDeliverFirst) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) { ++calls; });
  OutboxDispatcher d(options());
  d.start();
  DispatcherWriterHook hook(d, metrics);
  auto e = committed("A", "g1");
  hook.after_write({e});
  // The row is committed but the after-commit hook has not run yet; a poll cycle reads it.
  EXPECT_TRUE(d.enqueue_cold(queued(e)));
  EXPECT_EQ(metrics->snapshot().cold_enqueued, 0);
  hook.after_commit({e});
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_success == 1; }));
  EXPECT_EQ(metrics->snapshot().hot_enqueued, 1);

  // A rolled-back write releases its reservation: the event id could be queued again.
  auto r = committed("A", "g2");
  hook.after_write({r});
  hook.after_rollback({r});
  EXPECT_TRUE(d.enqueue_cold(queued(r)));
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_success == 2; }));
  EXPECT_EQ(metrics->snapshot().cold_enqueued, 1);
  d.close();
  EXPECT_EQ(calls.load(), 2);
}

TEST_F(DispatcherTest, WriterHookLeavesDelayedEventsToThePoller) {
  OutboxDispatcher d(options());
  d.start();
  DispatcherWriterHook hook(d, metrics);
  auto delayed = EventEnvelope::builder(EventType::of("A"))
                     .deliver_after(std::chrono::hours(1))
                     .payload_json("{}")
                     .build();
  hook.after_write({delayed});
  hook.after_commit({delayed});
  EXPECT_EQ(metrics->snapshot().hot_enqueued, 0);
  EXPECT_EQ(metrics->snapshot().hot_dropped, 0);
}

TEST_F(DispatcherTest, TwoHotForOneColdWhenBothHaveWork) {
  Gate gate;
  std::mutex m;
  std::vector<std::string> order;
  std::atomic<bool> blocked{false};
  listeners->register_listener(EventType::of("Block"), [&](const EventEnvelope&) {
    blocked = true;
    gate.wait();
  });
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope& e) {
    std::lock_guard lock(m);
    order.push_back(e.event_id().substr(0, 1));
  });
  auto o = options();
  o.worker_count = 1;
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("Block", "block")));
  ASSERT_TRUE(wait_until([&] { return blocked.load(); }));
  for (int i = 0; i < 6; ++i) {
    d.enqueue_hot(queued(committed("A", "h" + std::to_string(i))));
  }
  for (int i = 0; i < 3; ++i) {
    d.enqueue_cold(queued(committed("A", "c" + std::to_string(i))));
  }
  gate.open();
  ASSERT_TRUE(wait_until([&] {
    std::lock_guard lock(m);
    return order.size() == 9;
  }));
  d.close();
  EXPECT_EQ(order, (std::vector<std::string>{"h", "h", "c", "h", "h", "c", "h", "h", "c"}));
}

TEST_F(DispatcherTest, FullQueueAndClosedDispatcherRefuse) {
  Gate gate;
  std::atomic<bool> blocked{false};
  listeners->register_listener(EventType::of("Block"), [&](const EventEnvelope&) {
    blocked = true;
    gate.wait();
  });
  listeners->register_listener(EventType::of("A"), [](const EventEnvelope&) {});
  auto o = options();
  o.worker_count = 1;
  o.hot_queue_capacity = 2;
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("Block", "b")));
  ASSERT_TRUE(wait_until([&] { return blocked.load(); }));
  EXPECT_TRUE(d.enqueue_hot(queued(committed("A", "x0"))));
  EXPECT_TRUE(d.enqueue_hot(queued(committed("A", "x1"))));
  EXPECT_FALSE(d.enqueue_hot(queued(committed("A", "x2"))));
  gate.open();
  d.close();
  EXPECT_FALSE(d.enqueue_hot(queued(committed("A", "x3"))));
  EXPECT_FALSE(d.enqueue_cold(queued(committed("A", "x4"))));
  EXPECT_EQ(d.cold_queue_remaining_capacity(), 0);
  EXPECT_EQ(status("x1"), EventStatus::Done);  // drained on close
  EXPECT_EQ(status("x2"), EventStatus::New);   // refused: left for the poller
}

TEST_F(DispatcherTest, ABatchOfPolledEventsIsTakenInOrderUntilTheQueueIsFull) {
  Gate gate;
  std::atomic<bool> blocked{false};
  std::mutex m;
  std::vector<std::string> delivered;
  listeners->register_listener(EventType::of("Block"), [&](const EventEnvelope&) {
    blocked = true;
    gate.wait();
  });
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope& e) {
    std::lock_guard lock(m);
    delivered.push_back(e.event_id());
  });
  auto o = options();
  o.worker_count = 1;
  o.cold_queue_capacity = 3;
  OutboxDispatcher d(o);
  d.start();
  const auto running = committed("Block", "b");
  d.enqueue_hot(queued(running));
  ASSERT_TRUE(wait_until([&] { return blocked.load(); }));
  std::vector<QueuedEvent> batch;
  for (const char* id : {"c0", "c1", "b", "c2", "c3", "c4"}) {
    batch.push_back(queued(std::string(id) == "b" ? running : committed("A", id)));
  }
  // "b" runs already: taken as a duplicate; the queue holds three, so c3 is refused and c4 is
  // not looked at.
  const auto r = d.enqueue_cold_all(std::move(batch));
  EXPECT_EQ(r.taken, 4u);
  EXPECT_EQ(r.queued, 3u);
  EXPECT_EQ(d.cold_queue_remaining_capacity(), 0);
  gate.open();
  d.close();
  EXPECT_EQ(delivered, (std::vector<std::string>{"c0", "c1", "c2"}));
  EXPECT_EQ(status("c3"), EventStatus::New);  // refused: left for the poller
  EXPECT_EQ(status("c4"), EventStatus::New);
  EXPECT_EQ(metrics->snapshot().cold_enqueued, 3);
}

TEST_F(DispatcherTest, CloseDrainsQueuedEvents) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) { ++calls; });
  OutboxDispatcher d(options());
  d.start();
  for (int i = 0; i < 200; ++i) {
    d.enqueue_hot(queued(committed("A", "q" + std::to_string(i))));
  }
  d.close();
  EXPECT_EQ(calls.load(), 200);
  EXPECT_EQ(count(EventStatus::Done), 200);
}

TEST_F(DispatcherTest, DrainTimeoutLeavesTheRestInTheTable) {
  Gate gate;
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("A"), [&](const EventEnvelope&) {
    ++calls;
    gate.wait();
  });
  auto o = options();
  o.worker_count = 1;
  o.drain_timeout = std::chrono::milliseconds(0);
  auto d = std::make_unique<OutboxDispatcher>(o);
  d->start();
  for (int i = 0; i < 10; ++i) {
    d->enqueue_hot(queued(committed("A", "t" + std::to_string(i))));
  }
  ASSERT_TRUE(wait_until([&] { return calls.load() == 1; }));
  auto late = committed("A", "late");
  std::thread closer([&] { d->close(); });
  const bool refused = wait_until([&] { return !d->enqueue_hot(queued(late)); });
  gate.open();
  closer.join();
  ASSERT_TRUE(refused);
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(count(EventStatus::Done), 1);
  EXPECT_EQ(count(EventStatus::New), 10);  // 9 abandoned + "late"
}

TEST_F(DispatcherTest, OptionsAreValidated) {
  auto bad = [&](auto mutate) {
    auto o = options();
    mutate(o);
    EXPECT_THROW(OutboxDispatcher{o}, std::invalid_argument);
  };
  bad([](auto& o) { o.connection_provider = nullptr; });
  bad([](auto& o) { o.store = nullptr; });
  bad([](auto& o) { o.listeners = nullptr; });
  bad([](auto& o) { o.max_attempts = 0; });
  bad([](auto& o) { o.worker_count = 0; });
  bad([](auto& o) { o.hot_queue_capacity = 0; });
  bad([](auto& o) { o.cold_queue_capacity = 0; });
  bad([](auto& o) { o.interceptors = {nullptr}; });
  bad([](auto& o) { o.done_batch_window = std::chrono::microseconds(-1); });
  bad([](auto& o) { o.done_batch_max = 0; });
  // Longer than kMaxDuration would wrap the steady clock: a drain that does not wait at all.
  bad([](auto& o) { o.drain_timeout = kMaxDuration + 1ms; });
  bad([](auto& o) { o.claim_timeout = std::chrono::hours(24 * 999999); });
  bad([](auto& o) { o.done_batch_window = std::chrono::hours(2); });
}

// Found breaking issue 9: in ordered mode a failed DONE write dropped the queue, but a poll cycle
// that had read [e1, e2] before the drop still queued e2, which then overtook e1's redelivery
// (e1, e2, e1). Events read by a cycle that began before the drop are refused.
TEST_F(DispatcherTest, OrderedDropRefusesWhatAnEarlierScanStillHandsOver) {
  Gate gate;
  std::mutex m;
  std::vector<std::string> seen;
  listeners->register_listener(EventType::of("S"), [&](const EventEnvelope& e) {
    bool first;
    {
      std::lock_guard lock(m);
      seen.push_back(e.event_id());
      first = seen.size() == 1;
    }
    if (first) {
      gate.wait();
    }
  });
  auto e1 = committed("S", "e1");
  auto e2 = committed("S", "e2");
  auto o = options();
  o.worker_count = 1;
  o.ordered = true;
  o.store = std::make_shared<testing::FailingDoneStore>(store, "e1");
  OutboxDispatcher d(o);
  d.start();
  const auto early = d.begin_scan();  // this cycle reads e1 and e2
  ASSERT_EQ(d.try_enqueue_cold(QueuedEvent{e1, QueuedEvent::Source::Cold, 0, {}, early}),
            OutboxDispatcher::EnqueueResult::Queued);
  ASSERT_TRUE(wait_until([&] {
    std::lock_guard lock(m);
    return seen.size() == 1;
  }));
  gate.open();  // e1's DONE write is refused: the queue is dropped and e1 released
  ASSERT_TRUE(wait_until([&] {
    if (d.reserve("e1")) {
      d.release_reservation("e1");
      return true;
    }
    return false;
  }));
  EXPECT_EQ(d.try_enqueue_cold(QueuedEvent{e2, QueuedEvent::Source::Cold, 0, {}, early}),
            OutboxDispatcher::EnqueueResult::Refused);
  d.end_scan(early);
  const auto next = d.begin_scan();  // the next cycle reads from the head again
  ASSERT_TRUE(wait_until([&] {
    return d.try_enqueue_cold(QueuedEvent{e1, QueuedEvent::Source::Cold, 0, {}, next}) ==
           OutboxDispatcher::EnqueueResult::Queued;
  }));
  EXPECT_EQ(d.try_enqueue_cold(QueuedEvent{e2, QueuedEvent::Source::Cold, 0, {}, next}),
            OutboxDispatcher::EnqueueResult::Queued);
  d.end_scan(next);
  ASSERT_TRUE(wait_status("e2", EventStatus::Done));
  d.close();
  EXPECT_EQ(seen, (std::vector<std::string>{"e1", "e1", "e2"}));
}

}  // namespace
}  // namespace outbox
