#include "outbox/sqlite/internal/wal_checkpointer.hpp"

#include <algorithm>
#include <utility>
#include <vector>

#include "outbox/log.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::sqlite::internal {

WalCheckpointer::WalCheckpointer(std::string path, OpenOptions options,
                                 std::shared_ptr<WriteGate> gate,
                                 std::shared_ptr<const CommitCheckpoints> commits)
    : path_(std::move(path)),
      options_(std::move(options)),
      gate_(std::move(gate)),
      commits_(std::move(commits)),
      thread_([this] { run(); }) {}

WalCheckpointer::~WalCheckpointer() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void WalCheckpointer::run() {
  std::unique_ptr<sql::Connection> conn;
  std::unique_ptr<WalGuard> guard;
  std::unique_lock lock(mutex_);
  while (!wake_.wait_for(lock, options_.checkpoint_interval, [&] { return stop_; })) {
    lock.unlock();
    try {
      if (!conn) {
        OpenOptions own = options_;
        own.create = false;
        conn = open(path_, own);
        guard = has_wal_reset_bug() ? std::make_unique<WalGuard>(handle_of(*conn)) : nullptr;
        settled_.reset();
      }
      tick(*conn, guard.get());
    } catch (const std::exception& e) {
      conn.reset();  // busy readers or a lost file: try again next time
      log(LogLevel::Debug, std::string("sqlite: checkpoint skipped: ") + e.what());
    }
    lock.lock();
  }
}

void WalCheckpointer::tick(sql::Connection& conn, WalGuard* guard) {
  // Nothing committed since a checkpoint that left nothing to do: none is started (one that
  // starts on a wholly checkpointed WAL is the one the WAL-reset bug needs).
  const auto version = conn.query("PRAGMA data_version")[0].get_int(0);
  if (settled_ == version) {
    return;
  }
  const bool truncate_due = std::chrono::steady_clock::now() >= next_truncate_;
  if (long_wal_ && truncate_due) {
    // Long last time: the truncating checkpoint copies it too, under a write lock of its own,
    // without first waiting its turn for a passive one.
    settled_ = truncate(conn) ? std::optional<std::int64_t>(version) : std::nullopt;
    return;
  }
  // A commit of this pool checkpointed within the interval: its figure stands for a passive
  // checkpoint of this round, which would hold the pool's writers back once more (SQLite's
  // drain lost about 8 % to it).
  std::optional<CheckpointFrames> frames;
  const auto committed_at = commits_ ? commits_->at.load() : 0;
  if (committed_at != 0 &&
      std::chrono::steady_clock::now().time_since_epoch().count() - committed_at <
          std::chrono::duration_cast<std::chrono::nanoseconds>(options_.checkpoint_interval)
              .count()) {
    frames = CheckpointFrames{commits_->log.load(), -1};  // copied: unknown, so never settled
  } else {
    frames = passive(conn, guard);
  }
  if (!frames) {
    return;  // the write lock stayed taken: next time
  }
  long_wal_ = frames->log >= options_.checkpoint_pages;
  bool settled = !long_wal_ && frames->checkpointed == frames->log;
  if (long_wal_ && truncate_due) {
    settled = truncate(conn);
  }
  settled_ = settled ? std::optional<std::int64_t>(version) : std::nullopt;
}

std::optional<CheckpointFrames> WalCheckpointer::passive(sql::Connection& conn, WalGuard* guard) {
  if (guard == nullptr) {
    const auto rows = conn.query("PRAGMA wal_checkpoint(PASSIVE)");
    return CheckpointFrames{static_cast<int>(rows.at(0).get_int(1)),
                            static_cast<int>(rows.at(0).get_int(2))};
  }
  // The pool's own writers wait at the gate meanwhile rather than poll SQLite's lock.
  if (!gate_->take_for_checkpoint(options_.checkpoint_interval)) {
    return std::nullopt;
  }
  auto frames = guard->checkpoint(handle_of(conn), "main", options_.checkpoint_interval);
  gate_->release();
  return frames;
}

// The truncating checkpoint waits for the readers still on older snapshots, holding off writers
// meanwhile: 100 ms first, doubled after each attempt that readers outlasted, up to 1.6 s; after
// a blocked attempt writers get as long again before the next one, so a writer with a busy
// timeout of 2 s or more always gets through. It takes the write lock itself (with the WAL-reset
// bug, only a lock it could not get within the wait would leave it passive and unguarded).
bool WalCheckpointer::truncate(sql::Connection& conn) {
  const auto wait = std::chrono::milliseconds(100L << truncate_failures_);
  // The pool's writers wait at the gate meanwhile: racing them for the write lock it lost most
  // times, and SQLite then copied without the lock (a hostile round saw half the truncations so).
  if (!gate_->take_for_checkpoint(wait)) {
    return false;
  }
  std::vector<sql::Row> result;
  try {
    set_busy_wait(conn, wait);
    result = conn.query("PRAGMA wal_checkpoint(TRUNCATE)");
  } catch (...) {
    gate_->release();
    throw;
  }
  gate_->release();
  const bool blocked = result.empty() || result[0].get_int(0) != 0;
  long_wal_ = blocked;
  truncate_failures_ = blocked ? std::min(truncate_failures_ + 1, 4) : 0;
  next_truncate_ = blocked ? std::chrono::steady_clock::now() + wait : next_truncate_;
  return !blocked;
}

}  // namespace outbox::sqlite::internal
