#pragma once
// The API business code calls inside its transaction.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/envelope.hpp"
#include "outbox/trace_context.hpp"

namespace outbox {

class TxContext;
class OutboxStore;
class MetricsExporter;

/// Lifecycle hook around writes. Implementations must be thread-safe.
class WriterHook {
 public:
  virtual ~WriterHook() = default;
  /// May transform the events; an empty result suppresses the write.
  virtual std::vector<EventEnvelope> before_write(std::vector<EventEnvelope> events) {
    return events;
  }
  /// After the rows are inserted, before commit. Exceptions are logged and swallowed.
  virtual void after_write(const std::vector<EventEnvelope>&) {}
  /// After a successful commit. Exceptions are logged and swallowed.
  virtual void after_commit(const std::vector<EventEnvelope>&) {}
  /// After a rollback. Exceptions are logged and swallowed.
  virtual void after_rollback(const std::vector<EventEnvelope>&) {}
  /// After a commit whose outcome is unknown (CommitOutcomeUnknownError): the rows may or may not
  /// exist, so nothing may be delivered from here; the poller delivers the ones that were
  /// committed. Exceptions are logged and swallowed.
  virtual void after_unknown_outcome(const std::vector<EventEnvelope>&) {}
  /// Non-empty: rows are inserted already claimed by this owner (multi-node hot path).
  virtual std::string_view lock_owner() const { return {}; }
};

/// Writes events into the caller's current transaction. Thread-safe (each call uses the calling
/// thread's transaction).
class OutboxWriter {
 public:
  /// Throws std::invalid_argument if `tx_context` or `store` is null. No hook = no hot path.
  /// `trace_context` stamps each event with the caller's trace (stamp_trace_context); an invalid
  /// traceparent/tracestate is removed, logged and counted in `metrics`, never an error.
  OutboxWriter(std::shared_ptr<TxContext> tx_context, std::shared_ptr<OutboxStore> store,
               std::shared_ptr<WriterHook> hook = {}, TraceContextProvider trace_context = {},
               std::shared_ptr<MetricsExporter> metrics = {});

  /// Inserts one event; returns its id, or nullopt when the hook suppressed it. Throws
  /// std::logic_error with no active transaction. A failed insert wrote nothing and left no
  /// callback; it throws
  /// - DuplicateEventError: the event id is in the table already. PostgreSQL: the transaction is
  ///   aborted and can only be rolled back; MariaDB, SQLite: it goes on and may commit.
  /// - ConnectionLostError: the transaction is gone (the server rolled it back) and the connection
  ///   unusable; roll back (the after-rollback callbacks run) and retry on a new transaction.
  /// - StoreError otherwise: transaction_usable() says whether the transaction may go on.
  /// After commit, events whose rows a plain-SQL savepoint or ROLLBACK undid do not reach the
  /// hook's after_commit (they get after_rollback); after a CommitOutcomeUnknownError the hook
  /// gets after_unknown_outcome and nothing goes to the hot path.
  std::optional<std::string> write(const EventEnvelope& event);
  /// Shorthand for write(EventEnvelope::of_json(type, payload_json)).
  std::optional<std::string> write(EventType type, std::string payload_json);
  /// Inserts all events (one multi-row insert where possible) with one after-commit callback;
  /// returns their ids (empty when suppressed). Throws like write(); a batch too large for one
  /// statement (500 rows; MariaDB: its packet limit) is several, and on MariaDB and SQLite those
  /// before the failing one stay in the transaction (the poller delivers them if it commits).
  std::vector<std::string> write_all(std::vector<EventEnvelope> events);

 private:
  std::shared_ptr<TxContext> tx_context_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<WriterHook> hook_;
  TraceContextProvider trace_context_;
  std::shared_ptr<MetricsExporter> metrics_;
};

}  // namespace outbox
