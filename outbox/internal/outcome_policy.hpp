#pragma once
// What a delivery result does to an event's row (the outcome policy), and the writer of the
// statuses that are not batched DONE marks.

#include <chrono>
#include <memory>
#include <string>

#include "outbox/clock.hpp"
#include "outbox/delivery_result.hpp"

namespace outbox {
class OutboxStore;
class RetryPolicy;
class MetricsExporter;
namespace sql {
class Connection;
class ConnectionProvider;
}  // namespace sql
}  // namespace outbox

namespace outbox::internal {

/// The row's next status.
struct StatusChange {
  enum class Outcome { Done, Retry, Deferred, Dead };
  Outcome outcome = Outcome::Done;
  std::chrono::milliseconds delay{0};  ///< Retry / Deferred: due after this
  std::string message;                 ///< stored as last_error
  bool count_attempt = true;           ///< Retry / Dead: attempts + 1
};

/// The status `result` leads to for a row with `attempts` recorded attempts: Delivered → DONE;
/// Unroutable → DEAD (uncounted); Permanent → DEAD; RetryLater with a delay → deferred (counted
/// only when asked, DEAD at max_attempts then); anything else a counted attempt → RETRY after the
/// policy's delay, or DEAD at max_attempts.
StatusChange decide_status(const DeliveryResult& result, int attempts, int max_attempts,
                           const RetryPolicy& policy);

/// Writes one row's status change at once (RETRY, deferral, DEAD, and DONE in ordered mode).
/// Thread-safe.
class StatusWriter {
 public:
  StatusWriter(std::shared_ptr<sql::ConnectionProvider> provider,
               std::shared_ptr<OutboxStore> store, std::shared_ptr<Clock> clock,
               std::shared_ptr<MetricsExporter> metrics, std::string claim_owner)
      : provider_(std::move(provider)),
        store_(std::move(store)),
        clock_(std::move(clock)),
        metrics_(std::move(metrics)),
        owner_(std::move(claim_owner)) {}
  /// False (logged, counted as a status update failure) when it could not be written: the row
  /// stays pending and the poller brings the event back.
  bool write(const std::string& event_id, const StatusChange& change);
  /// Writes it on `conn` (in the caller's transaction), once. Throws StoreError.
  void write_in(sql::Connection& conn, const std::string& event_id, const StatusChange& change) {
    write_once(conn, event_id, change, change.message);
  }

 private:
  void write_once(sql::Connection& conn, const std::string& event_id, const StatusChange& change,
                  const std::string& message);

  std::shared_ptr<sql::ConnectionProvider> provider_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<Clock> clock_;
  std::shared_ptr<MetricsExporter> metrics_;
  std::string owner_;
};

}  // namespace outbox::internal
