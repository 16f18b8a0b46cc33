// The dispatcher with batch listeners.
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

}  // namespace
}  // namespace outbox
