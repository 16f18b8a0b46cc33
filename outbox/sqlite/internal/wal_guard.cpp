#include "outbox/sqlite/internal/wal_guard.hpp"

#include <sqlite3.h>

#include <utility>

namespace outbox::sqlite::internal {

bool has_wal_reset_bug() {
  const int v = sqlite3_libversion_number();
  const bool fixed = v >= 3051003 || (v >= 3044006 && v < 3045000) || (v >= 3050007 && v < 3051000);
  return v >= 3007000 && !fixed;
}

WalGuard::WalGuard(std::string path) : path_(std::move(path)) {}

WalGuard::~WalGuard() {
  sqlite3_close_v2(guard_);
}

std::optional<CheckpointFrames> WalGuard::checkpoint(sqlite3* db, std::chrono::milliseconds wait) {
  if (guard_ == nullptr) {
    sqlite3* opened = nullptr;
    if (sqlite3_open_v2(path_.c_str(), &opened, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                        nullptr) != SQLITE_OK) {
      sqlite3_close_v2(opened);
      return std::nullopt;
    }
    guard_ = opened;
  }
  sqlite3_busy_timeout(guard_, static_cast<int>(wait.count()));
  if (sqlite3_exec(guard_, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    if (sqlite3_get_autocommit(guard_) == 0) {
      sqlite3_exec(guard_, "ROLLBACK", nullptr, nullptr, nullptr);
    }
    return std::nullopt;
  }
  CheckpointFrames frames;
  const int rc = sqlite3_wal_checkpoint_v2(db, nullptr, SQLITE_CHECKPOINT_PASSIVE, &frames.log,
                                           &frames.checkpointed);
  // The guard wrote nothing: its rollback only gives the write lock back.
  sqlite3_exec(guard_, "ROLLBACK", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    return std::nullopt;
  }
  return frames;
}

}  // namespace outbox::sqlite::internal
