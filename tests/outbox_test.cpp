// The Outbox composite end to end on a real SQLite file, including four acceptance tests:
// atomicity, the hot path, the downgrade to the poller, and retries up to DEAD.

#include "outbox/outbox.hpp"

#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "outbox/dead_event_manager.hpp"
#include "outbox/dispatcher.hpp"
#include "outbox/errors.hpp"
#include "outbox/metrics.hpp"
#include "outbox/purge.hpp"
#include "outbox/retry_policy.hpp"
#include "tests/support/failing_store.hpp"
#include "tests/support/sqlite_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::Gate;
using testing::wait_until;

class OutboxTest : public testing::SqliteFixture {
 protected:
  Outbox::Options options() {
    return {.connection_provider = pool,
            .tx_context = tx_context,
            .store = store,
            .listeners = listeners,
            .metrics = metrics,
            .dispatcher = {.retry_policy =
                               std::make_shared<ExponentialBackoffRetryPolicy>(1ms, 1ms, false)},
            // tests drive the poller with poll() unless they say otherwise
            .poller = {.interval = 1h}};
  }
  // Writes one event in its own committed transaction; returns the id.
  std::string commit_one(Outbox& ob, const std::string& type, const std::string& payload = "{}") {
    auto t = tx->begin();
    auto id = ob.writer().write(EventType::of(type), payload);
    t.commit();
    return *id;
  }

  std::shared_ptr<InMemoryMetrics> metrics = std::make_shared<InMemoryMetrics>();
};

// Acceptance 1: a rolled-back transaction leaves no row and delivers nothing.
TEST_F(OutboxTest, AcceptanceAtomicity) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("OrderPlaced"), [&](const auto&) { ++calls; });
  auto ob = Outbox::single_node(options());
  ob.start();
  std::string id;
  {
    auto t = tx->begin();
    t.connection().execute("CREATE TABLE orders (id TEXT)");
    t.connection().execute("INSERT INTO orders VALUES ('o1')");
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

TEST_F(OutboxTest, WriterRequiresATransactionAndHonoursHooks) {
  listeners->register_listener(EventType::of("E"), [](const auto&) {});
  auto ob = Outbox::single_node(options());
  ob.start();
  EXPECT_THROW(ob.writer().write(EventType::of("E"), "{}"), std::logic_error);
  EXPECT_THROW(OutboxWriter(nullptr, store), std::invalid_argument);

  struct Suppress : WriterHook {
    std::vector<EventEnvelope> before_write(std::vector<EventEnvelope> events) override {
      std::erase_if(events, [](const auto& e) { return e.event_type() == "Secret"; });
      return events;
    }
    void after_commit(const std::vector<EventEnvelope>& events) override {
      ++commits;
      seen += static_cast<int>(events.size());
      throw std::runtime_error("hook failure must not propagate");
    }
    void after_rollback(const std::vector<EventEnvelope>&) override { ++rollbacks; }
    std::atomic<int> commits{0}, rollbacks{0}, seen{0};
  };
  auto hook = std::make_shared<Suppress>();
  OutboxWriter w(tx_context, store, hook);
  {
    auto t = tx->begin();
    EXPECT_FALSE(w.write(EventType::of("Secret"), "{}"));
    auto ids = w.write_all({EventEnvelope::of_json(EventType::of("E"), "{}"),
                            EventEnvelope::of_json(EventType::of("Secret"), "{}"),
                            EventEnvelope::of_json(EventType::of("E"), "{}")});
    EXPECT_EQ(ids.size(), 2u);
    t.commit();
  }
  EXPECT_EQ(hook->commits.load(), 1);  // one callback per write_all batch; suppressed write: none
  EXPECT_EQ(hook->seen.load(), 2);
  {
    auto t = tx->begin();
    w.write(EventType::of("E"), "{}");
  }
  EXPECT_EQ(hook->rollbacks.load(), 1);
  EXPECT_EQ(count(EventStatus::New), 2);
}

TEST_F(OutboxTest, WriteAllUsesOneTransactionAndOneHotEnqueuePerEvent) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("E"), [&](const auto&) { ++calls; });
  auto ob = Outbox::single_node(options());
  ob.start();
  std::vector<EventEnvelope> batch;
  for (int i = 0; i < 25; ++i) {
    batch.push_back(EventEnvelope::of_json(EventType::of("E"), "{}"));
  }
  {
    auto t = tx->begin();
    EXPECT_EQ(ob.writer().write_all(batch).size(), 25u);
    t.commit();
  }
  ASSERT_TRUE(wait_until([&] { return count(EventStatus::Done) == 25; }));
  ob.close();
  EXPECT_EQ(calls.load(), 25);
}

TEST_F(OutboxTest, NoDuplicateDeliveryWhileThePollerRacesTheHotPath) {
  std::mutex m;
  std::map<std::string, int> deliveries;
  listeners->register_listener(EventType::of("E"), [&](const EventEnvelope& e) {
    std::lock_guard lock(m);
    ++deliveries[e.event_id()];
  });
  auto o = options();
  o.poller.interval = 1ms;  // poll constantly so it reads rows the hot path is delivering
  o.dispatcher.hot_queue_capacity = 16;  // force some events onto the cold path too
  auto ob = Outbox::single_node(o);
  ob.start();
  constexpr int kThreads = 4;
  constexpr int kPerThread = 300;
  std::vector<std::thread> writers;
  for (int t = 0; t < kThreads; ++t) {
    writers.emplace_back([&] {
      for (int i = 0; i < kPerThread; ++i) {
        commit_one(ob, "E");
      }
    });
  }
  for (auto& w : writers) {
    w.join();
  }
  ASSERT_TRUE(wait_until([&] { return count(EventStatus::Done) == kThreads * kPerThread; }, 120s));
  ob.close();
  std::lock_guard lock(m);
  EXPECT_EQ(deliveries.size(), static_cast<std::size_t>(kThreads * kPerThread));
  int duplicates = 0;
  for (const auto& [id, n] : deliveries) {
    duplicates += n - 1;
  }
  EXPECT_EQ(duplicates, 0);
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

TEST_F(OutboxTest, OrderedModeDeliversInInsertionOrderAndFailsStraightToDead) {
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
TEST_F(OutboxTest, OrderedModeDeferralHoldsLaterEventsBack) {
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
TEST_F(OutboxTest, OrderedModeHugeDeferralWaitsInsteadOfSpinning) {
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
TEST_F(OutboxTest, OrderedModeFailedStatusWriteDoesNotLetLaterEventsOvertake) {
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

// Issue 9 item 3: an age-based purger deletes rows whatever their status, so in a delivering mode
// an event delayed past the retention was deleted before it was ever delivered.
TEST_F(OutboxTest, AgeBasedPurgerIsRefusedWhereEventsAreDelivered) {
  auto o = options();
  o.purge.purger = std::make_shared<sqlite::SqliteAgeBasedPurger>();
  EXPECT_THROW(Outbox::single_node(o), std::invalid_argument);
  EXPECT_THROW(Outbox::ordered(o), std::invalid_argument);
  o.claim_locking = ClaimLocking{"n", 1000ms};
  EXPECT_THROW(Outbox::multi_node(o), std::invalid_argument);
  EXPECT_NO_THROW(Outbox::writer_only(o));
  o.purge.purger = std::make_shared<sqlite::SqliteEventPurger>();
  EXPECT_NO_THROW(Outbox::multi_node(o));
}

TEST_F(OutboxTest, RequiredFieldsAreChecked) {
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
        o.purge.purger = std::make_shared<sqlite::SqliteAgeBasedPurger>();
      },
      &Outbox::writer_only);
  (void)this;
}

TEST_F(OutboxTest, WriterOnlyPurgesByAge) {
  auto o = options();
  o.listeners = nullptr;
  o.purge.purger = std::make_shared<sqlite::SqliteAgeBasedPurger>();
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

TEST_F(OutboxTest, PurgeSchedulerDeletesTerminalRowsInBatches) {
  auto clock = std::make_shared<testing::ManualClock>();
  auto conn = pool->acquire();
  for (int i = 0; i < 12; ++i) {
    auto id = "p" + std::to_string(i);
    store->insert_new(*conn, EventEnvelope::builder(EventType::of("E"))
                                 .event_id(id)
                                 .occurred_at(clock->now() - 10 * 24h)
                                 .payload_json("{}")
                                 .build());
    if (i < 10) {
      store->mark_done(*conn, id, clock->now() - 8 * 24h);
    }
  }
  OutboxPurgeScheduler s({.connection_provider = pool,
                          .purger = std::make_shared<sqlite::SqliteEventPurger>(),
                          .batch_size = 3,
                          .clock = clock});
  EXPECT_EQ(s.run_once(), 10);
  EXPECT_EQ(count(EventStatus::New), 2);
  s.close();
  EXPECT_THROW(s.start(), std::logic_error);
  EXPECT_THROW(OutboxPurgeScheduler({.connection_provider = pool}), std::invalid_argument);
  // 999999 days once wrapped to a cutoff in the future: every DONE and DEAD row purged.
  const auto purger = std::make_shared<sqlite::SqliteEventPurger>();
  EXPECT_THROW(OutboxPurgeScheduler({.connection_provider = pool,
                                     .purger = purger,
                                     .retention = std::chrono::hours(24 * 999999)}),
               std::invalid_argument);
  EXPECT_THROW(OutboxPurgeScheduler({.connection_provider = pool,
                                     .purger = purger,
                                     .interval = std::chrono::hours(24 * 999999)}),
               std::invalid_argument);
  // Found breaking the fix: seconds this large overflowed the comparison in milliseconds.
  EXPECT_THROW(OutboxPurgeScheduler({.connection_provider = pool,
                                     .purger = purger,
                                     .retention = std::chrono::seconds(9223372036854776)}),
               std::invalid_argument);
}

TEST_F(OutboxTest, DeadEventManagerQueriesAndReplays) {
  auto conn = pool->acquire();
  for (int i = 0; i < 5; ++i) {
    auto e = EventEnvelope::builder(EventType::of(i < 3 ? "A" : "B"))
                 .event_id("x" + std::to_string(i))
                 .payload_json("{}")
                 .build();
    store->insert_new(*conn, e);
    store->mark_dead(*conn, e.event_id(), std::chrono::system_clock::now(), "boom");
  }
  DeadEventManager dead(pool, store);
  EXPECT_EQ(dead.count(), 5);
  EXPECT_EQ(dead.count("A"), 3);
  EXPECT_EQ(dead.query("B", std::nullopt, 10).size(), 2u);
  EXPECT_TRUE(dead.replay("x4"));
  EXPECT_FALSE(dead.replay("x4"));
  const auto capped = dead.replay_all("A", std::nullopt, 2);
  EXPECT_EQ(capped.replayed, 2);
  EXPECT_TRUE(capped.more);
  const auto rest = dead.replay_all("A", std::nullopt);
  EXPECT_EQ(rest.replayed, 1);
  EXPECT_FALSE(rest.more);
  EXPECT_EQ(dead.count(), 1);
  EXPECT_EQ(count(EventStatus::New), 4);

  // A database error is thrown, not reported as "nothing DEAD".
  DeadEventManager broken(pool, std::make_shared<sqlite::SqliteOutboxStore>(
                                    sqlite::SqliteOutboxStore::Options{.table = "missing"}));
  EXPECT_THROW(broken.count(), StoreError);
  EXPECT_THROW(broken.query(std::nullopt, std::nullopt, 10), StoreError);
  EXPECT_THROW(broken.replay("x0"), StoreError);
  EXPECT_THROW(broken.replay_all(std::nullopt, std::nullopt), StoreError);
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

// Every process thread, counted from /proc: what "starts no thread" means.
std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

TEST_F(OutboxTest, NothingRunsBeforeStartAndWrittenEventsWaitForIt) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("E"), [&](const auto&) { ++calls; });
  auto o = options();
  o.poller.interval = 20ms;
  o.purge.purger = std::make_shared<sqlite::SqliteEventPurger>();
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

TEST_F(OutboxTest, ClosingBeforeStartLeavesWrittenEventsInTheTable) {
  auto ob = Outbox::single_node(options());
  const auto id = commit_one(ob, "E");
  ob.close();
  EXPECT_EQ(status(id), EventStatus::New);
}

TEST_F(OutboxTest, ATransactionThatOutlivesItsOutboxCommitsWithoutIt) {
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
