#include <gtest/gtest.h>

#include "outbox/internal/dispatch_queue.hpp"

namespace outbox::internal {
namespace {

QueuedEvent event(const std::string& id, QueuedEvent::Source source, bool batchable = false) {
  QueuedEvent e{EventEnvelope::builder(EventType::of("T")).event_id(id).payload_json("{}").build(),
                source};
  e.batchable = batchable;
  return e;
}

std::vector<std::string> ids(const std::vector<QueuedEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    out.push_back(e.envelope.event_id());
  }
  return out;
}

TEST(FairQueues, RefusesPastEachCapacity) {
  auto q = make_fair_queues(1, 2);
  EXPECT_TRUE(q->push(event("h1", QueuedEvent::Source::Hot)));
  EXPECT_FALSE(q->push(event("h2", QueuedEvent::Source::Hot)));
  EXPECT_TRUE(q->push(event("c1", QueuedEvent::Source::Cold)));
  EXPECT_EQ(q->cold_remaining(), 1u);
  EXPECT_TRUE(q->push(event("c2", QueuedEvent::Source::Cold)));
  EXPECT_FALSE(q->push(event("c3", QueuedEvent::Source::Cold)));
  EXPECT_EQ(q->cold_remaining(), 0u);
}

TEST(FairQueues, TakesHotAndColdTwoToOneInOrder) {
  auto q = make_fair_queues(10, 10);
  for (int i = 0; i < 4; ++i) {
    q->push(event("h" + std::to_string(i), QueuedEvent::Source::Hot));
    q->push(event("c" + std::to_string(i), QueuedEvent::Source::Cold));
  }
  std::vector<std::string> order;
  while (!q->empty()) {
    auto taken = q->take(8);
    ASSERT_EQ(taken.size(), 1u);  // nothing batchable: one at a time
    order.push_back(taken.front().envelope.event_id());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"h0", "h1", "c0", "h2", "h3", "c1", "c2", "c3"}));
}

TEST(FairQueues, BatchableEventsTravelTogetherOthersAlone) {
  auto q = make_fair_queues(10, 10);
  q->push(event("b1", QueuedEvent::Source::Hot, true));
  q->push(event("b2", QueuedEvent::Source::Hot, true));
  q->push(event("s1", QueuedEvent::Source::Hot));
  q->push(event("b3", QueuedEvent::Source::Hot, true));
  EXPECT_EQ(ids(q->take(8)), (std::vector<std::string>{"b1", "b2"}));
  EXPECT_EQ(ids(q->take(8)), (std::vector<std::string>{"s1"}));
  EXPECT_EQ(ids(q->take(8)), (std::vector<std::string>{"b3"}));
  EXPECT_TRUE(q->take(8).empty());
}

TEST(FairQueues, ClearHandsBackEveryEvent) {
  auto q = make_fair_queues(10, 10);
  q->push(event("h", QueuedEvent::Source::Hot));
  q->push(event("c", QueuedEvent::Source::Cold));
  int seen = 0;
  q->for_each([&](QueuedEvent&) { ++seen; });
  EXPECT_EQ(seen, 2);
  EXPECT_EQ(ids(q->clear()), (std::vector<std::string>{"h", "c"}));
  EXPECT_TRUE(q->empty());
}

}  // namespace
}  // namespace outbox::internal
