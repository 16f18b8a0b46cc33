#include "outbox/sqlite/internal/wal_guard.hpp"

#include <sqlite3.h>

#include <algorithm>
#include <thread>

namespace outbox::sqlite::internal {

bool has_wal_reset_bug() {
  const int v = sqlite3_libversion_number();
  const bool fixed = v >= 3051003 || (v >= 3044006 && v < 3045000) || (v >= 3050007 && v < 3051000);
  return v >= 3007000 && !fixed;
}

WalGuard::WalGuard(sqlite3* db) {
  const char* main = sqlite3_db_filename(db, "main");
  if (main != nullptr && *main != '\0') {
    guard_for(main);
  }
}

WalGuard::~WalGuard() {
  for (auto& [file, guard] : guards_) {
    sqlite3_close_v2(guard);
  }
}

sqlite3* WalGuard::guard_for(const std::string& file) {
  if (const auto it = guards_.find(file); it != guards_.end()) {
    return it->second;
  }
  // The file's own name (sqlite3_db_filename: absolute, no URI parameters): no shared cache with
  // the connection it guards, whose checkpoint would then find the tables locked.
  sqlite3* opened = nullptr;
  if (sqlite3_open_v2(file.c_str(), &opened, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX,
                      nullptr) != SQLITE_OK) {
    sqlite3_close_v2(opened);
    return nullptr;
  }
  sqlite3_busy_handler(opened, &WalGuard::on_busy, this);
  guards_.emplace(file, opened);
  return opened;
}

// As the pool's connections do (driver.cpp): retries after 20 µs, doubling up to 1 ms, so that the
// lock, free between other processes' transactions, is taken then rather than after a sleep of
// SQLite's default handler (up to 100 ms).
int WalGuard::on_busy(void* self, int count) {
  const auto* guard = static_cast<WalGuard*>(self);
  if (std::chrono::steady_clock::now() >= guard->deadline_) {
    return 0;
  }
  std::this_thread::sleep_for(std::min<std::chrono::microseconds>(
      std::chrono::microseconds(20L << std::min(count, 6)), std::chrono::milliseconds(1)));
  return 1;
}

std::optional<CheckpointFrames> WalGuard::checkpoint(sqlite3* db, const char* schema,
                                                     std::chrono::milliseconds wait) {
  const char* file = sqlite3_db_filename(db, schema);
  if (file == nullptr || *file == '\0') {
    return std::nullopt;
  }
  sqlite3* guard = guard_for(file);
  if (guard == nullptr) {
    return std::nullopt;
  }
  deadline_ = std::chrono::steady_clock::now() + wait;
  if (sqlite3_exec(guard, "BEGIN IMMEDIATE", nullptr, nullptr, nullptr) != SQLITE_OK) {
    if (sqlite3_get_autocommit(guard) == 0) {
      sqlite3_exec(guard, "ROLLBACK", nullptr, nullptr, nullptr);
    }
    return std::nullopt;
  }
  CheckpointFrames frames;
  const int rc = sqlite3_wal_checkpoint_v2(db, schema, SQLITE_CHECKPOINT_PASSIVE, &frames.log,
                                           &frames.checkpointed);
  // The guard wrote nothing: its rollback only gives the write lock back.
  sqlite3_exec(guard, "ROLLBACK", nullptr, nullptr, nullptr);
  if (rc != SQLITE_OK) {
    return std::nullopt;
  }
  return frames;
}

}  // namespace outbox::sqlite::internal
