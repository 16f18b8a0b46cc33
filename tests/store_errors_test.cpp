// Errors that say what is still safe, on every engine: a duplicate event id, a unique violation of
// the caller's own table, a session the server killed, a COMMIT whose answer was lost, and a
// DeadEventManager whose database fails. Each case checks the state the error promises (is the
// transaction / the connection still usable?) against the database itself, and what the hot path
// was given. Cases named *Killed* need a server: they skip themselves on SQLite.

#include <gtest/gtest.h>

#include <mutex>
#include <set>

#include "outbox/dead_event_manager.hpp"
#include "outbox/errors.hpp"
#include "outbox/listener.hpp"
#include "outbox/metrics.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/transaction.hpp"
#include "outbox/writer.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/failing_store.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::Engine;

// Records which of its three outcomes the writer gave each event.
class RecordingHook final : public WriterHook {
 public:
  void after_commit(const std::vector<EventEnvelope>& events) override { add(committed_, events); }
  void after_rollback(const std::vector<EventEnvelope>& events) override {
    add(rolled_back_, events);
  }
  void after_unknown_outcome(const std::vector<EventEnvelope>& events) override {
    add(unknown_, events);
  }
  std::set<std::string> committed() const { return get(committed_); }
  std::set<std::string> rolled_back() const { return get(rolled_back_); }
  std::set<std::string> unknown() const { return get(unknown_); }

 private:
  void add(std::set<std::string>& to, const std::vector<EventEnvelope>& events) {
    std::lock_guard lock(mutex_);
    for (const auto& e : events) {
      to.insert(e.event_id());
    }
  }
  std::set<std::string> get(const std::set<std::string>& from) const {
    std::lock_guard lock(mutex_);
    return from;
  }
  mutable std::mutex mutex_;
  std::set<std::string> committed_, rolled_back_, unknown_;
};

// Hands out the inner provider's connections with one fault: COMMIT commits, then its answer is
// lost (as when the link dies between the server's commit and its reply). The database is real;
// only the reply is dropped.
class UnansweredCommitProvider final : public sql::ConnectionProvider {
 public:
  explicit UnansweredCommitProvider(std::shared_ptr<sql::ConnectionProvider> inner)
      : inner_(std::move(inner)) {}
  sql::PooledConnection acquire() override {
    return sql::PooledConnection(std::make_unique<Conn>(inner_->acquire()), nullptr, &release);
  }

 private:
  class Conn final : public sql::Connection {
   public:
    explicit Conn(sql::PooledConnection inner) : inner_(std::move(inner)) {}
    using sql::Connection::execute;
    using sql::Connection::query;
    std::int64_t execute(std::string_view sql, std::span<const sql::Value> params) override {
      return inner_->execute(sql, params);
    }
    std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override {
      return inner_->query(sql, params);
    }
    void begin() override { inner_->begin(); }
    void commit() override {
      inner_->commit();
      throw CommitOutcomeUnknownError("injected: the answer to COMMIT was lost");
    }
    void rollback() override { inner_->rollback(); }
    bool in_transaction() const override { return inner_->in_transaction(); }
    std::string_view dialect() const override { return inner_->dialect(); }
    bool single_writer() const override { return inner_->single_writer(); }
    sql::PooledConnection inner_;
  };
  static void release(void*, std::unique_ptr<sql::Connection> conn, bool broken) {
    if (broken) {
      static_cast<Conn&>(*conn).inner_.mark_broken();
    }
  }
  std::shared_ptr<sql::ConnectionProvider> inner_;
};

class StoreErrors : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    auto url = GetParam().url();
    OUTBOX_REQUIRE_SERVER(url, "the " + GetParam().name + " server");
    url_ = *url;
    engine_ = GetParam().name;
    table_ = testing::unique_table("errors");
    if (engine_ == "sqlite") {
      pool_ = sqlite::make_pool(dir_.file("errors.db"), 4);
      sqlite::create_schema(*pool_->acquire(), table_);
      store_ = std::make_shared<sqlite::SqliteOutboxStore>(
          sqlite::SqliteOutboxStore::Options{.table = table_});
    } else if (engine_ == "postgres") {
      pool_ = postgres::make_pool(url_, 4);
      postgres::create_schema(*pool_->acquire(), table_);
      store_ = std::make_shared<postgres::PostgresOutboxStore>(
          postgres::PostgresOutboxStore::Options{.table = table_});
    } else {
      pool_ = mysql::make_pool(url_, 4);
      mysql::create_schema(*pool_->acquire(), table_);
      store_ = std::make_shared<mysql::MySqlOutboxStore>(
          mysql::MySqlOutboxStore::Options{.table = table_});
    }
    business_ = table_ + "_biz";
    exec("CREATE TABLE " + business_ + " (id INTEGER PRIMARY KEY, note VARCHAR(40))");
    exec("INSERT INTO " + business_ + " (id, note) VALUES (1, 'a')");
    context_ = std::make_shared<ThreadLocalTxContext>();
    tx_ = std::make_unique<TransactionManager>(pool_, context_);
    writer_ = std::make_unique<OutboxWriter>(context_, store_, hook_);
  }
  void TearDown() override {
    if (pool_) {
      exec("DROP TABLE IF EXISTS " + business_);
      exec("DROP TABLE IF EXISTS " + table_);
    }
  }

  bool pg() const { return engine_ == "postgres"; }
  void exec(const std::string& sql) { pool_->acquire()->execute(sql); }
  bool row_exists(const std::string& id) { return store_->find(*pool_->acquire(), id).has_value(); }
  std::string note() {
    return pool_->acquire()->query("SELECT note FROM " + business_ + " WHERE id = 1")[0].get_text(
        0);
  }
  static EventEnvelope event(const std::string& id, const std::string& type = "T") {
    return EventEnvelope::builder(EventType::of(type)).event_id(id).payload_json("{}").build();
  }
  void write(const std::string& id) { writer_->write(event(id)); }
  void write_committed(const std::string& id) {
    auto txn = tx_->begin();
    write(id);
    txn.commit();
  }

  // Ends the session behind `conn` from a second connection, as an administrator or a server
  // restart would, and waits until the server has let it go.
  void kill_session(sql::Connection& conn) {
    const auto id = std::to_string(
        conn.query(pg() ? "SELECT pg_backend_pid()" : "SELECT CONNECTION_ID()")[0].get_int(0));
    auto killer = pool_->acquire();
    if (pg()) {
      killer->query("SELECT pg_terminate_backend(" + id + ")");
    } else {
      killer->execute("KILL CONNECTION " + id);
    }
    const std::string gone =
        pg() ? "SELECT count(*) FROM pg_stat_activity WHERE pid = " + id
             : "SELECT COUNT(*) FROM information_schema.processlist WHERE id = " + id;
    ASSERT_TRUE(testing::wait_until([&] { return killer->query(gone)[0].get_int(0) == 0; }));
  }

  testing::TempDir dir_;
  std::string url_;
  std::string engine_;
  std::string table_;
  std::string business_;
  std::shared_ptr<sql::ConnectionPool> pool_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<ThreadLocalTxContext> context_;
  std::unique_ptr<TransactionManager> tx_;
  std::shared_ptr<RecordingHook> hook_ = std::make_shared<RecordingHook>();
  std::unique_ptr<OutboxWriter> writer_;
};

// A duplicate event id is a DuplicateEventError, and the transaction is in the state it says:
// PostgreSQL aborted it (commit() refuses and nothing of it is kept), MariaDB and SQLite undid the
// failed insert alone (the rows written before it commit and reach the hot path).
TEST_P(StoreErrors, DuplicateEventIdSaysWhetherTheTransactionGoesOn) {
  write_committed("dup");
  auto txn = tx_->begin();
  txn.connection().execute("UPDATE " + business_ + " SET note = 'changed' WHERE id = 1");
  write("before-dup");
  try {
    write("dup");
    FAIL() << "a duplicate event id was accepted";
  } catch (const DuplicateEventError& e) {
    EXPECT_EQ(e.transaction_usable(), !pg()) << e.what();
    EXPECT_TRUE(e.connection_usable());
    EXPECT_EQ(e.sqlstate(), pg() ? "23505" : engine_ == "mysql" ? "23000" : "") << e.what();
    EXPECT_NE(std::string(e.what()).find("duplicate event id dup"), std::string::npos) << e.what();
  }
  if (pg()) {
    EXPECT_THROW(txn.commit(), StoreError);
  } else {
    // A batch holding a known id fails whole; the transaction still goes on.
    EXPECT_THROW(writer_->write_all({event("batch-new"), event("dup")}), DuplicateEventError);
    txn.commit();
  }
  EXPECT_EQ(row_exists("before-dup"), !pg());
  EXPECT_EQ(note(), pg() ? "a" : "changed");
  EXPECT_FALSE(row_exists("batch-new"));
  EXPECT_EQ(hook_->committed().count("before-dup"), pg() ? 0u : 1u);
  EXPECT_EQ(hook_->rolled_back().count("before-dup"), pg() ? 1u : 0u);
  EXPECT_EQ(hook_->committed().count("batch-new"), 0u);
}

// A batch repeating an id of its own is a duplicate too; the pooled connection stays usable.
TEST_P(StoreErrors, BatchRepeatingAnIdIsADuplicateEvent) {
  {
    auto txn = tx_->begin();
    EXPECT_THROW(writer_->write_all({event("twin"), event("twin")}), DuplicateEventError);
  }
  EXPECT_FALSE(row_exists("twin"));
  write_committed("twin");
  EXPECT_TRUE(row_exists("twin"));
  EXPECT_EQ(hook_->committed(), std::set<std::string>{"twin"});
}

// The same SQLSTATE from the caller's own table is a UniqueViolationError, not a duplicate event:
// only the outbox insert is tagged. Other errors carry the transaction state as well.
TEST_P(StoreErrors, UniqueViolationOfABusinessTableIsNotADuplicateEvent) {
  // Outside a transaction there is none to go on with.
  try {
    exec("INSERT INTO " + business_ + " (id, note) VALUES (1, 'dup')");
    FAIL() << "a duplicate business key was accepted";
  } catch (const UniqueViolationError& e) {
    EXPECT_FALSE(e.transaction_usable()) << e.what();
  }
  auto txn = tx_->begin();
  write("biz-ok");
  try {
    txn.connection().execute("INSERT INTO " + business_ + " (id, note) VALUES (1, 'dup')");
    FAIL() << "a duplicate business key was accepted";
  } catch (const UniqueViolationError& e) {
    EXPECT_EQ(dynamic_cast<const DuplicateEventError*>(&e), nullptr) << e.what();
    EXPECT_EQ(e.transaction_usable(), !pg()) << e.what();
    EXPECT_TRUE(e.connection_usable());
  }
  if (!pg()) {
    try {
      txn.connection().execute("SELECT no_such_column FROM " + business_);
      FAIL() << "a bad column was accepted";
    } catch (const StoreError& e) {
      EXPECT_EQ(dynamic_cast<const UniqueViolationError*>(&e), nullptr) << e.what();
      EXPECT_TRUE(e.transaction_usable()) << e.what();
    }
    txn.commit();
    EXPECT_TRUE(row_exists("biz-ok"));
  }
}

// A session the server ended is a ConnectionLostError: the transaction is gone (nothing of it is
// kept), the connection unusable; rollback() has nothing left to do, commit() cannot have sent
// anything, and the pool hands out a working connection next.
TEST_P(StoreErrors, KilledSessionIsALostConnection) {
  if (engine_ == "sqlite") {
    GTEST_SKIP() << "not on SQLite: no server session to kill";
  }
  {
    auto txn = tx_->begin();
    txn.connection().execute("UPDATE " + business_ + " SET note = 'lost' WHERE id = 1");
    write("lost-1");
    kill_session(txn.connection());
    try {
      write("lost-2");
      FAIL() << "a statement on a killed session succeeded";
    } catch (const ConnectionLostError& e) {
      EXPECT_FALSE(e.connection_usable()) << e.what();
      EXPECT_FALSE(e.transaction_usable()) << e.what();
      EXPECT_NE(e.sqlstate(), "") << e.what();
    }
    EXPECT_TRUE(txn.connection().is_broken());
    txn.rollback();  // the server rolled back already
  }
  {
    auto txn = tx_->begin();
    write("lost-3");
    kill_session(txn.connection());
    EXPECT_THROW(txn.connection().query("SELECT 1"), ConnectionLostError);
    // Known lost before the COMMIT: it was never sent, so the outcome is known.
    EXPECT_THROW(txn.commit(), ConnectionLostError);
  }
  EXPECT_EQ(hook_->rolled_back(), (std::set<std::string>{"lost-1", "lost-3"}));
  EXPECT_TRUE(hook_->committed().empty());
  EXPECT_FALSE(row_exists("lost-1"));
  EXPECT_FALSE(row_exists("lost-3"));
  EXPECT_EQ(note(), "a");
  write_committed("after-loss");
  EXPECT_TRUE(row_exists("after-loss"));
}

// The session dies after the write and before the COMMIT reaches it: commit() cannot tell what
// happened, so it throws CommitOutcomeUnknownError, runs neither after-commit nor after-rollback
// callbacks (the writer's after-unknown-outcome ones instead) and the hot path gets nothing.
TEST_P(StoreErrors, KilledBeforeCommitLeavesTheOutcomeUnknown) {
  if (engine_ == "sqlite") {
    GTEST_SKIP() << "not on SQLite: no server session to kill";
  }
  auto txn = tx_->begin();
  write("doubt-1");
  kill_session(txn.connection());
  try {
    txn.commit();
    FAIL() << "a COMMIT on a killed session succeeded";
  } catch (const CommitOutcomeUnknownError& e) {
    EXPECT_FALSE(e.connection_usable()) << e.what();
    EXPECT_FALSE(e.transaction_usable()) << e.what();
  }
  EXPECT_FALSE(txn.active());
  EXPECT_EQ(hook_->unknown(), std::set<std::string>{"doubt-1"});
  EXPECT_TRUE(hook_->committed().empty());
  EXPECT_TRUE(hook_->rolled_back().empty());
  EXPECT_FALSE(row_exists("doubt-1"));  // here the server had ended the session first
  write_committed("after-doubt");
  EXPECT_TRUE(row_exists("after-doubt"));
}

// The safe choice end to end: a commit that did commit but whose answer was lost hands nothing to
// the hot path and releases the dispatcher's reservation, so the poller delivers the event, once,
// in both single-node and multi-node (rows born claimed) modes.
TEST_P(StoreErrors, UnansweredCommitLeavesTheEventsToThePoller) {
  for (const bool multi : {false, true}) {
    SCOPED_TRACE(multi ? "multi_node" : "single_node");
    std::mutex m;
    std::multiset<std::string> delivered;
    auto listeners = std::make_shared<DefaultListenerRegistry>();
    listeners->register_listener(EventType::of("T"), [&](const EventEnvelope& e) {
      std::lock_guard lock(m);
      delivered.insert(e.event_id());
    });
    auto metrics = std::make_shared<InMemoryMetrics>();
    Outbox::Options o{.connection_provider = pool_,
                      .tx_context = context_,
                      .store = store_,
                      .listeners = listeners,
                      .metrics = metrics,
                      .poller = {.interval = 50ms}};
    if (multi) {
      o.claim_locking = ClaimLocking{.owner = "node-a", .lock_timeout = 2s};
    }
    auto ob = multi ? Outbox::multi_node(std::move(o)) : Outbox::single_node(std::move(o));
    ob.start();
    TransactionManager unanswered(std::make_shared<UnansweredCommitProvider>(pool_), context_);
    const std::string id = multi ? "unanswered-multi" : "unanswered-single";
    {
      auto txn = unanswered.begin();
      ob.writer().write(event(id));
      EXPECT_THROW(txn.commit(), CommitOutcomeUnknownError);
    }
    EXPECT_TRUE(row_exists(id));  // it did commit
    ASSERT_TRUE(testing::wait_until([&] {
      auto row = store_->find(*pool_->acquire(), id);
      return row && row->status == EventStatus::Done;
    }));
    ob.close();
    std::lock_guard lock(m);
    EXPECT_EQ(delivered.count(id), 1u);
    EXPECT_EQ(metrics->snapshot().hot_enqueued, 0);
  }
}

// Replays the DEAD events it lists, but only once each: an event sent DEAD again right after its
// replay (as by a running relay) stays DEAD, and one replayed by someone else in between counts
// as skipped.
class RacingReplayStore final : public testing::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  int replay_dead(sql::Connection& c, std::string_view id, Timestamp now) override {
    if (id == "replayed-elsewhere") {
      inner_->replay_dead(c, id, now);
    }
    const int n = inner_->replay_dead(c, id, now);
    if (id == "fails-again") {
      inner_->mark_dead(c, id, now, "failed again");
    }
    return n;
  }
};

TEST_P(StoreErrors, DeadEventManagerReplaysEachListedEventAtMostOnce) {
  const auto now = std::chrono::system_clock::now();
  {
    auto conn = pool_->acquire();
    for (const std::string id : {"fails-again", "a-2", "replayed-elsewhere", "a-4", "b-1"}) {
      store_->insert_new(*conn, event(id, id == "b-1" ? "B" : "A"));
      store_->mark_dead(*conn, id, now, "boom");
    }
  }
  DeadEventManager dead(pool_, std::make_shared<RacingReplayStore>(store_));
  EXPECT_EQ(dead.count(), 5);
  EXPECT_EQ(dead.count("A"), 4);
  const auto listed = dead.query("A", std::nullopt, 10, false);
  ASSERT_EQ(listed.size(), 4u);
  EXPECT_TRUE(listed[0].payload.empty());
  EXPECT_EQ(dead.query("B", std::nullopt, 10).at(0).payload, "{}");

  const auto r = dead.replay_all("A", std::nullopt);
  EXPECT_EQ(r.replayed, 3);
  EXPECT_EQ(r.skipped, 1);
  EXPECT_FALSE(r.more);
  EXPECT_EQ(dead.count("A"), 1);  // fails-again went DEAD again and was not replayed twice

  DeadEventManager plain(pool_, store_);
  const auto capped = plain.replay_all(std::nullopt, std::nullopt, 1);
  EXPECT_EQ(capped.replayed, 1);
  EXPECT_TRUE(capped.more);
  EXPECT_EQ(plain.count(), 1);
  EXPECT_THROW(plain.replay_all(std::nullopt, std::nullopt, 0), std::invalid_argument);
  const auto last = plain.query(std::nullopt, std::nullopt, 10).at(0).event_id;
  EXPECT_TRUE(plain.replay(last));
  EXPECT_FALSE(plain.replay(last));
  EXPECT_EQ(plain.count(), 0);
}

// Database failures are errors, not empty answers: a dropped table and an unreachable database.
TEST_P(StoreErrors, DeadEventManagerThrowsInsteadOfAnsweringEmpty) {
  DeadEventManager dead(pool_, store_);
  EXPECT_EQ(dead.count(), 0);
  exec("DROP TABLE " + table_);
  EXPECT_THROW(dead.count(), StoreError);
  EXPECT_THROW(dead.query(std::nullopt, std::nullopt, 10), StoreError);
  EXPECT_THROW(dead.replay("x"), StoreError);
  EXPECT_THROW(dead.replay_all(std::nullopt, std::nullopt), StoreError);

  std::shared_ptr<sql::ConnectionPool> nowhere;
  if (engine_ == "sqlite") {
    nowhere = sqlite::make_pool(dir_.file("no-such-dir/outbox.db"), 1);
  } else if (pg()) {
    nowhere = postgres::make_pool("host=127.0.0.1 port=1 dbname=x connect_timeout=2", 1);
  } else {
    nowhere = mysql::make_pool("mysql://root@127.0.0.1:1/x", 1);
  }
  DeadEventManager unreachable(nowhere, store_);
  EXPECT_THROW(unreachable.count(), StoreError);
  EXPECT_THROW(unreachable.query(std::nullopt, std::nullopt, 10), StoreError);
  EXPECT_THROW(unreachable.replay("x"), StoreError);
  EXPECT_THROW(unreachable.replay_all(std::nullopt, std::nullopt), StoreError);
  if (engine_ != "sqlite") {
    EXPECT_THROW(unreachable.count(), ConnectionLostError);
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, StoreErrors, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
