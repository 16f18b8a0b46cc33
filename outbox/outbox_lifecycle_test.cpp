// The Outbox's rules of construction and lifetime, on the in-memory outbox: what the factories
// refuse, no thread before start(), and a transaction that outlives its Outbox.

#include <gtest/gtest.h>

#include "outbox/outbox.hpp"
#include "tests/support/memory_fixture.hpp"
#include "tests/support/outbox_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::Gate;
using testing::thread_count;
using testing::wait_until;

class OutboxLifecycleTest : public testing::OutboxFixture<testing::MemoryFixture> {};

// Issue 9 item 3: an age-based purger deletes rows whatever their status, so in a delivering mode
// an event delayed past the retention was deleted before it was ever delivered.
TEST_F(OutboxLifecycleTest, AgeBasedPurgerIsRefusedWhereEventsAreDelivered) {
  auto o = options();
  o.purge.purger = std::make_shared<testing::InMemoryAgeBasedPurger>();
  EXPECT_THROW(Outbox::single_node(o), std::invalid_argument);
  EXPECT_THROW(Outbox::ordered(o), std::invalid_argument);
  o.claim_locking = ClaimLocking{"n", 1000ms};
  EXPECT_THROW(Outbox::multi_node(o), std::invalid_argument);
  EXPECT_NO_THROW(Outbox::writer_only(o));
  o.purge.purger = std::make_shared<testing::InMemoryEventPurger>();
  EXPECT_NO_THROW(Outbox::multi_node(o));
}

TEST_F(OutboxLifecycleTest, RequiredFieldsAreChecked) {
  auto bad = [&](auto mutate, auto factory) {
    auto o = options();
    mutate(o);
    EXPECT_THROW(factory(std::move(o)), std::invalid_argument);
  };
  bad([](auto& o) { o.tx_context = nullptr; }, &Outbox::single_node);
  bad([](auto& o) { o.store = nullptr; }, &Outbox::single_node);
  bad([](auto& o) { o.connection_provider = nullptr; }, &Outbox::single_node);
  bad([](auto& o) { o.listeners = nullptr; }, &Outbox::ordered);
  bad([](auto& o) { o.dispatcher.worker_count = 0; }, &Outbox::single_node);
  // A collaborator Outbox passes to its components is set once, at the top: a second copy in a
  // component's options would silently lose to it.
  bad([this](auto& o) { o.dispatcher.store = store; }, &Outbox::single_node);
  bad([this](auto& o) { o.poller.metrics = metrics; }, &Outbox::single_node);
  bad([](auto& o) { o.poller.claim_locking = ClaimLocking{"n", 1000ms}; }, &Outbox::single_node);
  bad([](auto& o) { o.dispatcher.ordered = true; }, &Outbox::single_node);
  bad([](auto& o) { o.purge.clock = Clock::system(); }, &Outbox::writer_only);
  bad(
      [this](auto& o) {
        o.connection_provider = nullptr;
        o.purge.purger = std::make_shared<testing::InMemoryAgeBasedPurger>();
      },
      &Outbox::writer_only);
  // Found breaking the nesting: ordered() forced these to 1 (0 ms) before they were checked, so
  // a typo was silently accepted.
  bad([](auto& o) { o.dispatcher.worker_count = 0; }, &Outbox::ordered);
  bad([](auto& o) { o.dispatcher.max_attempts = -7; }, &Outbox::ordered);
  bad([](auto& o) { o.dispatcher.max_batch_size = 0; }, &Outbox::ordered);
  bad([](auto& o) { o.poller.head_rescan_interval = -1ms; }, &Outbox::ordered);
  bad([](auto& o) { o.claim_locking = ClaimLocking{"n", 0ms}; }, &Outbox::multi_node);
  // A lease needs single_node or ordered, a manager and a store fenced on it.
  bad([](auto& o) { o.lease = Outbox::Lease{}; }, &Outbox::single_node);
  (void)this;
}

// Found breaking the nesting: a multi_node factory that threw after building its claim release
// (a bad purge setting) released, while being destroyed, the claims of every Outbox of the same
// owner, so an event one of them was delivering went to another node as well.
TEST_F(OutboxLifecycleTest, AFactoryThatThrowsReleasesNoClaims) {
  Gate gate;
  std::atomic<bool> running{false};
  listeners->register_listener(EventType::of("E"), [&](const auto&) {
    running = true;
    gate.wait();
  });
  auto o = options();
  o.claim_locking = ClaimLocking{"node-1", 60000ms};
  auto a = Outbox::multi_node(o);
  a.start();
  const auto id = commit_one(a, "E");
  ASSERT_TRUE(wait_until([&] { return running.load(); }));
  auto broken = o;
  broken.purge.purger = std::make_shared<testing::InMemoryEventPurger>();
  broken.purge.batch_size = 0;
  EXPECT_THROW(Outbox::multi_node(broken), std::invalid_argument);
  EXPECT_EQ(row(id)->locked_by, "node-1");  // still node-1's, while it delivers
  gate.open();
  ASSERT_TRUE(wait_status(id, EventStatus::Done));
}

TEST_F(OutboxLifecycleTest, WriterOnlyPurgesByAge) {
  auto o = options();
  o.listeners = nullptr;
  o.purge.purger = std::make_shared<testing::InMemoryAgeBasedPurger>();
  o.purge.retention = 0s;
  o.purge.interval = 1h;
  {
    auto w = Outbox::writer_only(options());
    commit_one(w, "E");
    commit_one(w, "E");
  }
  EXPECT_EQ(count(EventStatus::New), 2);
  auto ob = Outbox::writer_only(o);
  ob.start();  // the purge schedule runs once at start
  ASSERT_TRUE(wait_until([&] { return count(EventStatus::New) == 0; }));
  ob.close();
}

TEST_F(OutboxLifecycleTest, NothingRunsBeforeStartAndWrittenEventsWaitForIt) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("E"), [&](const auto&) { ++calls; });
  auto o = options();
  o.poller.interval = 20ms;
  o.purge.purger = std::make_shared<testing::InMemoryEventPurger>();
  const auto before = thread_count();
  auto ob = Outbox::single_node(o);
  EXPECT_EQ(thread_count(), before);    // no worker, flusher, poller or purge thread yet
  const auto id = commit_one(ob, "E");  // queued on the hot path, nobody to run it
  EXPECT_EQ(thread_count(), before);
  EXPECT_EQ(ob.poller()->completed_cycles(), 0u);
  EXPECT_EQ(calls.load(), 0);
  ob.start();
  EXPECT_GT(thread_count(), before);
  ASSERT_TRUE(wait_until([&] { return status(id) == EventStatus::Done; }));
  EXPECT_EQ(calls.load(), 1);
  ob.start();  // idempotent
  ob.close();
  EXPECT_THROW(ob.start(), std::logic_error);
}

TEST_F(OutboxLifecycleTest, ClosingBeforeStartLeavesWrittenEventsInTheTable) {
  auto ob = Outbox::single_node(options());
  const auto id = commit_one(ob, "E");
  ob.close();
  EXPECT_EQ(status(id), EventStatus::New);
}

TEST_F(OutboxLifecycleTest, ATransactionThatOutlivesItsOutboxCommitsWithoutIt) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("E"), [&](const auto&) { ++calls; });
  std::string id;
  {
    auto t = tx->begin();
    {
      auto ob = Outbox::single_node(options());
      ob.start();
      id = *ob.writer().write(EventType::of("E"), "{}");
    }  // the Outbox, its dispatcher and its writer are gone; the transaction holds the hook
    t.commit();  // the hook finds no dispatcher: the row waits for the next process
  }
  EXPECT_EQ(status(id), EventStatus::New);
  EXPECT_EQ(calls.load(), 0);
  auto next = Outbox::single_node(options());
  next.start();
  next.poller()->poll();
  ASSERT_TRUE(wait_until([&] { return status(id) == EventStatus::Done; }));
  EXPECT_EQ(calls.load(), 1);
}

}  // namespace
}  // namespace outbox
