#include "outbox/sqlite/data_version_watcher.hpp"

#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "outbox/log.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sqlite/driver.hpp"

namespace outbox::sqlite {

struct DataVersionWatcher::Impl {
  Options options;
  std::function<void(Signal)> signal;
  std::mutex mutex;  // guards started, closed
  std::condition_variable wake;
  bool started = false;
  bool closed = false;
  std::thread thread;

  // Waits `d` or until close(); true when closed.
  bool wait(std::chrono::milliseconds d) {
    std::unique_lock lock(mutex);
    return wake.wait_for(lock, d, [&] { return closed; });
  }

  static std::int64_t version(sql::Connection& conn) {
    const auto rows = conn.query("PRAGMA data_version", {});
    if (rows.empty() || rows.front().size() == 0) {
      throw std::runtime_error("PRAGMA data_version returned no row");
    }
    return rows.front().get_int(0);
  }

  void run() {
    std::unique_ptr<sql::Connection> conn;
    std::int64_t seen = 0;
    int failures = 0;
    for (;;) {
      try {
        if (!conn) {
          // The connection never writes: every change it sees is another connection's commit.
          conn = open(options.path,
                      OpenOptions{.wal = false, .synchronous_normal = false, .create = false});
          seen = version(*conn);
          log(LogLevel::Info, "DataVersionWatcher: watching " + options.path +
                                  (failures > 0 ? " again" : "") + " for commits");
          failures = 0;
          signal(Signal::Connected);
        } else if (const auto now = version(*conn); now != seen) {
          seen = now;
          signal(Signal::Changed);
        }
      } catch (const std::exception& e) {
        conn.reset();
        if (++failures == 1 || failures % 100 == 0) {
          log(LogLevel::Warning, "DataVersionWatcher: " + std::string(e.what()) + " (" +
                                     std::to_string(failures) +
                                     " in a row; polling on the interval meanwhile)");
        }
      }
      // After a failure, retry at most every second rather than every interval.
      const auto pause =
          conn ? options.interval : std::max(options.interval, std::chrono::milliseconds(1000));
      if (wait(pause)) {
        return;
      }
    }
  }
};

DataVersionWatcher::DataVersionWatcher(Options options) : impl_(std::make_unique<Impl>()) {
  if (options.path.empty()) {
    throw std::invalid_argument("DataVersionWatcher: path is required");
  }
  if (options.interval.count() <= 0) {
    throw std::invalid_argument("DataVersionWatcher: interval must be positive");
  }
  impl_->options = std::move(options);
}

DataVersionWatcher::~DataVersionWatcher() {
  close();
}

void DataVersionWatcher::start(std::function<void(Signal)> signal) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->started || impl_->closed) {
    return;
  }
  impl_->started = true;
  impl_->signal = std::move(signal);
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

void DataVersionWatcher::close() {
  std::thread thread;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->closed) {
      return;
    }
    impl_->closed = true;
    thread = std::move(impl_->thread);
  }
  impl_->wake.notify_all();
  if (thread.joinable()) {
    thread.join();
  }
}

}  // namespace outbox::sqlite
