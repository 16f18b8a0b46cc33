#include "outbox/sqlite/driver.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <future>
#include <thread>

#include "outbox/errors.hpp"
#include "tests/support/test_support.hpp"

namespace {

using outbox::sql::Blob;
using outbox::sql::TextRef;
using outbox::sql::Value;

TEST(SqliteDriver, ExecuteAndQueryWithBoundParameters) {
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("t.db"));
  EXPECT_EQ(conn->dialect(), "sqlite");
  conn->execute("CREATE TABLE t (a INTEGER, b TEXT, c BLOB, d REAL)");
  const std::string text = "it's \"quoted\"; DROP TABLE t; --";
  std::vector<std::uint8_t> bytes{0, 1, 2, 255};
  EXPECT_EQ(conn->execute("INSERT INTO t VALUES (?, ?, ?, ?)",
                          {std::int64_t{42}, TextRef{text}, outbox::sql::BlobRef{bytes}, 1.5}),
            1);
  conn->execute("INSERT INTO t VALUES (?, ?, ?, ?)", {Value{}, std::string(""), Blob{}, Value{}});
  auto rows = conn->query("SELECT a, b, c, d FROM t ORDER BY a IS NULL, a");
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].get_int(0), 42);
  EXPECT_EQ(rows[0].get_text(1), text);
  EXPECT_TRUE(rows[0].is_blob(2));
  EXPECT_EQ(rows[0].get_text(2), std::string("\0\1\2\xff", 4));
  EXPECT_TRUE(rows[1].is_null(0));
  EXPECT_EQ(rows[1].get_text(1), "");
  EXPECT_FALSE(rows[1].is_null(2));
  EXPECT_TRUE(rows[1].is_null(3));
  EXPECT_THROW(rows[0].get_int(1), outbox::StoreError);
  EXPECT_THROW(rows[0].at(9), outbox::StoreError);
}

TEST(SqliteDriver, UsesWalAndReportsErrors) {
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("t.db"));
  EXPECT_EQ(conn->query("PRAGMA journal_mode").at(0).get_text(0), "wal");
  EXPECT_THROW(conn->execute("SELEKT 1"), outbox::StoreError);
  EXPECT_THROW(conn->execute("SELECT ?", {}), outbox::StoreError);
  EXPECT_THROW(outbox::sqlite::open(dir.file("missing/dir/x.db")), outbox::StoreError);
}

TEST(SqliteDriver, TransactionsCommitAndRollBack) {
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("t.db"));
  conn->execute("CREATE TABLE t (a INTEGER)");
  conn->begin();
  EXPECT_TRUE(conn->in_transaction());
  conn->execute("INSERT INTO t VALUES (1)");
  conn->rollback();
  EXPECT_FALSE(conn->in_transaction());
  conn->begin();
  conn->execute("INSERT INTO t VALUES (2)");
  conn->commit();
  auto rows = conn->query("SELECT a FROM t");
  ASSERT_EQ(rows.size(), 1u);
  EXPECT_EQ(rows[0].get_int(0), 2);
}

TEST(SqliteDriver, WrapsCallerOwnedHandleWithoutClosingIt) {
  outbox::testing::TempDir dir;
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open(dir.file("w.db").c_str(), &db), SQLITE_OK);
  {
    auto conn = outbox::sqlite::wrap(db);
    conn->execute("CREATE TABLE t (a INTEGER)");
    conn->execute("INSERT INTO t VALUES (7)");
  }
  sqlite3_stmt* st = nullptr;
  ASSERT_EQ(sqlite3_prepare_v2(db, "SELECT a FROM t", -1, &st, nullptr), SQLITE_OK);
  ASSERT_EQ(sqlite3_step(st), SQLITE_ROW);
  EXPECT_EQ(sqlite3_column_int(st, 0), 7);
  sqlite3_finalize(st);
  EXPECT_EQ(sqlite3_close(db), SQLITE_OK);
  EXPECT_THROW(outbox::sqlite::wrap(nullptr), std::invalid_argument);
}

TEST(ConnectionPool, ReusesAndBoundsConnections) {
  outbox::testing::TempDir dir;
  auto pool = std::make_shared<outbox::sql::ConnectionPool>(outbox::sql::ConnectionPool::Options{
      .factory = [&] { return outbox::sqlite::open(dir.file("p.db")); },
      .max_size = 2,
      .acquire_timeout = std::chrono::milliseconds(50),
  });
  {
    auto a = pool->acquire();
    auto b = pool->acquire();
    EXPECT_EQ(pool->in_use(), 2u);
    EXPECT_THROW(pool->acquire(), outbox::StoreError);
    a->execute("CREATE TABLE t (x INTEGER)");
    b->begin();
    b->execute("INSERT INTO t VALUES (1)");
    // b goes back with an open transaction: the pool rolls it back.
  }
  EXPECT_EQ(pool->in_use(), 0u);
  auto c = pool->acquire();
  EXPECT_FALSE(c->in_transaction());
  EXPECT_EQ(c->query("SELECT COUNT(*) FROM t").at(0).get_int(0), 0);
}

}  // namespace

namespace {

std::uintmax_t file_size_or_zero(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  return ec ? 0 : size;
}

TEST(SqliteDriver, ParameterlessTextRunsEveryStatementItHolds) {
  outbox::testing::TempDir dir;
  auto pool = outbox::sqlite::make_pool(dir.file("script.db"), 2);
  auto conn = pool->acquire();
  conn->execute("CREATE TABLE a (x INTEGER); -- one\nCREATE TABLE b (y INTEGER);\n");
  conn->execute("INSERT INTO a VALUES (1); INSERT INTO b VALUES (2)");
  EXPECT_EQ(conn->query("SELECT (SELECT x FROM a) + (SELECT y FROM b)")[0].get_int(0), 3);
  EXPECT_THROW(conn->execute("INSERT INTO a VALUES (3); INSERT INTO nowhere VALUES (4)"),
               outbox::StoreError);
}

// Found by a hostile round: a transaction SQLite ended by itself (a conflict clause that rolls
// back, a full disk) kept the pool's write gate, and every other writer then waited the whole
// busy timeout for it.
TEST(SqliteDriver, ATransactionSqliteRolledBackItselfLetsTheOtherWritersThrough) {
  outbox::testing::TempDir dir;
  outbox::sqlite::OpenOptions options;
  options.busy_timeout = std::chrono::minutes(5);  // a held gate would outlast the test's wait
  auto pool = outbox::sqlite::make_pool(dir.file("gate.db"), 4, options);
  pool->acquire()->execute("CREATE TABLE t (id INTEGER PRIMARY KEY ON CONFLICT ROLLBACK)");
  const auto write_elsewhere = [&](std::int64_t id) {
    auto done = std::async(std::launch::async, [&, id] {
      auto other = pool->acquire();
      other->begin();
      other->execute("INSERT INTO t VALUES (?)", {id});
      other->commit();
      pool->acquire()->execute("INSERT INTO t VALUES (?)", {id + 1});  // autocommitted
    });
    EXPECT_TRUE(outbox::testing::wait_until(
        [&] { return done.wait_for(std::chrono::seconds(0)) == std::future_status::ready; }));
    done.get();
  };
  for (const bool report : {false, true}) {
    {
      auto conn = pool->acquire();
      conn->begin();
      conn->execute("INSERT INTO t VALUES (1)");
      EXPECT_THROW(conn->execute("INSERT INTO t VALUES (1)"), outbox::StoreError);
      ASSERT_FALSE(conn->in_transaction());  // SQLite rolled it back
      if (report) {
        EXPECT_THROW(conn->commit(), outbox::StoreError);
      } else {
        conn->rollback();
      }
    }
    write_elsewhere(report ? 20 : 10);
  }
  EXPECT_EQ(pool->acquire()->query("SELECT count(*) FROM t")[0].get_int(0), 4);
}

TEST(SqliteDriver, TheWalIsCheckpointedBackWhileReadersNeverPause) {
  outbox::testing::TempDir dir;
  const auto path = dir.file("wal.db");
  outbox::sqlite::OpenOptions options;
  options.checkpoint_interval = std::chrono::milliseconds(20);
  options.checkpoint_pages = 1;
  options.journal_size_limit = 0;
  auto pool = outbox::sqlite::make_pool(path, 4, options);
  pool->acquire()->execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)");
  // Overlapping read transactions keep SQLite's own checkpoints from ever resetting the WAL
  // (2.3 GB in 20 s once, never shrinking while the process ran).
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 2; ++r) {
    readers.emplace_back([&] {
      auto conn = pool->acquire();
      while (!stop) {
        conn->query("SELECT count(*) FROM t");
      }
    });
  }
  {
    auto writer = pool->acquire();
    for (int i = 0; i < 2000; ++i) {
      writer->execute("INSERT INTO t (v) VALUES (?)", {std::string(512, 'x')});
    }
  }
  // While the readers still run, the checkpointer brings the WAL back to nothing.
  EXPECT_TRUE(outbox::testing::wait_until([&] { return file_size_or_zero(path + "-wal") == 0; }))
      << file_size_or_zero(path + "-wal");
  stop = true;
  for (auto& t : readers) {
    t.join();
  }
  EXPECT_EQ(pool->acquire()->query("SELECT count(*) FROM t")[0].get_int(0), 2000);
}

TEST(SqliteDriver, LongOverlappingReadTransactionsCannotKeepTheWalGrowing) {
  // Found breaking the first checkpointer: readers holding 300 ms transactions, always one
  // open, outlasted every 100 ms truncation attempt and the WAL grew without end.
  outbox::testing::TempDir dir;
  const auto path = dir.file("long.db");
  outbox::sqlite::OpenOptions options;
  options.checkpoint_interval = std::chrono::milliseconds(20);
  options.checkpoint_pages = 1;
  options.journal_size_limit = 0;
  auto pool = outbox::sqlite::make_pool(path, 6, options);
  pool->acquire()->execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)");
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int r = 0; r < 3; ++r) {
    readers.emplace_back([&, r] {
      auto conn = pool->acquire();
      // Staggered so that some read transaction is always open.
      const auto first = std::chrono::steady_clock::now() + std::chrono::milliseconds(100 * r);
      while (!stop && std::chrono::steady_clock::now() < first) {
      }
      while (!stop) {
        conn->execute("BEGIN DEFERRED");  // a read transaction, not the write lock
        const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(300);
        while (std::chrono::steady_clock::now() < until) {
          conn->query("SELECT count(*) FROM t");
        }
        conn->execute("COMMIT");
      }
    });
  }
  // Writes never stop either: the WAL must still be reset (seen shrinking) now and then.
  std::thread writer([&] {
    auto conn = pool->acquire();
    while (!stop) {
      conn->begin();
      for (int i = 0; i < 50; ++i) {
        conn->execute("INSERT INTO t (v) VALUES (?)", {std::string(64, 'x')});
      }
      conn->commit();
    }
  });
  std::uintmax_t largest = 0;
  EXPECT_TRUE(outbox::testing::wait_until([&] {
    const auto now = file_size_or_zero(path + "-wal");
    largest = std::max(largest, now);
    return largest > 256 * 1024 && now < largest / 4;
  })) << "WAL never shrank; largest "
      << largest;
  stop = true;
  writer.join();
  for (auto& t : readers) {
    t.join();
  }
}

}  // namespace
