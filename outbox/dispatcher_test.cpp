#include "outbox/dispatcher.hpp"
#include "outbox/dispatcher_writer_hook.hpp"

#include <gtest/gtest.h>

#include "outbox/errors.hpp"
#include "outbox/interceptor.hpp"
#include "outbox/metrics.hpp"
#include "outbox/retry_policy.hpp"
#include "tests/support/failing_store.hpp"
#include "tests/support/memory_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::Gate;
using testing::wait_until;

class DispatcherTest : public testing::MemoryFixture {
 protected:
  OutboxDispatcher::Options options() {
    return {.connection_provider = pool,
            .store = store,
            .listeners = listeners,
            .retry_policy = std::make_shared<ExponentialBackoffRetryPolicy>(
                std::chrono::milliseconds(1000), std::chrono::milliseconds(1000), false),
            .max_attempts = 3,
            .worker_count = 2,
            .metrics = metrics};
  }
  // Inserts a committed row and returns its envelope.
  EventEnvelope committed(const std::string& type, const std::string& id) {
    auto e = EventEnvelope::builder(EventType::of(type)).event_id(id).payload_json("{}").build();
    store->insert_new(*pool->acquire(), e);
    return e;
  }
  QueuedEvent queued(const EventEnvelope& e, int attempts = 0) {
    return QueuedEvent{e, QueuedEvent::Source::Hot, attempts};
  }

  std::shared_ptr<InMemoryMetrics> metrics = std::make_shared<InMemoryMetrics>();
};

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

// A registry whose "Batched" events also have a batch listener.
class BatchRegistry final : public ListenerRegistry {
 public:
  BatchRegistry(std::shared_ptr<ListenerRegistry> singles, BatchEventListener batch)
      : singles_(std::move(singles)),
        batch_(std::make_shared<const BatchEventListener>(std::move(batch))) {}
  std::shared_ptr<const EventListener> listener_for(std::string_view aggregate_type,
                                                    std::string_view event_type) const override {
    return singles_->listener_for(aggregate_type, event_type);
  }
  std::shared_ptr<const BatchEventListener> batch_listener_for(
      std::string_view, std::string_view event_type) const override {
    return event_type == "Batched" ? batch_ : nullptr;
  }

 private:
  std::shared_ptr<ListenerRegistry> singles_;
  std::shared_ptr<const BatchEventListener> batch_;
};

TEST_F(DispatcherTest, BatchListenerGetsQueuedEventsTogetherWithPerEventOutcomes) {
  testing::Gate gate;
  std::atomic<bool> blocked{false};
  listeners->register_listener(EventType::of("Block"), [&](const EventEnvelope&) {
    blocked = true;
    gate.wait();
  });
  std::atomic<int> singles{0};
  listeners->register_listener(EventType::of("Single"), [&](const EventEnvelope&) { ++singles; });
  listeners->register_listener(EventType::of("Batched"), [](const EventEnvelope&) {
    FAIL() << "the batch listener must be used";
  });
  std::mutex calls_mutex;
  std::vector<std::vector<std::string>> calls;
  auto registry =
      std::make_shared<BatchRegistry>(listeners, [&](std::span<const EventEnvelope* const> batch) {
        std::vector<std::string> ids;
        std::vector<DeliveryResult> out;
        for (const auto* e : batch) {
          ids.push_back(e->event_id());
          if (e->event_id() == "b1") {
            out.push_back(DeliveryResult::failed("broker busy"));
          } else if (e->event_id() == "b2") {
            out.push_back(DeliveryResult::permanent("rejected"));
          } else {
            out.push_back(DeliveryResult::delivered());
          }
        }
        std::lock_guard lock(calls_mutex);
        calls.push_back(ids);
        return out;
      });
  auto o = options();
  o.listeners = registry;
  o.worker_count = 1;
  o.max_batch_size = 8;
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("Block", "block")));       // holds the only worker
  ASSERT_TRUE(wait_until([&] { return blocked.load(); }));  // the rest queue up behind it
  for (int i = 0; i < 3; ++i) {
    d.enqueue_hot(queued(committed("Batched", "b" + std::to_string(i))));
  }
  d.enqueue_hot(queued(committed("Single", "s0")));
  d.enqueue_hot(queued(committed("Nobody", "n0")));
  for (int i = 3; i < 6; ++i) {
    d.enqueue_hot(queued(committed("Batched", "b" + std::to_string(i))));
  }
  gate.open();
  ASSERT_TRUE(wait_status("b5", EventStatus::Done));
  ASSERT_TRUE(wait_status("n0", EventStatus::Dead));
  ASSERT_TRUE(wait_status("s0", EventStatus::Done));
  d.close();
  // A run of events a batch listener takes travels together; an event without one goes alone
  // (so a slow single listener never holds a worker's whole batch), which ends the run.
  ASSERT_EQ(calls.size(), 2u);
  EXPECT_EQ(calls[0], (std::vector<std::string>{"b0", "b1", "b2"}));
  EXPECT_EQ(calls[1], (std::vector<std::string>{"b3", "b4", "b5"}));
  EXPECT_EQ(singles.load(), 1);
  EXPECT_EQ(status("b0"), EventStatus::Done);
  EXPECT_EQ(status("b1"), EventStatus::Retry);
  EXPECT_EQ(row("b1")->last_error, "broker busy");
  EXPECT_EQ(status("b2"), EventStatus::Dead);
  EXPECT_EQ(row("b2")->last_error, "rejected");
  EXPECT_EQ(status("b4"), EventStatus::Done);
}

TEST_F(DispatcherTest, BatchListenerThrowingFailsEveryEventOfTheBatch) {
  testing::Gate gate;
  std::atomic<bool> blocked{false};
  listeners->register_listener(EventType::of("Block"), [&](const EventEnvelope&) {
    blocked = true;
    gate.wait();
  });
  auto registry = std::make_shared<BatchRegistry>(
      listeners, [](std::span<const EventEnvelope* const>) -> std::vector<DeliveryResult> {
        throw std::runtime_error("connection reset");
      });
  auto o = options();
  o.listeners = registry;
  o.worker_count = 1;
  o.max_batch_size = 4;
  OutboxDispatcher d(o);
  d.start();
  d.enqueue_hot(queued(committed("Block", "block")));
  ASSERT_TRUE(wait_until([&] { return blocked.load(); }));
  for (int i = 0; i < 3; ++i) {
    d.enqueue_hot(queued(committed("Batched", "t" + std::to_string(i))));
  }
  gate.open();
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_failure == 3; }));
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(row("t" + std::to_string(i))->last_error, "connection reset");
  }
  d.close();
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

TEST_F(DispatcherTest, EventsWithoutABatchListenerGoToWorkersOneByOne) {
  // Slow single listeners (webhooks) with a large batch: each event must get its own worker,
  // not wait behind others in one worker's batch while workers sit idle.
  std::atomic<int> running{0}, peak{0};
  listeners->register_listener(EventType::of("Slow"), [&](const EventEnvelope&) {
    const int now = ++running;
    int seen = peak.load();
    while (now > seen && !peak.compare_exchange_weak(seen, now)) {
    }
    wait_until([&] { return peak.load() >= 4; }, 10s);
    --running;
  });
  auto o = options();
  o.worker_count = 8;
  o.max_batch_size = 100;
  o.cold_queue_capacity = 100;
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 16; ++i) {
    events.push_back(committed("Slow", "s" + std::to_string(i)));
  }
  OutboxDispatcher d(o);
  d.start();
  for (const auto& e : events) {
    ASSERT_TRUE(d.enqueue_cold(queued(e)));
  }
  ASSERT_TRUE(wait_until([&] { return metrics->snapshot().dispatch_success == 16; }));
  EXPECT_GE(peak.load(), 4);
  d.close();
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
}  // namespace outbox
