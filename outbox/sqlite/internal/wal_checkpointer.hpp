#pragma once
// A SQLite pool's background checkpointer (one thread).

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/internal/wal_guard.hpp"
#include "outbox/sqlite/internal/write_gate.hpp"

namespace outbox::sqlite::internal {

/// The handle under a connection opened by sqlite::open (defined in driver.cpp).
sqlite3* handle_of(sql::Connection& conn);
/// How long that connection waits for a lock, polling as the pool's connections do (not SQLite's
/// sleeping default handler, which the pool's writers outpace).
void set_busy_wait(sql::Connection& conn, std::chrono::milliseconds wait);

/// Keeps the WAL bounded under constant load: a passive checkpoint every interval in which
/// something was committed, and once the WAL is long, a truncating one that waits (briefly) for
/// readers to move to the newest snapshot. With the WAL-reset bug the passive one runs under a
/// guard's write lock (wal_guard.hpp). Stops (joins its thread) on destruction.
class WalCheckpointer {
 public:
  /// `commits`: what the pool's commits checkpointed (a recent one stands for this round's).
  WalCheckpointer(std::string path, OpenOptions options, std::shared_ptr<WriteGate> gate,
                  std::shared_ptr<const CommitCheckpoints> commits);
  ~WalCheckpointer();
  WalCheckpointer(const WalCheckpointer&) = delete;
  WalCheckpointer& operator=(const WalCheckpointer&) = delete;

 private:
  void run();
  void tick(sql::Connection& conn, WalGuard* guard);
  std::optional<CheckpointFrames> passive(sql::Connection& conn, WalGuard* guard);
  bool truncate(sql::Connection& conn);

  std::string path_;
  OpenOptions options_;
  std::shared_ptr<WriteGate> gate_;  // the pool's
  std::shared_ptr<const CommitCheckpoints> commits_;
  int truncate_failures_ = 0;  // consecutive truncating checkpoints that readers outlasted
  std::chrono::steady_clock::time_point next_truncate_;  // writers' turn until then
  std::optional<std::int64_t> settled_;  // data_version when a checkpoint left nothing to do
  bool long_wal_ = false;  // the WAL held checkpoint_pages or more at the last checkpoint
  std::mutex mutex_;       // guards stop_
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace outbox::sqlite::internal
