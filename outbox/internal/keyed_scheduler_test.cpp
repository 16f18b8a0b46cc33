// The keyed scheduler: one take per group at a time in queue order, a cap on running groups,
// groups in turn, a failed group's waiting events dropped, grouped events within the cold capacity.

#include <gtest/gtest.h>

#include "outbox/internal/dispatch_queue.hpp"

namespace outbox::internal {
namespace {

QueuedEvent grouped(const std::string& id, const std::string& group, int partition = 0,
                    const void* batch_key = nullptr) {
  QueuedEvent e{EventEnvelope::builder(EventType::of("T"))
                    .event_id(id)
                    .message_group(group)
                    .payload_json("{}")
                    .build(),
                QueuedEvent::Source::Cold};
  e.batchable = batch_key != nullptr;
  e.batch_key = batch_key;
  e.partition = partition;
  return e;
}

QueuedEvent plain(const std::string& id) {
  return {EventEnvelope::builder(EventType::of("T")).event_id(id).payload_json("{}").build(),
          QueuedEvent::Source::Cold};
}

std::vector<std::string> ids(const std::vector<QueuedEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    out.push_back(e.envelope.event_id());
  }
  return out;
}

TEST(KeyedScheduler, AGroupRunsOneTakeAtATimeInQueueOrder) {
  auto q = make_keyed_scheduler(10, 10, 8);
  q->push(grouped("a1", "a"));
  q->push(grouped("a2", "a"));
  q->push(grouped("b1", "b"));
  EXPECT_EQ(ids(q->take(10)), std::vector<std::string>{"a1"});
  EXPECT_EQ(ids(q->take(10)), std::vector<std::string>{"b1"});
  // a2 waits while a1 runs: something is queued, nothing can be taken.
  EXPECT_FALSE(q->empty());
  EXPECT_FALSE(q->ready());
  EXPECT_TRUE(q->take(10).empty());
  EXPECT_EQ(q->active_groups(), 2u);
  EXPECT_TRUE(q->end_group("a", false).empty());
  EXPECT_TRUE(q->ready());
  EXPECT_EQ(ids(q->take(10)), std::vector<std::string>{"a2"});
}

TEST(KeyedScheduler, NoMoreGroupsRunThanTheCap) {
  auto q = make_keyed_scheduler(10, 10, 2);
  for (const char* g : {"a", "b", "c"}) {
    q->push(grouped(std::string(g) + "1", g));
  }
  EXPECT_EQ(q->take(1).size(), 1u);
  EXPECT_EQ(q->take(1).size(), 1u);
  EXPECT_FALSE(q->ready());
  EXPECT_EQ(q->active_groups(), 2u);
  q->end_group("a", false);
  EXPECT_EQ(ids(q->take(1)), std::vector<std::string>{"c1"});
}

TEST(KeyedScheduler, AServedGroupGoesToTheBackOfTheLine) {
  auto q = make_keyed_scheduler(10, 100, 1);
  for (int i = 0; i < 3; ++i) {
    q->push(grouped("hot" + std::to_string(i), "hot"));
  }
  q->push(grouped("x", "x"));
  q->push(grouped("y", "y"));
  std::vector<std::string> order;
  while (!q->empty()) {
    auto e = q->take(1);
    ASSERT_EQ(e.size(), 1u);
    order.push_back(e.front().envelope.event_id());
    q->end_group(*e.front().envelope.message_group(), false);
  }
  EXPECT_EQ(order, (std::vector<std::string>{"hot0", "x", "y", "hot1", "hot2"}));
}

TEST(KeyedScheduler, AFailedGroupsWaitingEventsAreDroppedAndTheOthersStay) {
  auto q = make_keyed_scheduler(10, 10, 8);
  q->push(grouped("a1", "a"));
  q->push(grouped("a2", "a"));
  q->push(grouped("a3", "a"));
  q->push(grouped("b1", "b"));
  ASSERT_EQ(ids(q->take(1)), std::vector<std::string>{"a1"});
  EXPECT_EQ(ids(q->end_group("a", true)), (std::vector<std::string>{"a2", "a3"}));
  EXPECT_EQ(q->size(QueuedEvent::Source::Cold), 1u);
  EXPECT_EQ(ids(q->take(1)), std::vector<std::string>{"b1"});
}

TEST(KeyedScheduler, ABatchOfAGroupGoesToOneListener) {
  auto q = make_keyed_scheduler(10, 10, 8);
  int kafka = 0, http = 0;
  q->push(grouped("a1", "a", 0, &kafka));
  q->push(grouped("a2", "a", 0, &kafka));
  q->push(grouped("a3", "a", 0, &http));
  q->push(grouped("a4", "a", 0, &http));
  EXPECT_EQ(ids(q->take(10)), (std::vector<std::string>{"a1", "a2"}));
  q->end_group("a", false);
  EXPECT_EQ(ids(q->take(1)), std::vector<std::string>{"a3"});
}

TEST(KeyedScheduler, ATakeHoldsOneGroupsRunEvenForOneBatchListener) {
  auto q = make_keyed_scheduler(10, 20, 8);
  int kafka = 0;
  for (const char* g : {"a", "b"}) {
    q->push(grouped(std::string(g) + "1", g, 0, &kafka));
    q->push(grouped(std::string(g) + "2", g, 0, &kafka));
  }
  EXPECT_EQ(ids(q->take(10)), (std::vector<std::string>{"a1", "a2"}));
  EXPECT_EQ(ids(q->take(10)), (std::vector<std::string>{"b1", "b2"}));
}

TEST(KeyedScheduler, GroupedEventsCountAgainstTheColdCapacityBesideThePlainOnes) {
  auto q = make_keyed_scheduler(1, 3, 8);
  EXPECT_TRUE(q->push(plain("p1")));
  EXPECT_TRUE(q->push(grouped("a1", "a")));
  EXPECT_TRUE(q->push(grouped("b1", "b")));
  EXPECT_EQ(q->cold_remaining(), 0u);
  EXPECT_FALSE(q->push(grouped("c1", "c")));
  EXPECT_FALSE(q->push(plain("p2")));
  EXPECT_EQ(q->clear().size(), 3u);
  EXPECT_TRUE(q->empty());
}

TEST(KeyedScheduler, APartitionHandedOverLosesItsWaitingGroupsButNotTheRunningOne) {
  auto q = make_keyed_scheduler(10, 10, 8);
  q->push(grouped("a1", "a", 5));
  q->push(grouped("a2", "a", 5));
  q->push(grouped("b1", "b", 5));
  q->push(grouped("c1", "c", 6));
  ASSERT_EQ(ids(q->take(1)), std::vector<std::string>{"a1"});
  EXPECT_EQ(ids(q->drop_partition(5)), std::vector<std::string>{"b1"});
  // a runs: its waiting event stays until the group ends (the dispatcher drops it then).
  EXPECT_EQ(q->size(QueuedEvent::Source::Cold), 2u);
  EXPECT_EQ(ids(q->take(1)), std::vector<std::string>{"c1"});
}

TEST(KeyedScheduler, PlainAndGroupedEventsTakeTurns) {
  auto q = make_keyed_scheduler(10, 10, 8);
  q->push(plain("p1"));
  q->push(plain("p2"));
  q->push(grouped("a1", "a"));
  q->push(grouped("b1", "b"));
  std::vector<std::string> order;
  for (int i = 0; i < 4; ++i) {
    order.push_back(q->take(1).front().envelope.event_id());
  }
  EXPECT_EQ(order, (std::vector<std::string>{"p1", "a1", "p2", "b1"}));
}

}  // namespace
}  // namespace outbox::internal
