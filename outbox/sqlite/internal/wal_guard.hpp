#pragma once
// Checkpoints that no commit can begin the WAL over while they run: SQLite 3.7.0 to 3.51.2 (not
// 3.44.6 or 3.50.7) can lose committed pages when a checkpoint starts on a WAL that is already
// wholly checkpointed and another connection's commit starts the WAL over meanwhile (the
// "WAL-reset bug", sqlite.org/wal.html#walresetbug). A checkpoint run while a connection of this
// guard holds the database's write lock cannot meet such a commit.

#include <chrono>
#include <optional>
#include <string>

struct sqlite3;

namespace outbox::sqlite::internal {

/// True when the linked SQLite has the WAL-reset bug.
bool has_wal_reset_bug();

/// What a checkpoint reported: frames in the WAL, and how many of them are in the database file.
struct CheckpointFrames {
  int log = 0;
  int checkpointed = 0;
};

/// Holds the write lock of one database file through a connection of its own (opened at the
/// first checkpoint) while another connection checkpoints. One thread at a time.
class WalGuard {
 public:
  explicit WalGuard(std::string path);
  ~WalGuard();
  WalGuard(const WalGuard&) = delete;
  WalGuard& operator=(const WalGuard&) = delete;

  /// A passive checkpoint of `db` (a connection to the same file, in autocommit) under the write
  /// lock. Nothing runs (nullopt) when the lock stayed taken for `wait` or the guard's connection
  /// cannot be opened; the checkpoint's own failure also gives nullopt. Never throws.
  std::optional<CheckpointFrames> checkpoint(sqlite3* db, std::chrono::milliseconds wait);

 private:
  std::string path_;
  sqlite3* guard_ = nullptr;
};

}  // namespace outbox::sqlite::internal
