#pragma once
// Checkpoints that no commit can begin the WAL over while they run: SQLite 3.7.0 to 3.51.2 (not
// 3.44.6 or 3.50.7) can lose committed pages when a checkpoint starts on a WAL that is already
// wholly checkpointed and another connection's commit starts the WAL over meanwhile (the
// "WAL-reset bug", sqlite.org/wal.html#walresetbug). A checkpoint run while a connection of this
// guard holds the database's write lock cannot meet such a commit.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>

struct sqlite3;

namespace outbox::sqlite::internal {

/// True when the linked SQLite has the WAL-reset bug.
bool has_wal_reset_bug();

/// What a checkpoint reported: frames in the WAL, and how many of them are in the database file.
struct CheckpointFrames {
  int log = 0;
  int checkpointed = 0;
};

/// What the commits of one pool's connections last checkpointed (guarded, after a commit that left
/// a long WAL): the pool's background checkpointer leaves the WAL to them while they keep at it.
struct CommitCheckpoints {
  std::atomic<std::int64_t> at{0};  ///< steady clock, ns since its epoch; 0: none yet
  std::atomic<int> log{0};          ///< frames in the WAL then
};

/// Holds the write lock of the files one connection has open, through connections of its own,
/// while that connection checkpoints them. One thread at a time.
class WalGuard {
 public:
  /// Opens its connection to `db`'s main file at once: the file `db` has open, not one that
  /// replaced it at the same name later (a second connection of this process to another file
  /// would reset the shared memory `db` maps).
  explicit WalGuard(sqlite3* db);
  ~WalGuard();
  WalGuard(const WalGuard&) = delete;
  WalGuard& operator=(const WalGuard&) = delete;

  /// A passive checkpoint of `schema` ("main", or an attached database's name) of `db`, which
  /// must be in autocommit, under that file's write lock. Nothing runs (nullopt) when the lock
  /// stayed taken for `wait`, the file has no name (in memory, temporary) or the guard's
  /// connection cannot be opened; the checkpoint's own failure also gives nullopt. Never throws.
  std::optional<CheckpointFrames> checkpoint(sqlite3* db, const char* schema,
                                             std::chrono::milliseconds wait);

 private:
  sqlite3* guard_for(const std::string& file);
  static int on_busy(void* self, int count);

  std::unordered_map<std::string, sqlite3*> guards_;  // by file name
  std::chrono::steady_clock::time_point deadline_;    // of the write lock being waited for
};

}  // namespace outbox::sqlite::internal
