#pragma once
// Wake-ups on PostgreSQL: writers NOTIFY after commit, pollers LISTEN. A hint only: the poller's
// interval stays the backstop, so a lost notification delays an event, never loses it.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>

#include "outbox/change_watcher.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/writer.hpp"

namespace outbox::postgres {

/// The channel of `table`'s wake-ups: its name in lower case (`SELECT pg_notify('outbox_event',
/// '')` from other writers). Throws std::invalid_argument when empty or over 63 bytes.
std::string notification_channel(std::string_view table);

/// WriterHook that sends one payload-less NOTIFY after commits of events, on a connection of its
/// own and at most once per min_interval however many commits there were — never inside the
/// business transaction, whose commit NOTIFY would serialize on PostgreSQL's cluster-wide
/// notification lock. Give it to Outbox::Options::writer_hooks. Thread-safe.
class CommitNotifier final : public WriterHook {
 public:
  struct Options {
    /// Required: open_dedicated() gives the notifier its connection; a provider without one
    /// lends a connection per NOTIFY.
    std::shared_ptr<sql::ConnectionProvider> connection_provider;
    std::string table = "outbox_event";          ///< whose pollers to wake
    std::chrono::milliseconds min_interval{50};  ///< between two NOTIFYs; > 0
  };
  /// Throws std::invalid_argument naming a bad field. Its thread starts at the first commit.
  explicit CommitNotifier(Options options);
  /// Calls close().
  ~CommitNotifier() override;
  CommitNotifier(const CommitNotifier&) = delete;
  CommitNotifier& operator=(const CommitNotifier&) = delete;

  /// Asks for a NOTIFY; returns at once (the business thread never waits on it).
  void after_commit(const std::vector<EventEnvelope>& events) override;
  /// Sends the NOTIFY still owed (one attempt), stops the thread. Idempotent; later commits
  /// notify nobody.
  void close();
  /// NOTIFYs sent so far.
  std::uint64_t sent() const;

 private:
  void run();

  Options options_;
  std::string channel_;
  mutable std::mutex mutex_;  // guards the fields below
  std::condition_variable wake_;
  bool owed_ = false;
  bool closed_ = false;
  std::uint64_t sent_ = 0;
  std::thread thread_;
};

/// ChangeWatcher that LISTENs on a table's channel on a connection of its own (a direct one:
/// LISTEN does not survive a transaction pooler such as PgBouncer in transaction mode) and
/// reconnects when it is lost, signalling Connected each time. Give it to
/// OutboxPoller::Options::change_watcher.
class NotificationWatcher final : public ChangeWatcher {
 public:
  struct Options {
    std::string conninfo;  ///< required: libpq URL or key=value string
    std::string table = "outbox_event";
    sql::NetworkTimeouts timeouts;
    /// Longest wait between two connection attempts (they start at 100 ms and double).
    std::chrono::milliseconds reconnect_max{5000};
    /// The session's application_name unless conninfo sets one.
    std::string application_name = "outbox-wakeup";
  };
  /// Throws std::invalid_argument naming a bad field. Connects in start().
  explicit NotificationWatcher(Options options);
  /// Calls close().
  ~NotificationWatcher() override;
  NotificationWatcher(const NotificationWatcher&) = delete;
  NotificationWatcher& operator=(const NotificationWatcher&) = delete;

  void start(std::function<void(Signal)> signal) override;
  void close() override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::postgres
