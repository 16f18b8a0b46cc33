#pragma once
// A hint that rows may have been committed, so a poller looks at once instead of after its
// interval. Hints may be lost or spurious: polling on the interval stays the backstop.

#include <functional>

namespace outbox {

/// Watches a table for commits by other connections (PostgreSQL LISTEN, SQLite data_version).
/// An OutboxPoller given one starts it with start() and stops it with close().
class ChangeWatcher {
 public:
  enum class Signal {
    Changed,    ///< something may have been committed
    Connected,  ///< the watcher (re)connected: hints sent while it was away are lost
  };
  virtual ~ChangeWatcher() = default;
  /// Starts watching on a thread of its own and calls `signal` from it (never concurrently with
  /// itself); a first Connected comes once watching began. Connection failures are logged and
  /// retried, never thrown. Called once.
  virtual void start(std::function<void(Signal)> signal) = 0;
  /// Stops and joins the thread; no call to `signal` follows. Idempotent.
  virtual void close() = 0;
};

}  // namespace outbox
