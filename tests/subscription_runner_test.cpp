// Subscriptions running on every engine: fan-out by tags over concurrent writers checked against
// a ledger of the table, a failing publisher that keeps the cursor and ends FAILED, pause by plain
// SQL, rewind, an unhealthy publisher, a row that cannot be decoded, and two processes sharing the
// subscriptions through their leases.

#include <gtest/gtest.h>

#include <future>
#include <mutex>

#include "outbox/lease_manager.hpp"
#include "outbox/log.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/subscription.hpp"
#include "outbox/transaction.hpp"
#include "outbox/writer.hpp"
#include "tests/support/stream_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::StreamFixture;
using testing::wait_until;

// Records what it is given, in order; fails or reports unhealthy on demand.
class Recorder final : public Publisher {
 public:
  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override {
    std::lock_guard lock(mutex_);
    ++calls_;
    std::vector<PublishResult> out;
    for (const auto& r : batch) {
      if (failing) {
        out.push_back(PublishResult::retriable("endpoint down"));
        continue;
      }
      ids_.push_back(r.event->event_id());
      targets_.push_back(r.target);
      out.push_back(PublishResult::ok());
    }
    return out;
  }
  bool is_healthy() noexcept override { return healthy; }
  std::vector<std::string> ids() const {
    std::lock_guard lock(mutex_);
    return ids_;
  }
  std::string target(std::size_t i) const {
    std::lock_guard lock(mutex_);
    return targets_.at(i);
  }
  int calls() const {
    std::lock_guard lock(mutex_);
    return calls_;
  }
  std::atomic<bool> failing{false};
  std::atomic<bool> healthy{true};

 private:
  mutable std::mutex mutex_;
  std::vector<std::string> ids_;
  std::vector<std::string> targets_;
  int calls_ = 0;
};

SubscriptionRunner::Schedule fast() {
  return {.poll_interval = 5ms,
          .batch_size = 500,
          .backoff_max = 20ms,
          .max_errors = 3,
          .retry_base = 1ms,
          .retry_max = 5ms};
}

class SubscriptionRunnerTest : public StreamFixture {
 protected:
  // Started, with one subscription ("sleepy") that polls hourly: only a wake-up makes it read
  // sooner. Owned by the fixture.
  SubscriptionRunner* hourly(std::shared_ptr<Recorder> rec) {
    hourly_ = std::make_unique<SubscriptionRunner>(SubscriptionRunner::Options{
        .connection_provider = pool_,
        .store = stream_,
        .subscriptions = {{.spec = {"sleepy", {}, "log", ""},
                           .publisher = std::move(rec),
                           .schedule = {.poll_interval = std::chrono::hours(1)}}},
        .sequencer_interval = std::chrono::hours(1)});
    hourly_->start();
    return hourly_.get();
  }
  // Commits one event through a writer whose hook wakes `runner`, as an application would.
  void commit_woken(SubscriptionRunner& runner) {
    auto context = std::make_shared<ThreadLocalTxContext>();
    TransactionManager tx(pool_, context);
    OutboxWriter writer(context, store_, runner.writer_hook());
    auto t = tx.begin();
    writer.write(EventEnvelope::of_json(EventType::of("Woken"), "{}"));
    t.commit();
  }
  std::unique_ptr<SubscriptionRunner> runner(
      std::vector<std::pair<SubscriptionSpec, std::shared_ptr<Recorder>>> subs,
      std::shared_ptr<LeaseManager> leases = {}) {
    SubscriptionRunner::Options o{.connection_provider = pool_, .store = stream_};
    for (auto& [spec, publisher] : subs) {
      o.subscriptions.push_back({.spec = spec, .publisher = publisher, .schedule = fast()});
    }
    o.leases = std::move(leases);
    o.sequencer_interval = 5ms;
    auto r = std::make_unique<SubscriptionRunner>(std::move(o));
    r->start();
    return r;
  }
  void write(const std::string& id, Tags tags = {}, const std::string& type = "Thing") {
    auto conn = pool_->acquire();
    store_->insert_new(*conn, EventEnvelope::builder(EventType::of(type))
                                  .event_id(id)
                                  .tags(tags)
                                  .payload_json("{}")
                                  .build());
  }
  // A lease manager of one process on this table; started unless told otherwise.
  std::shared_ptr<LeaseManager> lease_manager(const std::string& owner,
                                              std::chrono::milliseconds ttl = 2s,
                                              std::chrono::milliseconds renew = 300ms,
                                              bool start = true) {
    auto m = std::make_shared<LeaseManager>(LeaseManager::Options{.connection_provider = pool_,
                                                                  .store = leases_,
                                                                  .owner = owner,
                                                                  .ttl = ttl,
                                                                  .renew_interval = renew});
    if (start) {
      m->start();
    }
    return m;
  }
  StreamPosition cursor(const std::string& name) {
    return stream_->find(*pool_->acquire(), name)->cursor;
  }
  // At the head, and no row of the table beyond it: on PostgreSQL the readable end stops at the
  // oldest transaction open on the server (another test's), so cursor == head alone can hold
  // before this test's last row is readable, let alone delivered.
  bool caught_up(const std::string& name) {
    sequence();
    auto conn = pool_->acquire();
    if (engine_is("postgres") &&
        conn->query("SELECT COUNT(*) FROM " + table_ +
                    " WHERE stream_xid >= pg_snapshot_xmin(pg_current_snapshot())")[0]
                .get_int(0) > 0) {
      return false;
    }
    return stream_->find(*conn, name)->cursor == stream_->head(*conn);
  }

  std::unique_ptr<SubscriptionRunner> hourly_;
};

TEST_P(SubscriptionRunnerTest, FansOutByTagsToEachSubscriptionInStreamOrderAgainstALedger) {
  constexpr int kWriters = 4;
  constexpr int kPerWriter = 12500;  // 50,000 events
  const std::vector<SubscriptionSpec> specs = {
      {"wallets", {.required_tags = {"wallet_id"}}, "a", "wallets"},
      {"payments", {.any_of_tags = {"payment_id", "transfer_id=t-1"}}, "b", "payments"},
      {"orders", {.event_types = {"Order*"}}, "c", "orders"}};
  std::vector<std::shared_ptr<Recorder>> recorders;
  std::vector<std::pair<SubscriptionSpec, std::shared_ptr<Recorder>>> subs;
  for (const auto& s : specs) {
    recorders.push_back(std::make_shared<Recorder>());
    subs.emplace_back(s, recorders.back());
  }
  auto r = runner(subs);
  std::vector<std::future<void>> writers;
  for (int w = 0; w < kWriters; ++w) {
    writers.push_back(std::async(std::launch::async, [&, w] {
      auto conn = pool_->acquire();
      std::vector<EventEnvelope> batch;
      for (int i = 0; i < kPerWriter; ++i) {
        auto b = EventEnvelope::builder(EventType::of(i % 3 == 0 ? "OrderPlaced" : "Moved"))
                     .event_id("w" + std::to_string(w) + "-" + std::to_string(i))
                     .payload_json("{}");
        if (i % 2 == 0) {
          b.tag("wallet_id", "w" + std::to_string(i % 7));
        }
        if (i % 5 == 0) {
          b.tag("payment_id", "p");
        } else if (i % 5 == 1) {
          b.tag("transfer_id", i % 10 == 1 ? "t-1" : "t-2");
        }
        batch.push_back(b.build());
        if (batch.size() == 250) {
          conn->begin();
          store_->insert_batch(*conn, batch);
          conn->commit();
          batch.clear();
        }
      }
    }));
  }
  for (auto& w : writers) {
    w.get();
  }
  for (const auto& s : specs) {
    ASSERT_TRUE(wait_until([&] { return caught_up(s.name); }, 120s)) << s.name;
  }
  // The ledger: the table in stream order, filtered as each subscription filters.
  StreamPosition from;
  const auto all = read_all(from, 1000, static_cast<std::size_t>(kWriters * kPerWriter));
  ASSERT_EQ(all.size(), static_cast<std::size_t>(kWriters * kPerWriter));
  for (std::size_t k = 0; k < specs.size(); ++k) {
    std::vector<std::string> expected;
    for (const auto& e : all) {
      if (specs[k].filter.matches(to_envelope(e.row, JsonCodec::default_codec()))) {
        expected.push_back(e.row.event_id);
      }
    }
    EXPECT_GT(expected.size(), 0u);
    const auto got = recorders[k]->ids();
    EXPECT_EQ(got.size(), expected.size()) << specs[k].name;
    EXPECT_TRUE(got == expected) << specs[k].name << ": not exactly its events in stream order";
    EXPECT_EQ(stream_->find(*pool_->acquire(), specs[k].name)->delivered,
              static_cast<std::int64_t>(expected.size()));
    EXPECT_EQ(recorders[k]->target(0), specs[k].target);
  }
}

TEST_P(SubscriptionRunnerTest, AFailingPublisherKeepsTheCursorAndEndsFailedUntilReset) {
  auto rec = std::make_shared<Recorder>();
  rec->failing = true;
  write("e1");
  write("e2");
  auto r = runner({{{"hook", {}, "http", "url"}, rec}});
  ASSERT_TRUE(wait_until([&] {
    return stream_->find(*pool_->acquire(), "hook")->status == SubscriptionStatus::Failed;
  }));
  auto st = stream_->find(*pool_->acquire(), "hook");
  EXPECT_EQ(st->cursor, StreamPosition{});
  EXPECT_EQ(st->error_count, 3);
  ASSERT_TRUE(st->last_error);
  EXPECT_NE(st->last_error->find("endpoint down"), std::string::npos);
  const int calls = rec->calls();
  EXPECT_EQ(calls, 3);
  rec->failing = false;
  ASSERT_TRUE(stream_->set_status(*pool_->acquire(), "hook", SubscriptionStatus::Active,
                                  {SubscriptionStatus::Failed}));
  ASSERT_TRUE(wait_until([&] { return caught_up("hook"); }));
  EXPECT_EQ(rec->ids(), (std::vector<std::string>{"e1", "e2"}));
}

// The cursor write fails after a batch was published (a full disk, a server going away; here a
// trigger refuses the UPDATE): the retries save that cursor move first and publish nothing again,
// however many polls the outage lasts.
TEST_P(SubscriptionRunnerTest, ABatchWhoseCursorWriteFailedIsNotPublishedAgainAtEachRetry) {
  const std::string flag = table_ + "_fail";
  const std::string subscriptions = table_ + "_subscription";
  {
    auto conn = pool_->acquire();
    conn->execute("CREATE TABLE " + flag + " (x INTEGER)");
    conn->execute("INSERT INTO " + flag + " VALUES (1)");
    const std::string failing = "EXISTS (SELECT 1 FROM " + flag + ")";
    if (engine_is("sqlite")) {
      conn->execute("CREATE TRIGGER " + flag + " BEFORE UPDATE ON " + subscriptions + " WHEN " +
                    failing + " BEGIN SELECT RAISE(ABORT, 'no space left on device'); END");
    } else if (engine_is("postgres")) {
      conn->execute("CREATE FUNCTION " + flag + "() RETURNS trigger AS $$ BEGIN IF " + failing +
                    " THEN RAISE EXCEPTION 'no space left on device'; END IF; RETURN NEW; END $$ "
                    "LANGUAGE plpgsql");
      conn->execute("CREATE TRIGGER " + flag + " BEFORE UPDATE ON " + subscriptions +
                    " FOR EACH ROW EXECUTE FUNCTION " + flag + "()");
    } else {
      conn->execute("CREATE TRIGGER " + flag + " BEFORE UPDATE ON " + subscriptions +
                    " FOR EACH ROW BEGIN IF " + failing +
                    " THEN SIGNAL SQLSTATE '45000' SET MESSAGE_TEXT = 'no space left on device'; "
                    "END IF; END");
    }
  }
  std::vector<std::string> ids;
  for (int i = 0; i < 20; ++i) {
    ids.push_back("e" + std::to_string(i));
    write(ids.back());
  }
  std::atomic<int> failed_saves{0};
  set_log_sink([&](LogLevel, std::string_view message) {
    if (message.find("outage") != std::string_view::npos &&
        message.find("no space left on device") != std::string_view::npos) {
      ++failed_saves;
    }
  });
  auto rec = std::make_shared<Recorder>();
  auto r = runner({{{"outage", {}, "log", ""}, rec}});
  // Several polls meet the failing write after the batch went out.
  const bool retried = wait_until([&] { return failed_saves >= 5; });
  pool_->acquire()->execute("DELETE FROM " + flag);
  set_log_sink({});
  ASSERT_TRUE(retried);
  ASSERT_TRUE(wait_until([&] { return caught_up("outage"); }));
  r.reset();
  EXPECT_EQ(rec->ids(), ids);
  EXPECT_EQ(rec->calls(), 1);
  EXPECT_EQ(stream_->find(*pool_->acquire(), "outage")->delivered, 20);
}

TEST_P(SubscriptionRunnerTest, PausedByPlainSqlItStopsAndResumedItGoesOn) {
  auto rec = std::make_shared<Recorder>();
  auto witness = std::make_shared<Recorder>();
  auto r = runner({{{"audit", {}, "log", ""}, rec}, {{"witness", {}, "log", ""}, witness}});
  write("before");
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 1; }));
  pool_->acquire()->execute("UPDATE " + sql::subscription_table_name(table_) +
                            " SET status = 'PAUSED' WHERE name = 'audit'");
  ASSERT_TRUE(wait_until([&] { return r->views()[0].waiting == "paused"; }));
  const int calls = rec->calls();
  write("while-paused");
  // The active witness on the same schedule delivers it; the paused one does not.
  ASSERT_TRUE(wait_until([&] { return witness->ids().size() == 2; }));
  ASSERT_TRUE(wait_until([&] { return caught_up("witness"); }));
  EXPECT_EQ(r->views()[0].waiting, "paused");
  EXPECT_EQ(rec->calls(), calls);
  EXPECT_EQ(rec->ids().size(), 1u);
  pool_->acquire()->execute("UPDATE " + sql::subscription_table_name(table_) +
                            " SET status = 'ACTIVE' WHERE name = 'audit'");
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 2; }));
  EXPECT_EQ(rec->ids().back(), "while-paused");
}

TEST_P(SubscriptionRunnerTest, RewindRedeliversFromTheNewCursor) {
  auto rec = std::make_shared<Recorder>();
  for (int i = 0; i < 5; ++i) {
    write("r" + std::to_string(i));
  }
  auto r = runner({{{"replay", {}, "log", ""}, rec}});
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 5; }));
  StreamPosition from;
  const auto all = read_all(from);
  ASSERT_TRUE(stream_->rewind(*pool_->acquire(), "replay", all[2].position));
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 7; }));
  const auto ids = rec->ids();
  EXPECT_EQ(ids[5], "r3");
  EXPECT_EQ(ids[6], "r4");
}

TEST_P(SubscriptionRunnerTest, AnUnhealthyPublisherIsNotCalledAndTheReasonIsShown) {
  auto rec = std::make_shared<Recorder>();
  rec->healthy = false;
  write("x");
  auto r = runner({{{"kafka", {}, "kafka", "t"}, rec}});
  ASSERT_TRUE(
      wait_until([&] { return r->views()[0].waiting.find("not healthy") != std::string::npos; }));
  EXPECT_EQ(rec->calls(), 0);
  rec->healthy = true;
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 1; }));
}

TEST_P(SubscriptionRunnerTest, ARowThatCannotBeDecodedStopsItThereUntilTheCursorPassesIt) {
  auto rec = std::make_shared<Recorder>();
  write("good-1");
  write("bad");
  write("good-2");
  pool_->acquire()->execute("UPDATE " + table_ +
                            " SET tags = " + (engine_is("postgres") ? "'[1]'::jsonb" : "'[1]'") +
                            " WHERE event_id = 'bad'");
  auto r = runner({{{"strict", {}, "log", ""}, rec}});
  ASSERT_TRUE(wait_until([&] {
    return stream_->find(*pool_->acquire(), "strict")->status == SubscriptionStatus::Failed;
  }));
  EXPECT_EQ(rec->ids(), (std::vector<std::string>{"good-1"}));
  const auto st = stream_->find(*pool_->acquire(), "strict");
  ASSERT_TRUE(st->last_error);
  EXPECT_NE(st->last_error->find("event bad at "), std::string::npos) << *st->last_error;
  // The operator skips it: rewind to the bad row's position (its own), then reset.
  StreamPosition from;
  const auto all = read_all(from);
  ASSERT_TRUE(stream_->rewind(*pool_->acquire(), "strict", all[1].position));
  ASSERT_TRUE(stream_->set_status(*pool_->acquire(), "strict", SubscriptionStatus::Active,
                                  {SubscriptionStatus::Failed}));
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 2; }));
  EXPECT_EQ(rec->ids().back(), "good-2");
}

TEST_P(SubscriptionRunnerTest, TwoProcessesShareTheSubscriptionsAndOneTakesOverFromTheOther) {
  std::vector<std::pair<SubscriptionSpec, std::shared_ptr<Recorder>>> a_subs, b_subs;
  for (int i = 0; i < 4; ++i) {
    const SubscriptionSpec spec{"s" + std::to_string(i), {}, "log", ""};
    a_subs.emplace_back(spec, std::make_shared<Recorder>());
    b_subs.emplace_back(spec, std::make_shared<Recorder>());
  }
  auto a_leases = lease_manager("node-a");
  auto b_leases = lease_manager("node-b");
  auto a = runner(a_subs, a_leases);
  auto b = runner(b_subs, b_leases);
  auto held = [](SubscriptionRunner& r) {
    int n = 0;
    for (const auto& v : r.views()) {
      n += v.running_here ? 1 : 0;
    }
    return n;
  };
  ASSERT_TRUE(wait_until([&] { return held(*a) == 2 && held(*b) == 2; }))
      << held(*a) << " + " << held(*b);
  for (int i = 0; i < 20; ++i) {
    write("ev" + std::to_string(i));
  }
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(wait_until([&] { return caught_up("s" + std::to_string(i)); }));
  }
  // Each event went to each subscription once, through whichever process runs it.
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(a_subs[i].second->ids().size() + b_subs[i].second->ids().size(), 20u);
  }
  a->close();
  a_leases->close();
  ASSERT_TRUE(wait_until([&] { return held(*b) == 4; }));
  write("after");
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(wait_until([&] { return caught_up("s" + std::to_string(i)); }));
    const auto ids = b_subs[i].second->ids();
    ASSERT_FALSE(ids.empty()) << "s" << i;
    EXPECT_EQ(ids.back(), "after");
  }
  b->close();
  b_leases->close();
}

TEST_P(SubscriptionRunnerTest, ACommitInThisProcessWakesASubscriptionThatWouldWaitAnHour) {
  auto rec = std::make_shared<Recorder>();
  auto& runner = *hourly(rec);
  // Its first poll found nothing; from now on only a wake-up makes it read before an hour.
  ASSERT_TRUE(wait_until([&] { return runner.views()[0].state.has_value(); }));
  commit_woken(runner);
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 1; }));
}

// Wake-ups (a commit here, NOTIFY, data_version) can come many times a second: during a failed
// publication's retry delay they must not turn the backoff into a busy loop; an operator's
// poll_now() still reads at once.
TEST_P(SubscriptionRunnerTest, WakeUpsDoNotCutAFailedPublicationsRetryDelay) {
  auto rec = std::make_shared<Recorder>();
  rec->failing = true;
  SubscriptionRunner runner(SubscriptionRunner::Options{
      .connection_provider = pool_,
      .store = stream_,
      .subscriptions = {{.spec = {"patient", {}, "log", ""},
                         .publisher = rec,
                         .schedule = {.poll_interval = std::chrono::hours(1),
                                      .max_errors = 0,
                                      .retry_base = std::chrono::hours(1),
                                      .retry_max = std::chrono::hours(1)}}},
      .sequencer_interval = std::chrono::hours(1)});
  runner.start();
  ASSERT_TRUE(wait_until([&] { return runner.views()[0].state.has_value(); }));
  commit_woken(runner);
  ASSERT_TRUE(wait_until([&] { return rec->calls() == 1; }));
  ASSERT_TRUE(
      wait_until([&] { return runner.views()[0].waiting.find("retrying") != std::string::npos; }));
  for (int i = 0; i < 20; ++i) {
    commit_woken(runner);  // each wakes the runner
  }
  EXPECT_EQ(rec->calls(), 1);  // before the fix: one attempt per wake-up, within milliseconds
  rec->failing = false;
  runner.poll_now();
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() >= 21; }))
      << rec->ids().size() << " delivered in " << rec->calls() << " calls";
  EXPECT_EQ(rec->ids().size(), 21u);
  runner.close();
}

// PostgreSQL: a commit's wake-up that finds its event held back by an older open transaction
// (any session's) reads again soon, so the event goes out once that transaction ends, not a poll
// interval (here an hour) later.
TEST_P(SubscriptionRunnerTest, AWakeUpHeldBackByAnOpenTransactionIsNotLost) {
  if (!engine_is("postgres")) {
    GTEST_SKIP() << "not on " << testing::display_name(GetParam().name)
                 << ": only PostgreSQL holds reads back behind open transactions";
  }
  auto rec = std::make_shared<Recorder>();
  auto& runner = *hourly(rec);
  ASSERT_TRUE(wait_until([&] { return runner.views()[0].state.has_value(); }));
  auto blocker = pool_->acquire();
  blocker->begin();
  store_->insert_new(*blocker, EventEnvelope::of_json(EventType::of("Blocker"), "{}"));  // open
  commit_woken(runner);
  ASSERT_TRUE(
      wait_until([&] { return runner.views()[0].waiting.find("held back") != std::string::npos; }));
  EXPECT_TRUE(rec->ids().empty());
  blocker->rollback();
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 1; }));
}

// Returns one result fewer than it was given requests.
class ShortPublisher final : public Publisher {
 public:
  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override {
    return std::vector<PublishResult>(batch.empty() ? 0 : batch.size() - 1, PublishResult::ok());
  }
};

TEST_P(SubscriptionRunnerTest, AnEventThePublisherGaveNoResultForIsNotPassed) {
  write("a");
  write("b");
  {
    StreamPosition from;  // both readable (not held back by another session) before the run
    ASSERT_EQ(read_all(from, 1000, 2).size(), 2U);
  }
  SubscriptionRunner runner({.connection_provider = pool_,
                             .store = stream_,
                             .subscriptions = {{.spec = {"short", {}, "log", ""},
                                                .publisher = std::make_shared<ShortPublisher>(),
                                                .schedule = fast()}},
                             .sequencer_interval = 5ms});
  runner.start();
  ASSERT_TRUE(wait_until([&] {
    return stream_->find(*pool_->acquire(), "short")->status == SubscriptionStatus::Failed;
  }));
  const auto st = stream_->find(*pool_->acquire(), "short");
  StreamPosition from;
  const auto all = read_all(from);
  EXPECT_EQ(st->cursor, all[0].position);  // "a" had its result, "b" none
  EXPECT_NE(st->last_error->find("no result"), std::string::npos) << *st->last_error;
}

TEST_P(SubscriptionRunnerTest, ClosingTheRunnerGivesBackEveryLeaseItKept) {
  auto leases = lease_manager("node-a", 30s, 1s);
  auto r = runner({{{"s", {}, "log", ""}, std::make_shared<Recorder>()}}, leases);
  auto live = [&](const std::string& name) {
    const auto info = leases_->find(*pool_->acquire(), name);
    return info && info->live;
  };
  ASSERT_TRUE(wait_until([&] { return live("sub:s") && live("member:node-a"); }));
  if (stream_->needs_sequencer()) {
    ASSERT_TRUE(wait_until([&] { return live("stream:sequencer"); }));
  }
  r->close();
  // The manager lives on (standby mode shares it): nothing of the runner's may stay held.
  EXPECT_FALSE(live("sub:s"));
  EXPECT_FALSE(live("member:node-a"));
  EXPECT_FALSE(live("stream:sequencer"));
  leases->close();
}

TEST_P(SubscriptionRunnerTest, ARestoredPostgresDatabaseStopsRunningSubscriptionsUntilRebased) {
  if (!engine_is("postgres")) {
    GTEST_SKIP() << "not on " << testing::display_name(GetParam().name)
                 << ": only PostgreSQL positions hold transaction ids";
  }
  auto rec = std::make_shared<Recorder>();
  write("before");
  auto r = runner({{{"s", {}, "log", ""}, rec}});
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() == 1; }));
  // The database is swapped under the runner for a restored one.
  pool_->acquire()->execute("UPDATE " + table_ +
                            " SET stream_xid = (stream_xid::text::bigint + 1000000)::text::xid8");
  pool_->acquire()->execute("UPDATE " + sql::subscription_table_name(table_) +
                            " SET cursor_xid = cursor_xid + 1000000");
  write("after-restore");
  ASSERT_TRUE(wait_until(
      [&] { return r->views()[0].waiting.find("stream refused") != std::string::npos; }));
  EXPECT_EQ(rec->ids().size(), 1u);
  stream_->rebase(*pool_->acquire());
  ASSERT_TRUE(wait_until([&] { return rec->ids().size() >= 2; }));
  EXPECT_EQ(rec->ids().back(), "after-restore");
}

TEST_P(SubscriptionRunnerTest, ProcessesNamingDifferentSubscriptionsLeaveNoneUnrun) {
  auto a_leases = lease_manager("node-a");
  auto b_leases = lease_manager("node-b");
  std::map<std::string, std::shared_ptr<Recorder>> rec;
  for (const char* n : {"s1", "s2", "s3"}) {
    rec[n] = std::make_shared<Recorder>();
  }
  // A alone names s1 and s2, B alone s3: shares of one each must not leave s2 to nobody.
  auto a =
      runner({{{"s1", {}, "log", ""}, rec["s1"]}, {{"s2", {}, "log", ""}, rec["s2"]}}, a_leases);
  auto b = runner({{{"s3", {}, "log", ""}, rec["s3"]}}, b_leases);
  // Once both are members, each one's share is one subscription.
  ASSERT_TRUE(wait_until([&] {
    const auto info = leases_->find(*pool_->acquire(), "member:node-b");
    return info && info->live;
  }));
  write("x");
  for (const char* n : {"s1", "s2", "s3"}) {
    EXPECT_TRUE(wait_until([&] { return !rec[n]->ids().empty(); })) << n << " never ran";
  }
  // And it stays where it runs: a later event reaches it too.
  write("y");
  EXPECT_TRUE(wait_until([&] { return rec["s2"]->ids().size() + rec["s1"]->ids().size() >= 4; }));
  a->close();
  b->close();
  a_leases->close();
  b_leases->close();
}

// Publishes one event per call; the first call lasts until the lease is no longer trusted (a
// process paused past its ttl), recording whether the lease was held at each call.
class LeaseWatchingPublisher final : public Publisher {
 public:
  explicit LeaseWatchingPublisher(std::shared_ptr<LeaseManager> leases)
      : leases_(std::move(leases)) {}
  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override {
    const bool held = leases_->token("sub:s").has_value();
    if (calls_++ == 0) {
      testing::wait_until([&] { return !leases_->token("sub:s"); });
    }
    if (!held) {
      ++calls_without_lease_;
    }
    return std::vector<PublishResult>(batch.size(), PublishResult::ok());
  }
  std::atomic<int> calls_{0};
  std::atomic<int> calls_without_lease_{0};

 private:
  std::shared_ptr<LeaseManager> leases_;
};

TEST_P(SubscriptionRunnerTest, ABatchStopsBetweenEventsOnceTheLeaseIsNoLongerHeld) {
  auto leases = lease_manager("node-a", 1s, 300ms, false);
  for (int i = 0; i < 5; ++i) {
    write("h" + std::to_string(i));
  }
  auto publisher = std::make_shared<LeaseWatchingPublisher>(leases);
  SubscriptionRunner::Options o{.connection_provider = pool_, .store = stream_, .leases = leases};
  auto schedule = fast();
  schedule.publish_chunk = 1;
  o.subscriptions.push_back(
      {.spec = {"s", {}, "log", ""}, .publisher = publisher, .schedule = schedule});
  o.sequencer_interval = 5ms;
  SubscriptionRunner r(std::move(o));
  // Acquired by hand and never renewed (the manager is not started): it lapses during the first
  // publish, as a paused process's would.
  ASSERT_TRUE(leases->try_acquire("sub:s"));
  r.start();
  // The batch stopped when the lease lapsed; the balancer takes the free lease again and the rest
  // goes out under the new holding. No call was made without the lease.
  ASSERT_TRUE(wait_until([&] { return caught_up("s"); }));
  EXPECT_GE(publisher->calls_.load(), 5);
  EXPECT_EQ(publisher->calls_without_lease_.load(), 0);
  r.close();
}

INSTANTIATE_TEST_SUITE_P(Engines, SubscriptionRunnerTest, testing::all_engines(),
                         testing::engine_name);

}  // namespace
}  // namespace outbox
