#pragma once
// Helpers shared by the tests: throwaway directories and bounded waiting on a condition.

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include <stdlib.h>

#include "outbox/clock.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/pool.hpp"
#include "outbox/store.hpp"

namespace outbox::testing {

/// A fresh directory under $TMPDIR, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "outbox-test-XXXXXX").string();
    if (mkdtemp(tmpl.data()) == nullptr) {
      throw std::runtime_error("mkdtemp failed");
    }
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
};

/// Polls `condition` until it holds or `timeout` passes; returns its last value. The deadline is
/// generous on purpose: it bounds a hung test, it is not a performance expectation.
inline bool wait_until(const std::function<bool()>& condition,
                       std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline) {
      return condition();
    }
    // The poll interval of a bounded wait (not a fixed delay the test depends on): short enough
    // to react quickly, long enough not to steal a core from the code under test.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  return true;
}

/// A clock the test moves by hand. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Timestamp start = std::chrono::system_clock::now()) : now_(start) {}
  Timestamp now() const override {
    std::lock_guard lock(mutex_);
    return now_;
  }
  void advance(std::chrono::microseconds d) {
    std::lock_guard lock(mutex_);
    now_ += d;
  }

 private:
  mutable std::mutex mutex_;
  Timestamp now_;
};

/// A one-shot gate listeners can block on until the test opens it. Opened when destroyed too,
/// once its waiters have left: a test that returns early (a failed ASSERT) then ends instead of
/// hanging on its blocked listeners.
class Gate {
 public:
  Gate() = default;
  ~Gate() {
    open();
    std::unique_lock lock(mutex_);
    left_.wait(lock, [&] { return waiting_ == 0; });
  }
  Gate(const Gate&) = delete;
  Gate& operator=(const Gate&) = delete;
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    ++waiting_;
    cv_.wait(lock, [&] { return open_; });
    if (--waiting_ == 0) {
      left_.notify_all();
    }
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::condition_variable left_;  // the last waiter left
  bool open_ = false;
  int waiting_ = 0;
};

/// Row queries for a fixture with `pool` and `store` members (CRTP: Fixture derives from
/// RowQueries<Fixture> and befriends it).
template <typename Fixture>
class RowQueries {
 public:
  std::optional<OutboxEvent> row(const std::string& id) {
    return self().store->find(*self().pool->acquire(), id);
  }
  EventStatus status(const std::string& id) { return row(id).value().status; }
  std::int64_t count(EventStatus s) {
    return self().store->count_by_status(*self().pool->acquire())[static_cast<std::size_t>(s)];
  }
  /// Waits (bounded) until the row has status `s`.
  bool wait_status(const std::string& id, EventStatus s) {
    return wait_until([&] {
      auto r = row(id);
      return r && r->status == s;
    });
  }

 private:
  Fixture& self() { return static_cast<Fixture&>(*this); }
};

}  // namespace outbox::testing
