#pragma once
// Deletion of old rows.

#include <chrono>
#include <memory>

#include "outbox/clock.hpp"

namespace outbox {
namespace internal {
class PeriodicWorker;
}

namespace sql {
class Connection;
class ConnectionProvider;
}  // namespace sql

/// Deletes up to `limit` rows older than `before`; which rows depends on the purger (terminal rows
/// for status-based purgers, every row for age-based ones). Returns rows deleted; throws
/// outbox::StoreError. Implementations are thread-safe.
class EventPurger {
 public:
  virtual ~EventPurger() = default;
  virtual int purge(sql::Connection& conn, Timestamp before, int limit) = 0;
  /// purge() of the rows older than `retention`: before `now - retention` here; a purger on a
  /// database clock counts from the server's time instead (so a node with a skewed clock cannot
  /// purge what is still within retention).
  virtual int purge_older_than(sql::Connection& conn, std::chrono::microseconds retention,
                               Timestamp now, int limit) {
    return purge(conn, now - retention, limit);
  }
  /// True when the purger may delete rows that are not yet delivered (age-based purgers).
  virtual bool deletes_pending() const { return false; }
};

/// Runs a purger on a schedule, in batches, each batch on its own autocommitted connection.
/// Thread-safe.
class OutboxPurgeScheduler {
 public:
  struct Options {
    std::shared_ptr<sql::ConnectionProvider> connection_provider;  ///< required
    std::shared_ptr<EventPurger> purger;                           ///< required
    std::chrono::seconds retention{std::chrono::hours(24 * 7)};    ///< 0 … kMaxDuration
    int batch_size = 500;                                          ///< >= 1
    std::chrono::milliseconds interval{std::chrono::hours(1)};     ///< > 0, <= kMaxDuration
    std::shared_ptr<Clock> clock;                                  ///< default: Clock::system()
  };

  /// Validates (std::invalid_argument naming the field). Does not start.
  explicit OutboxPurgeScheduler(Options options);
  ~OutboxPurgeScheduler();
  OutboxPurgeScheduler(const OutboxPurgeScheduler&) = delete;
  OutboxPurgeScheduler& operator=(const OutboxPurgeScheduler&) = delete;

  /// Starts the schedule (a first run happens at once). Throws std::logic_error after close().
  void start();
  /// Purges everything older than now - retention, batch by batch, until a batch is short.
  /// Returns rows deleted; errors are logged and end the run (never thrown).
  int run_once();
  /// Stops the schedule. Idempotent.
  void close();

 private:
  Options options_;
  std::unique_ptr<internal::PeriodicWorker> worker_;  // last: stopped before the rest goes
};

}  // namespace outbox
