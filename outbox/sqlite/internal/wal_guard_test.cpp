#include "outbox/sqlite/internal/wal_guard.hpp"

#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "outbox/sqlite/driver.hpp"
#include "tests/support/test_support.hpp"

namespace {

// A VFS over the default one that calls `on_checkpoint_lock` right after a connection opened
// through it takes the WAL's checkpoint lock: the moment a checkpoint has begun.
struct ProbeFile {
  sqlite3_file base;
  sqlite3_file* real;
};

sqlite3_vfs* real_vfs() {
  static sqlite3_vfs* vfs = sqlite3_vfs_find(nullptr);
  return vfs;
}

std::function<void()> on_checkpoint_lock;

constexpr int kCheckpointLock = 1;  // WAL_CKPT_LOCK in SQLite's wal.c

sqlite3_file* real_of(sqlite3_file* f) {
  return reinterpret_cast<ProbeFile*>(f)->real;
}

int probe_shm_lock(sqlite3_file* f, int offset, int n, int flags) {
  const int rc = real_of(f)->pMethods->xShmLock(real_of(f), offset, n, flags);
  if (rc == SQLITE_OK && offset == kCheckpointLock &&
      flags == (SQLITE_SHM_LOCK | SQLITE_SHM_EXCLUSIVE) && on_checkpoint_lock) {
    auto call = std::move(on_checkpoint_lock);
    on_checkpoint_lock = nullptr;
    call();
  }
  return rc;
}

const sqlite3_io_methods* probe_methods() {
  static const sqlite3_io_methods methods = {
      3,
      [](sqlite3_file* f) { return real_of(f)->pMethods->xClose(real_of(f)); },
      [](sqlite3_file* f, void* p, int n, sqlite3_int64 o) {
        return real_of(f)->pMethods->xRead(real_of(f), p, n, o);
      },
      [](sqlite3_file* f, const void* p, int n, sqlite3_int64 o) {
        return real_of(f)->pMethods->xWrite(real_of(f), p, n, o);
      },
      [](sqlite3_file* f, sqlite3_int64 size) {
        return real_of(f)->pMethods->xTruncate(real_of(f), size);
      },
      [](sqlite3_file* f, int flags) { return real_of(f)->pMethods->xSync(real_of(f), flags); },
      [](sqlite3_file* f, sqlite3_int64* size) {
        return real_of(f)->pMethods->xFileSize(real_of(f), size);
      },
      [](sqlite3_file* f, int lock) { return real_of(f)->pMethods->xLock(real_of(f), lock); },
      [](sqlite3_file* f, int lock) { return real_of(f)->pMethods->xUnlock(real_of(f), lock); },
      [](sqlite3_file* f, int* out) {
        return real_of(f)->pMethods->xCheckReservedLock(real_of(f), out);
      },
      [](sqlite3_file* f, int op, void* arg) {
        return real_of(f)->pMethods->xFileControl(real_of(f), op, arg);
      },
      [](sqlite3_file* f) { return real_of(f)->pMethods->xSectorSize(real_of(f)); },
      [](sqlite3_file* f) { return real_of(f)->pMethods->xDeviceCharacteristics(real_of(f)); },
      [](sqlite3_file* f, int page, int size, int extend, void volatile** out) {
        return real_of(f)->pMethods->xShmMap(real_of(f), page, size, extend, out);
      },
      probe_shm_lock,
      [](sqlite3_file* f) { real_of(f)->pMethods->xShmBarrier(real_of(f)); },
      [](sqlite3_file* f, int remove) {
        return real_of(f)->pMethods->xShmUnmap(real_of(f), remove);
      },
      [](sqlite3_file* f, sqlite3_int64 o, int n, void** out) {
        return real_of(f)->pMethods->xFetch(real_of(f), o, n, out);
      },
      [](sqlite3_file* f, sqlite3_int64 o, void* p) {
        return real_of(f)->pMethods->xUnfetch(real_of(f), o, p);
      },
  };
  return &methods;
}

sqlite3_vfs* probe_vfs() {
  static sqlite3_vfs vfs = [] {
    sqlite3_vfs v = *real_vfs();
    v.szOsFile = static_cast<int>(sizeof(ProbeFile)) + real_vfs()->szOsFile;
    v.zName = "outbox-checkpoint-probe";
    v.pNext = nullptr;
    v.xOpen = [](sqlite3_vfs*, sqlite3_filename name, sqlite3_file* f, int flags, int* out) {
      auto* probe = reinterpret_cast<ProbeFile*>(f);
      probe->real = reinterpret_cast<sqlite3_file*>(probe + 1);
      const int rc = real_vfs()->xOpen(real_vfs(), name, probe->real, flags, out);
      probe->base.pMethods = probe->real->pMethods != nullptr ? probe_methods() : nullptr;
      return rc;
    };
    return v;
  }();
  static const bool registered = sqlite3_vfs_register(&vfs, 0) == SQLITE_OK;
  EXPECT_TRUE(registered);
  return &vfs;
}

struct Db {
  Db(const std::string& path, const char* vfs) {
    EXPECT_EQ(sqlite3_open_v2(path.c_str(), &db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, vfs),
              SQLITE_OK);
    sqlite3_wal_autocheckpoint(db, 0);
  }
  ~Db() { sqlite3_close_v2(db); }
  Db(const Db&) = delete;
  Db& operator=(const Db&) = delete;
  int exec(const std::string& sql) const {
    return sqlite3_exec(db, sql.c_str(), nullptr, nullptr, nullptr);
  }
  sqlite3* db = nullptr;
};

TEST(SqliteWalGuard, TheDriverGuardsExactlyWhereTheLinkedSqliteHasTheBug) {
  const int v = sqlite3_libversion_number();
  if (v / 1000 == 3040) {
    EXPECT_TRUE(outbox::sqlite::internal::has_wal_reset_bug()) << "Debian 12's 3.40 has it";
  }
  // Guarded: SQLite's own automatic checkpoint is off and the driver's hook runs instead.
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("version.db"));
  EXPECT_EQ(conn->query("PRAGMA wal_autocheckpoint")[0].get_int(0),
            outbox::sqlite::internal::has_wal_reset_bug() ? 0 : 1000);
}

TEST(SqliteWalGuard, NoCommitCanRunWhileAGuardedCheckpointDoes) {
  outbox::testing::TempDir dir;
  const auto path = dir.file("guard.db");
  Db setup(path, nullptr);
  ASSERT_EQ(setup.exec("PRAGMA journal_mode=WAL; CREATE TABLE t (v TEXT)"), SQLITE_OK);
  Db checkpointer(path, probe_vfs()->zName);
  ASSERT_EQ(checkpointer.exec("SELECT count(*) FROM t"), SQLITE_OK);  // its WAL opened
  Db writer(path, nullptr);
  sqlite3_busy_timeout(writer.db, 0);
  // The writer's answer to a commit tried once the next checkpoint has begun (-1: not tried).
  int during = -1;
  auto write_during_checkpoint = [&] {
    during = -1;
    on_checkpoint_lock = [&] { during = writer.exec("INSERT INTO t VALUES ('during')"); };
  };

  // The probe works: without a guard, another connection commits while the checkpoint runs (the
  // WAL-reset bug needs such a commit, one that begins the WAL over).
  ASSERT_EQ(setup.exec("INSERT INTO t VALUES ('a')"), SQLITE_OK);
  write_during_checkpoint();
  int log = 0;
  int done = 0;
  ASSERT_EQ(
      sqlite3_wal_checkpoint_v2(checkpointer.db, nullptr, SQLITE_CHECKPOINT_PASSIVE, &log, &done),
      SQLITE_OK);
  EXPECT_EQ(during, SQLITE_OK);

  // Guarded: the writer finds the write lock taken for as long as the checkpoint runs.
  ASSERT_EQ(setup.exec("INSERT INTO t VALUES ('b')"), SQLITE_OK);
  outbox::sqlite::internal::WalGuard guard(checkpointer.db);
  write_during_checkpoint();
  const auto frames = guard.checkpoint(checkpointer.db, "main", std::chrono::milliseconds(0));
  ASSERT_TRUE(frames.has_value());
  EXPECT_EQ(during, SQLITE_BUSY);
  EXPECT_EQ(frames->checkpointed, frames->log);

  // And it gives the lock back: the writer commits right after.
  EXPECT_EQ(writer.exec("INSERT INTO t VALUES ('after')"), SQLITE_OK);
}

TEST(SqliteWalGuard, AWriteLockHeldElsewhereSkipsTheCheckpointRatherThanWaitBeyondItsBound) {
  outbox::testing::TempDir dir;
  const auto path = dir.file("busy.db");
  Db setup(path, nullptr);
  ASSERT_EQ(
      setup.exec("PRAGMA journal_mode=WAL; CREATE TABLE t (v TEXT); INSERT INTO t VALUES (1)"),
      SQLITE_OK);
  Db holder(path, nullptr);
  ASSERT_EQ(holder.exec("BEGIN IMMEDIATE; INSERT INTO t VALUES (2)"), SQLITE_OK);
  Db checkpointer(path, nullptr);
  ASSERT_EQ(checkpointer.exec("SELECT count(*) FROM t"), SQLITE_OK);  // its WAL opened
  outbox::sqlite::internal::WalGuard guard(checkpointer.db);
  EXPECT_FALSE(
      guard.checkpoint(checkpointer.db, "main", std::chrono::milliseconds(20)).has_value());
  ASSERT_EQ(holder.exec("COMMIT"), SQLITE_OK);
  const auto frames = guard.checkpoint(checkpointer.db, "main", std::chrono::milliseconds(20));
  ASSERT_TRUE(frames.has_value());
  EXPECT_EQ(frames->checkpointed, frames->log);
}

TEST(SqliteWalGuard, PooledConnectionsCheckpointThroughTheGuardAndKeepTheWalShort) {
  if (!outbox::sqlite::internal::has_wal_reset_bug()) {
    GTEST_SKIP() << "the linked SQLite has no WAL-reset bug: its own automatic checkpoint runs";
  }
  outbox::testing::TempDir dir;
  const auto path = dir.file("pool.db");
  outbox::sqlite::OpenOptions options;
  options.wal_autocheckpoint = 100;
  options.checkpoint_interval = std::chrono::milliseconds(0);  // commits alone checkpoint
  options.journal_size_limit = 0;
  auto pool = outbox::sqlite::make_pool(path, 2, options);
  auto conn = pool->acquire();
  // SQLite's own automatic checkpoint is off: the driver's hook replaced it.
  EXPECT_EQ(conn->query("PRAGMA wal_autocheckpoint")[0].get_int(0), 0);
  conn->execute("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT)");
  for (int i = 0; i < 3000; ++i) {
    conn->execute("INSERT INTO t (v) VALUES (?)", {std::string(1000, 'x')});
  }
  // 3000 pages went through the WAL; the commits' checkpoints let it start over, so it never
  // held much more than 100 of them (4 KiB each).
  std::error_code ec;
  const auto wal = std::filesystem::file_size(path + "-wal", ec);
  EXPECT_FALSE(ec);
  EXPECT_LT(wal, 200u * 4096u);
  EXPECT_EQ(conn->query("SELECT count(*) FROM t")[0].get_int(0), 3000);
  EXPECT_EQ(conn->query("PRAGMA integrity_check")[0].get_text(0), "ok");
}

TEST(SqliteWalGuard, AConnectionOpenedWithoutWalOnAWalFileIsGuardedToo) {
  if (!outbox::sqlite::internal::has_wal_reset_bug()) {
    GTEST_SKIP() << "the linked SQLite has no WAL-reset bug: its own automatic checkpoint runs";
  }
  outbox::testing::TempDir dir;
  const auto path = dir.file("mode.db");
  outbox::sqlite::open(path)->execute("CREATE TABLE t (v TEXT)");  // WAL, as the pools open it
  outbox::sqlite::OpenOptions plain;
  plain.wal = false;
  auto conn = outbox::sqlite::open(path, plain);
  EXPECT_EQ(conn->query("PRAGMA journal_mode")[0].get_text(0), "wal");
  // SQLite's own automatic checkpoint would run unguarded here: the driver's runs instead.
  EXPECT_EQ(conn->query("PRAGMA wal_autocheckpoint")[0].get_int(0), 0);
}

}  // namespace
