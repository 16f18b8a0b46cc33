#pragma once
// Transaction lifecycle seam: how the writer finds the caller's transaction.

#include <functional>

namespace outbox {
namespace sql {
class Connection;
}

/// The caller's current transaction. Implementations say whether they are thread-safe.
class TxContext {
 public:
  virtual ~TxContext() = default;
  /// True when a transaction is open for the calling thread.
  virtual bool is_transaction_active() const = 0;
  /// The connection the business code uses. Throws std::logic_error with no active transaction.
  virtual sql::Connection& current_connection() const = 0;
  /// Runs `callback` only after a successful commit. Throws std::logic_error with no transaction.
  virtual void after_commit(std::function<void()> callback) = 0;
  /// Runs `callback` after a rollback (or a failed commit). Throws std::logic_error likewise.
  virtual void after_rollback(std::function<void()> callback) = 0;
  /// Runs `callback` instead of either list when the commit's outcome is unknown
  /// (CommitOutcomeUnknownError). A context that never reports such an outcome may drop it, as
  /// this default does.
  virtual void after_unknown_outcome(std::function<void()> /*callback*/) {}
};

}  // namespace outbox
