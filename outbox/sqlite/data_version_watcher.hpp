#pragma once
// Wake-ups on SQLite across processes: PRAGMA data_version changes when another connection
// commits to the file.

#include <chrono>
#include <memory>
#include <string>

#include "outbox/change_watcher.hpp"

namespace outbox::sqlite {

/// ChangeWatcher that reads `PRAGMA data_version` every `interval` on a connection of its own
/// and signals Changed when it moved (any commit by another connection: other processes' writers,
/// and this process's own status writes, which cost one spurious cycle each). Give it to
/// OutboxPoller::Options::change_watcher.
class DataVersionWatcher final : public ChangeWatcher {
 public:
  struct Options {
    std::string path;                        ///< required: the database file (not created)
    std::chrono::milliseconds interval{20};  ///< between two reads; > 0
  };
  /// Throws std::invalid_argument naming a bad field. Opens the file in start().
  explicit DataVersionWatcher(Options options);
  /// Calls close().
  ~DataVersionWatcher() override;
  DataVersionWatcher(const DataVersionWatcher&) = delete;
  DataVersionWatcher& operator=(const DataVersionWatcher&) = delete;

  void start(std::function<void(Signal)> signal) override;
  void close() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::sqlite
