// Outbox::ordered on the in-memory outbox: per-aggregate FIFO on one node, failures straight to
// DEAD, deferrals and failed status writes that must not let a later event overtake.

#include <gtest/gtest.h>

#include <mutex>

#include "outbox/errors.hpp"
#include "outbox/outbox.hpp"
#include "tests/support/failing_store.hpp"
#include "tests/support/memory_fixture.hpp"
#include "tests/support/outbox_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;

class OrderedOutboxTest : public testing::OutboxFixture<testing::MemoryFixture> {};

TEST_F(OrderedOutboxTest, DeliversInInsertionOrderAndFailsStraightToDead) {
  std::mutex m;
  std::vector<std::string> seen;
  listeners->register_listener(EventType::of("Step"), [&](const EventEnvelope& e) {
    std::lock_guard lock(m);
    seen.push_back(std::string(e.payload_json()));
    if (e.payload_json() == "\"3\"") {
      throw std::runtime_error("step 3 failed");
    }
  });
  auto o = options();
  o.dispatcher.worker_count = 8;   // forced to 1
  o.dispatcher.max_attempts = 10;  // forced to 1
  auto ob = Outbox::ordered(o);
  ob.start();
  std::string third;
  for (int i = 1; i <= 6; ++i) {
    auto id = commit_one(ob, "Step", "\"" + std::to_string(i) + "\"");
    if (i == 3) {
      third = id;
    }
  }
  EXPECT_EQ(metrics->snapshot().hot_enqueued, 0);  // no hot path
  ASSERT_TRUE(wait_until([&] {
    ob.poller()->poll();
    return count(EventStatus::Done) == 5;
  }));
  ob.close();
  EXPECT_EQ(seen, (std::vector<std::string>{"\"1\"", "\"2\"", "\"3\"", "\"4\"", "\"5\"", "\"6\""}));
  EXPECT_EQ(status(third), EventStatus::Dead);
  EXPECT_EQ(row(third)->attempts, 1);
  auto with_claim = options();
  with_claim.claim_locking = ClaimLocking{"x", 1000ms};
  EXPECT_THROW(Outbox::ordered(with_claim), std::invalid_argument);
}

// Issue 9 item 9: in ordered mode a RetryLater that does not count an attempt (the relay's HTTP
// Retry-After) turned the head event into RETRY while the aggregate's next event was delivered
// first: A1 (deferred), A2, A3, A1. The worker now holds the event and retries it in place.
TEST_F(OrderedOutboxTest, DeferralHoldsLaterEventsBack) {
  std::mutex m;
  std::vector<std::string> seen;
  std::atomic<int> first_attempts{0};
  listeners->register_listener(EventType::of("Step"), [&](const EventEnvelope& e) {
    {
      std::lock_guard lock(m);
      seen.push_back(std::string(e.payload_json()));
    }
    if (e.payload_json() == "\"1\"" && first_attempts++ == 0) {
      throw RetryLater(50ms, "429 Too Many Requests", false);
    }
  });
  auto ob = Outbox::ordered(options());
  ob.start();
  for (int i = 1; i <= 3; ++i) {
    auto t = tx->begin();
    ob.writer().write(EventEnvelope::builder(EventType::of("Step"))
                          .aggregate_id("A")
                          .payload_json("\"" + std::to_string(i) + "\"")
                          .build());
    t.commit();
  }
  ASSERT_TRUE(wait_until([&] {
    ob.poller()->poll();
    return count(EventStatus::Done) == 3;
  }));
  ob.close();
  EXPECT_EQ(seen, (std::vector<std::string>{"\"1\"", "\"1\"", "\"2\"", "\"3\""}));
}

// Found breaking issue 9: RetryLater(milliseconds::max()) overflowed the ordered worker's wait,
// which returned at once: the listener was called ~40,000 times a second.
TEST_F(OrderedOutboxTest, HugeDeferralWaitsInsteadOfSpinning) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("Step"), [&](const EventEnvelope&) {
    ++calls;
    throw RetryLater(std::chrono::milliseconds::max(), "come back much later", false);
  });
  auto ob = Outbox::ordered(options());
  ob.start();
  commit_one(ob, "Step");
  ASSERT_TRUE(wait_until([&] {
    ob.poller()->poll();
    return calls.load() >= 1;
  }));
  ob.close();  // ends the wait at once
  EXPECT_EQ(calls.load(), 1);
  EXPECT_EQ(count(EventStatus::New), 1);  // still pending, first in line after a restart
}

// Issue 9 item 9: a DONE mark that failed left the head event NEW while the events behind it
// (already queued, or read past by a keyset page) went on: A1, A2, A3, A1. Now the queue is
// dropped and read again from the head: A1 (twice, at least once), A2, A3.
TEST_F(OrderedOutboxTest, FailedStatusWriteDoesNotLetLaterEventsOvertake) {
  std::mutex m;
  std::vector<std::string> seen;
  listeners->register_listener(EventType::of("Step"), [&](const EventEnvelope& e) {
    std::lock_guard lock(m);
    seen.push_back(std::string(e.payload_json()));
  });
  auto o = options();
  std::string first;
  {
    // Written before the outbox starts, so one poll reads all three.
    auto t = tx->begin();
    for (int i = 1; i <= 3; ++i) {
      auto e = EventEnvelope::builder(EventType::of("Step"))
                   .aggregate_id("A")
                   .payload_json("\"" + std::to_string(i) + "\"")
                   .build();
      if (i == 1) {
        first = e.event_id();
      }
      store->insert_new(t.connection(), e);
    }
    t.commit();
  }
  o.store = std::make_shared<testing::FailingDoneStore>(store, first);
  auto ob = Outbox::ordered(o);
  ob.start();
  ASSERT_TRUE(wait_until([&] {
    ob.poller()->poll();
    return count(EventStatus::Done) == 3;
  }));
  ob.close();
  EXPECT_EQ(seen, (std::vector<std::string>{"\"1\"", "\"1\"", "\"2\"", "\"3\""}));
}

}  // namespace
}  // namespace outbox
