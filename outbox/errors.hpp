#pragma once
// Exceptions of the caller-facing API.

#include <chrono>
#include <stdexcept>
#include <string>
#include <utility>

namespace outbox {

/// A database failure: the driver's message, the SQLSTATE where the engine has one, and what the
/// failure left usable, so a caller can decide without reading the message. The subclasses below
/// name the causes that change what is safe; any other failure is a plain StoreError.
class StoreError : public std::runtime_error {
 public:
  /// `transaction_usable`: the transaction the failed call ran in is still open and only the
  /// failed statement was undone (see transaction_usable()).
  explicit StoreError(const std::string& message, std::string sqlstate = {},
                      bool transaction_usable = false)
      : std::runtime_error(message),
        sqlstate_(std::move(sqlstate)),
        transaction_usable_(transaction_usable) {}
  /// Five-character SQLSTATE, or empty when the engine has none.
  const std::string& sqlstate() const noexcept { return sqlstate_; }
  /// True when the transaction is still open and may go on and commit (MariaDB and SQLite undo
  /// only the failed statement). False when it must be rolled back (PostgreSQL aborts it on any
  /// error), has already ended, or none was open.
  bool transaction_usable() const noexcept { return transaction_usable_; }
  /// True when the connection can run further statements (after rolling back, when
  /// transaction_usable() is false). False for ConnectionLostError and CommitOutcomeUnknownError.
  virtual bool connection_usable() const noexcept { return true; }

 private:
  std::string sqlstate_;
  bool transaction_usable_;
};

/// The link to the server is gone or could not be made (PostgreSQL: SQLSTATE class 08, a
/// terminated or closed session; MariaDB: client errors 2006, 2013, 2055 or a killed session;
/// libpqxx: broken_connection). The connection is unusable and a pool discards it; a transaction
/// open on it is gone, rolled back by the server, so nothing it wrote was committed. Retrying the
/// whole transaction on a new connection is safe.
class ConnectionLostError : public StoreError {
 public:
  explicit ConnectionLostError(const std::string& message, std::string sqlstate = "08006")
      : StoreError(message, std::move(sqlstate)) {}
  bool connection_usable() const noexcept override { return false; }
};

/// COMMIT was sent but the connection died before its answer came (libpqxx: in_doubt_error): the
/// transaction may or may not have committed, and this connection, now unusable, cannot tell.
/// Retrying may write everything twice; look the rows up on another connection instead. The
/// outbox hands nothing to the hot path then: the poller delivers the events whose rows exist.
class CommitOutcomeUnknownError : public StoreError {
 public:
  explicit CommitOutcomeUnknownError(const std::string& message, std::string sqlstate = "08006")
      : StoreError(message, std::move(sqlstate)) {}
  bool connection_usable() const noexcept override { return false; }
};

/// A unique or primary-key constraint refused a row (PostgreSQL 23505, MariaDB 1062, SQLite
/// SQLITE_CONSTRAINT_PRIMARYKEY or _UNIQUE). Nothing of the statement was written; on PostgreSQL
/// the transaction is aborted, on MariaDB and SQLite it is still usable (transaction_usable()).
class UniqueViolationError : public StoreError {
 public:
  using StoreError::StoreError;
};

/// OutboxWriter's insert met an event id that is already in the outbox table (or twice in one
/// batch); the statement wrote nothing. On PostgreSQL the transaction is aborted and can only be
/// rolled back; on MariaDB and SQLite it is still usable: the rows written before stay and it may
/// commit.
class DuplicateEventError : public UniqueViolationError {
 public:
  DuplicateEventError(const std::string& message, const StoreError& cause)
      : UniqueViolationError(message, cause.sqlstate(), cause.transaction_usable()) {}
};

/// A write on behalf of a lease was refused because this process does not hold the lease (any
/// more): nothing was written, the transaction (if any) is still usable, and the lease's new
/// holder does the work. Stop acting for the lease.
class LeaseLostError : public StoreError {
 public:
  explicit LeaseLostError(const std::string& message) : StoreError(message, {}, true) {}
};

/// No listener is registered for an event's (aggregate type, event type): the event goes DEAD once.
class UnroutableEventError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by a listener when retrying cannot help (e.g. the receiver rejected the event as
/// invalid): the event goes DEAD at once with this message as its last error.
class PermanentFailure : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// Thrown by a listener to ask for redelivery after `delay`. With `count_attempt` false (the
/// default) the attempt counter is left unchanged, so deferring never leads to DEAD; with true it
/// counts as a failed attempt (RETRY, or DEAD at max attempts) but waits `delay` instead of the
/// retry policy. A delay of zero or less is no hint: the event fails like any other error
/// (counted attempt, the retry policy's backoff).
class RetryLater : public std::runtime_error {
 public:
  explicit RetryLater(std::chrono::milliseconds delay, std::string reason = "retry requested",
                      bool count_attempt = false)
      : std::runtime_error(std::move(reason)), delay_(delay), count_attempt_(count_attempt) {}
  std::chrono::milliseconds delay() const noexcept { return delay_; }
  bool count_attempt() const noexcept { return count_attempt_; }

 private:
  std::chrono::milliseconds delay_;
  bool count_attempt_;
};

}  // namespace outbox
