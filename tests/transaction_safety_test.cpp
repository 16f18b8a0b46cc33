// "Nothing rolled back is delivered", tried the way a hostile caller would on every engine:
// errors caught and then committed, transactions the server ended behind our back (deadlocks,
// implicit commits, COMMIT through the connection), savepoints rolled back after a write, and
// delays written late in a long transaction. The hot path is observed through a WriterHook: its
// after_commit is exactly what the dispatcher would deliver at once.

#include <gtest/gtest.h>

#include <functional>
#include <future>
#include <mutex>
#include <set>

#include "outbox/errors.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/store.hpp"
#include "outbox/transaction.hpp"
#include "outbox/writer.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;

// Records what the writer hands to the hot path.
class RecordingHook final : public WriterHook {
 public:
  void after_commit(const std::vector<EventEnvelope>& events) override {
    std::lock_guard lock(mutex_);
    for (const auto& e : events) {
      committed_.insert(e.event_id());
    }
  }
  void after_rollback(const std::vector<EventEnvelope>& events) override {
    std::lock_guard lock(mutex_);
    for (const auto& e : events) {
      rolled_back_.insert(e.event_id());
    }
  }
  std::set<std::string> committed() const {
    std::lock_guard lock(mutex_);
    return committed_;
  }
  std::set<std::string> rolled_back() const {
    std::lock_guard lock(mutex_);
    return rolled_back_;
  }

 private:
  mutable std::mutex mutex_;
  std::set<std::string> committed_;
  std::set<std::string> rolled_back_;
};

using testing::Engine;

class TransactionSafety : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    auto url = GetParam().url();
    OUTBOX_REQUIRE_SERVER(url, "the " + GetParam().name + " server");
    engine_ = GetParam().name;
    table_ = testing::unique_table("txsafety");
    if (engine_ == "sqlite") {
      pool_ = sqlite::make_pool(dir_.file("tx.db"), 4);
      auto conn = pool_->acquire();
      sqlite::create_schema(*conn, table_);
      store_ = std::make_shared<sqlite::SqliteOutboxStore>(
          sqlite::SqliteOutboxStore::Options{.table = table_});
    } else if (engine_ == "postgres") {
      pool_ = postgres::make_pool(*url, 4);
      auto conn = pool_->acquire();
      postgres::create_schema(*conn, table_);
      store_ = std::make_shared<postgres::PostgresOutboxStore>(
          postgres::PostgresOutboxStore::Options{.table = table_});
    } else {
      pool_ = mysql::make_pool(*url, 4);
      auto conn = pool_->acquire();
      mysql::create_schema(*conn, table_);
      store_ = std::make_shared<mysql::MySqlOutboxStore>(
          mysql::MySqlOutboxStore::Options{.table = table_});
    }
    business_ = table_ + "_biz";
    exec("CREATE TABLE " + business_ + " (id INTEGER PRIMARY KEY, note VARCHAR(40))");
    exec("INSERT INTO " + business_ + " (id, note) VALUES (1, 'a'), (2, 'b')");
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

  void exec(const std::string& sql) { pool_->acquire()->execute(sql); }
  bool row_exists(const std::string& id) { return store_->find(*pool_->acquire(), id).has_value(); }
  std::string write(const std::string& id) {
    return *writer_->write(EventEnvelope::builder(EventType::of("T"))
                               .event_id(id)
                               .aggregate_id("agg")
                               .payload_json("{}")
                               .build());
  }
  // The promise itself: the hot path ran exactly for the events whose rows exist.
  void expect_consistent(const std::vector<std::string>& ids) {
    for (const auto& id : ids) {
      EXPECT_EQ(hook_->committed().count(id) == 1, row_exists(id))
          << id << ": hot path " << (hook_->committed().count(id) ? "ran" : "did not run")
          << " but the row " << (row_exists(id) ? "exists" : "does not exist");
    }
  }
  std::string param(int n) const { return engine_ == "postgres" ? "$" + std::to_string(n) : "?"; }

  testing::TempDir dir_;
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

// Issue 9 item 1: on PostgreSQL a failed statement aborts the transaction, COMMIT then answers
// with the tag ROLLBACK, and commit() used to return normally: the hot path delivered an event
// whose row never existed. Elsewhere the statement alone fails; either way the hot path must
// agree with the table.
TEST_P(TransactionSafety, CaughtErrorThenCommitDeliversOnlyWhatWasCommitted) {
  {
    auto txn = tx_->begin();
    write("caught-1");
    EXPECT_THROW(
        txn.connection().execute("INSERT INTO " + business_ + " (id, note) VALUES (1, 'dup')"),
        StoreError);
    if (engine_ == "postgres") {
      EXPECT_THROW(txn.commit(), StoreError);
    } else {
      txn.commit();  // only the failed statement was undone
    }
  }
  EXPECT_EQ(row_exists("caught-1"), engine_ != "postgres");
  EXPECT_EQ(hook_->rolled_back().count("caught-1"), engine_ == "postgres" ? 1u : 0u);
  expect_consistent({"caught-1"});
}

// A COMMIT or ROLLBACK run through the connection ends the transaction; statements after it would
// autocommit, so an outbox row could outlive the caller's rollback. They are refused, and so is
// the commit() that follows.
TEST_P(TransactionSafety, TransactionEndedThroughTheConnectionRefusesFurtherWork) {
  {
    auto txn = tx_->begin();
    write("ended-1");
    txn.connection().execute("ROLLBACK");
    EXPECT_THROW(write("ended-2"), StoreError);
    EXPECT_THROW(txn.commit(), StoreError);
  }
  EXPECT_FALSE(row_exists("ended-1"));
  EXPECT_FALSE(row_exists("ended-2"));
  expect_consistent({"ended-1", "ended-2"});
  // The pooled connection is usable again.
  auto txn = tx_->begin();
  write("after");
  txn.commit();
  expect_consistent({"after"});
  EXPECT_TRUE(row_exists("after"));
}

// Issue 9 item 1 (MariaDB): a deadlock rolls the whole transaction back; in_transaction() still
// said yes (error packets carry no status), COMMIT outside a transaction is a silent no-op, and the
// event was delivered while its row did not exist.
TEST_P(TransactionSafety, DeadlockVictimCannotCommit) {
  if (engine_ == "sqlite") {
    GTEST_SKIP() << "not on SQLite: one writer at a time, so no deadlocks";
  }
  std::promise<void> a_locked;
  std::promise<void> b_locked;
  auto run = [&](int first, int second, const std::string& id, std::promise<void>& mine,
                 std::future<void> theirs) {
    auto txn = tx_->begin();
    write(id);
    txn.connection().execute("UPDATE " + business_ +
                             " SET note = 'x' WHERE id = " + std::to_string(first));
    mine.set_value();
    theirs.wait();
    try {
      txn.connection().execute("UPDATE " + business_ +
                               " SET note = 'y' WHERE id = " + std::to_string(second));
    } catch (const StoreError&) {
      // The deadlock victim: a careless caller carries on and commits.
    }
    try {
      txn.commit();
      return true;
    } catch (const StoreError&) {
      return false;
    }
  };
  auto first =
      std::async(std::launch::async, run, 1, 2, "dl-a", std::ref(a_locked), b_locked.get_future());
  auto second =
      std::async(std::launch::async, run, 2, 1, "dl-b", std::ref(b_locked), a_locked.get_future());
  const bool a = first.get();
  const bool b = second.get();
  EXPECT_NE(a, b) << "exactly one side is the deadlock victim";
  EXPECT_EQ(row_exists("dl-a"), a);
  EXPECT_EQ(row_exists("dl-b"), b);
  expect_consistent({"dl-a", "dl-b"});
}

// Issue 9 item 1 (MariaDB): DDL inside a transaction commits it implicitly; a later rollback()
// "succeeded" although the event was committed (and delivered). Now the statements after it are
// refused and rollback() says what happened.
TEST_P(TransactionSafety, ImplicitCommitIsReportedNotHidden) {
  if (engine_ != "mysql") {
    GTEST_SKIP() << "not on " << testing::display_name(engine_)
                 << ": DDL is transactional, nothing commits implicitly";
  }
  {
    auto txn = tx_->begin();
    write("ddl-1");
    txn.connection().execute("CREATE TABLE " + business_ + "_ddl (x INT)");
    EXPECT_THROW(write("ddl-2"), StoreError);
    EXPECT_THROW(txn.rollback(), StoreError);
  }
  exec("DROP TABLE IF EXISTS " + business_ + "_ddl");
  EXPECT_TRUE(row_exists("ddl-1"));  // committed by the DDL: the poller delivers it
  EXPECT_FALSE(row_exists("ddl-2"));
}

// Issue 9 item 2: SAVEPOINT; write; ROLLBACK TO; commit delivered the event on the hot path
// although its row was rolled back. Transaction::savepoint() keeps the hot path in step.
TEST_P(TransactionSafety, SavepointRollbackForgetsTheEventsWrittenSinceIt) {
  {
    auto txn = tx_->begin();
    write("sp-kept");
    {
      auto sp = txn.savepoint();
      write("sp-undone");
      {
        auto inner = txn.savepoint();
        write("sp-inner");
        inner.release();
      }
      sp.rollback();
    }
    {
      auto sp = txn.savepoint();
      write("sp-released");
      sp.release();
    }
    {
      auto sp = txn.savepoint();
      write("sp-destroyed");  // no release(): the destructor rolls back
    }
    write("sp-after");
    txn.commit();
  }
  EXPECT_EQ(hook_->committed(), (std::set<std::string>{"sp-kept", "sp-released", "sp-after"}));
  EXPECT_EQ(hook_->rolled_back(), (std::set<std::string>{"sp-undone", "sp-inner", "sp-destroyed"}));
  expect_consistent(
      {"sp-kept", "sp-undone", "sp-inner", "sp-released", "sp-destroyed", "sp-after"});
}

TEST_P(TransactionSafety, SavepointMisuseIsRefused) {
  auto txn = tx_->begin();
  auto outer = txn.savepoint();
  auto inner = txn.savepoint();
  EXPECT_THROW(outer.release(), std::logic_error);  // inner first
  inner.rollback();
  EXPECT_THROW(inner.rollback(), std::logic_error);
  outer.release();
  txn.commit();
  EXPECT_FALSE(outer.active());
}

// A SAVEPOINT, ROLLBACK or chained transaction run as plain SQL through the connection, in every
// spelling a hostile caller found (comments first, ROLLBACK WORK/TRANSACTION TO, names that look
// like ours, several statements in one text, AND CHAIN, a raw ROLLBACK TO one of our own
// savepoints): the events whose rows it undid never reach the hot path.
TEST_P(TransactionSafety, PlainSqlSavepointsAndRollbacksNeverDeliverUndoneEvents) {
  struct Case {
    std::string name;
    std::vector<std::string> before;  // statements before the write
    std::vector<std::string> after;   // statements after it, undoing it
    bool ours = false;                // open a Savepoint before the write and release it after
  };
  const bool pg = engine_ == "postgres";
  const bool my = engine_ == "mysql";
  std::vector<Case> cases = {
      {"plain", {"SAVEPOINT a"}, {"ROLLBACK TO SAVEPOINT a"}},
      {"comment", {"/* x */ SAVEPOINT a"}, {"ROLLBACK TO SAVEPOINT a"}},
      {"lower", {"  savepoint a"}, {"rollback to a"}},
      {"long-form",
       {"SAVEPOINT a"},
       {my ? "ROLLBACK WORK TO SAVEPOINT a" : "ROLLBACK TRANSACTION TO SAVEPOINT a"}},
      {"our-prefix", {"SAVEPOINT my_outbox_sp_x"}, {"ROLLBACK TO SAVEPOINT my_outbox_sp_x"}},
      {"raw-rollback-to-ours", {}, {"ROLLBACK TO SAVEPOINT outbox_sp_1"}, true},
  };
  if (pg) {
    cases.push_back({"multi-statement", {"SELECT 1; SAVEPOINT a"}, {"ROLLBACK TO SAVEPOINT a"}});
    cases.push_back({"rollback-begin", {}, {"ROLLBACK; BEGIN"}});
  }
  if (pg || my) {
    cases.push_back({"and-chain", {}, {"ROLLBACK AND CHAIN"}});
  }
  if (my) {
    // Versioned comments are run by MariaDB: the version digits glue to the keyword.
    cases.push_back({"versioned-comment", {"/*!50000SAVEPOINT*/ a"}, {"/*!50000ROLLBACK*/ TO a"}});
    cases.push_back(
        {"mariadb-comment", {"/*M!100000SAVEPOINT a*/"}, {"/*M!100000ROLLBACK TO a*/"}});
    cases.push_back({"completion-chain",
                     {"SET SESSION completion_type = 'CHAIN'"},
                     {"ROLLBACK", "SET SESSION completion_type = 'NO_CHAIN'"}});
  }
  std::vector<std::string> ids;
  for (const auto& c : cases) {
    const std::string id = "raw-" + c.name;
    ids.push_back(id);
    auto txn = tx_->begin();
    for (const auto& sql : c.before) {
      txn.connection().execute(sql);
    }
    std::optional<Savepoint> sp;
    if (c.ours) {
      sp.emplace(txn.savepoint());
    }
    write(id);
    for (const auto& sql : c.after) {
      txn.connection().execute(sql);
    }
    if (sp) {
      sp->release();  // ROLLBACK TO keeps the savepoint: releasing it works, the row is gone
    }
    try {
      txn.commit();
    } catch (const StoreError& e) {
      // Refusing the commit is fine too: the point is what the hot path sees.
    }
    EXPECT_FALSE(row_exists(id)) << c.name;
    EXPECT_EQ(hook_->committed().count(id), 0u) << c.name << ": an undone event was delivered";
  }
  expect_consistent(ids);
}

// Found breaking issue 9: two writers with contexts of their own sharing one transaction. An
// ExternalTransaction cleared the connection's suspicion raised by the first context's plain
// savepoint, and a Savepoint of one context rolled back the other's rows without it knowing.
TEST_P(TransactionSafety, ContextsSharingAConnectionCannotHideAnUndo) {
  auto other_hook = std::make_shared<RecordingHook>();
  auto other_context = std::make_shared<ThreadLocalTxContext>();
  OutboxWriter other(other_context, store_, other_hook);
  auto event = [](const std::string& id) {
    return EventEnvelope::builder(EventType::of("T")).event_id(id).payload_json("{}").build();
  };
  {
    auto txn = tx_->begin();
    auto& c = txn.connection();
    c.execute("SAVEPOINT a");
    write("ctx-e1");
    c.execute("ROLLBACK TO SAVEPOINT a");
    ExternalTransaction ext(*other_context, c);
    other.write(event("ctx-f1"));
    txn.commit();
    ext.committed();
  }
  {
    auto txn = tx_->begin();
    ExternalTransaction ext(*other_context, txn.connection());
    auto sp = ext.savepoint();
    write("ctx-e2");  // the first context's event, inside the other context's savepoint
    sp.rollback();
    txn.commit();
    ext.committed();
  }
  expect_consistent({"ctx-e1", "ctx-e2"});
  EXPECT_EQ(hook_->committed().count("ctx-e1"), 0u);
  EXPECT_EQ(hook_->committed().count("ctx-e2"), 0u);
  EXPECT_EQ(other_hook->committed().count("ctx-f1"), 1u);
}

// Found breaking issue 9: a session left with autocommit off, or with COMMIT chaining a new
// transaction, went back to the pool; the DONE marks written on it later were rolled back when it
// was returned again, so events were delivered forever. Such sessions are discarded.
TEST_P(TransactionSafety, AlteredSessionsAreNotReused) {
  if (engine_ != "mysql") {
    GTEST_SKIP() << "not on " << testing::display_name(engine_)
                 << ": autocommit and completion_type are MariaDB session settings";
  }
  auto single = mysql::make_pool(*GetParam().url(), 1);
  for (const std::string set : {"SET autocommit = 0", "SET SESSION completion_type = 'CHAIN'"}) {
    {
      TransactionManager tm(single, context_);
      auto txn = tm.begin();
      txn.connection().execute(set);
      txn.commit();
    }
    auto conn = single->acquire();
    EXPECT_EQ(conn->query("SELECT @@autocommit").at(0).get_int(0), 1) << set;
    EXPECT_EQ(conn->query("SELECT @@completion_type").at(0).get_text(0), "NO_CHAIN") << set;
    EXPECT_FALSE(conn->in_transaction()) << set;
  }
}

// An ordinary transaction is not suspect: the check after commit costs nothing there.
TEST_P(TransactionSafety, OrdinaryWritesNeedNoCheckAfterCommit) {
  auto txn = tx_->begin();
  txn.connection().execute("UPDATE " + business_ + " SET note = 'n' WHERE id = 1");
  write("plain-1");
  writer_->write_all(
      {EventEnvelope::builder(EventType::of("T")).payload_json("{}").build(),
       EventEnvelope::builder(EventType::of("T")).deliver_after(1s).payload_json("{}").build()});
  {
    auto sp = txn.savepoint();
    write("plain-2");
    sp.release();
  }
  EXPECT_FALSE(txn.connection().transaction_suspect());
  txn.commit();
  EXPECT_EQ(hook_->committed().count("plain-1"), 1u);
  EXPECT_EQ(hook_->committed().count("plain-2"), 1u);
}

// PostgreSQL's way out of an aborted transaction works through the savepoint API.
TEST_P(TransactionSafety, SavepointRecoversFromAFailedStatement) {
  auto txn = tx_->begin();
  write("rec-1");
  {
    auto sp = txn.savepoint();
    write("rec-2");
    EXPECT_THROW(
        txn.connection().execute("INSERT INTO " + business_ + " (id, note) VALUES (2, 'dup')"),
        StoreError);
    sp.rollback();
  }
  txn.commit();
  EXPECT_EQ(hook_->committed(), (std::set<std::string>{"rec-1"}));
  expect_consistent({"rec-1", "rec-2"});
}

// Issue 9 item 10: with the database clock, a delayed event's due time was now() + delay, and
// now() is the transaction's start: written late in a long transaction it was due early (here
// before it was even written). The writer's claim had the same flaw.
TEST_P(TransactionSafety, DelaysAndClaimsCountFromTheWriteNotTheTransactionStart) {
  if (engine_ == "sqlite") {
    GTEST_SKIP() << "not on SQLite: no server clock";
  }
  auto txn = tx_->begin();
  auto& conn = txn.connection();
  conn.query(engine_ == "postgres" ? "SELECT pg_sleep(1.5)" : "SELECT SLEEP(1.5)");
  const std::string now_sql =
      engine_ == "postgres" ? "SELECT (EXTRACT(EPOCH FROM clock_timestamp()) * 1000000)::bigint"
                            : "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))";
  const auto written_at = from_micros(conn.query(now_sql).at(0).get_int(0));
  store_->insert_new(conn,
                     EventEnvelope::builder(EventType::of("T"))
                         .event_id("late")
                         .deliver_after(3s)
                         .payload_json("{}")
                         .build(),
                     "node-a");
  txn.commit();
  auto row = store_->find(*pool_->acquire(), "late");
  ASSERT_TRUE(row);
  EXPECT_GE(row->available_at, written_at + 3s - 1ms);
  ASSERT_TRUE(row->locked_at);
  EXPECT_GE(*row->locked_at, written_at - 1ms);
}

INSTANTIATE_TEST_SUITE_P(Engines, TransactionSafety, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
