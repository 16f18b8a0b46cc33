#pragma once
// Manual transactions: ThreadLocalTxContext + TransactionManager.

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "outbox/sql/connection.hpp"
#include "outbox/tx_context.hpp"

namespace outbox {

class Transaction;
class Savepoint;

/// A TxContext bound to the calling thread: each thread sees the transaction it began through a
/// TransactionManager using this context. Thread-safe (state is per thread).
class ThreadLocalTxContext final : public TxContext {
 public:
  ThreadLocalTxContext() = default;
  ~ThreadLocalTxContext() override;
  ThreadLocalTxContext(const ThreadLocalTxContext&) = delete;
  ThreadLocalTxContext& operator=(const ThreadLocalTxContext&) = delete;

  bool is_transaction_active() const override;
  sql::Connection& current_connection() const override;
  void after_commit(std::function<void()> callback) override;
  void after_rollback(std::function<void()> callback) override;
  void after_unknown_outcome(std::function<void()> callback) override;

 private:
  friend class Transaction;
  friend class ExternalTransaction;
  friend class Savepoint;
  struct Frame {
    sql::Connection* connection = nullptr;
    std::vector<std::function<void()>> on_commit;
    std::vector<std::function<void()>> on_rollback;
    std::vector<std::function<void()>> on_unknown;
    // Open savepoints, outermost first, with the callback counts when each began.
    struct Mark {
      Savepoint* savepoint;
      std::size_t commits;
      std::size_t rollbacks;
      std::size_t unknowns;
    };
    std::vector<Mark> savepoints;
    std::size_t savepoint_names = 0;  // names are never reused within a transaction
    /// How the transaction ended, for the callbacks.
    enum class Outcome { Committed, RolledBack, Unknown };
    /// Detaches the open savepoints and runs the callbacks of `outcome`: the transaction is over.
    void end(Outcome outcome) noexcept;
  };
  Frame* frame() const;
  void bind(Frame* frame);
  void unbind();
};

/// An open transaction on a borrowed connection. Rolls back in its destructor if neither commit()
/// nor rollback() ran. Move-only; use on the thread that began it.
class Transaction {
 public:
  Transaction(Transaction&& other) noexcept;
  Transaction& operator=(Transaction&&) = delete;
  Transaction(const Transaction&) = delete;
  Transaction& operator=(const Transaction&) = delete;
  ~Transaction();

  /// The transaction's connection, for the business statements.
  sql::Connection& connection() const;
  /// Commits, then runs after-commit callbacks (their exceptions are logged, not thrown). Throws
  /// std::logic_error if the transaction is already finished. After a failure it is finished too:
  /// - CommitOutcomeUnknownError: the COMMIT's answer was lost and it may have committed. Neither
  ///   after-commit nor after-rollback callbacks run, the after-unknown-outcome ones do (the
  ///   writer's hand nothing to the hot path: the poller delivers the events whose rows exist).
  ///   The connection is discarded.
  /// - ConnectionLostError: nothing was committed; after-rollback callbacks run; the connection
  ///   is discarded.
  /// - any other StoreError: this COMMIT committed nothing (what an implicit commit, such as
  ///   MariaDB's DDL, committed before stays committed); the transaction is rolled back if still
  ///   open, after-rollback callbacks run and the connection goes back to its pool.
  void commit();
  /// Rolls back and runs after-rollback callbacks. After a ConnectionLostError there is nothing
  /// left to roll back (the server did) and it returns normally. If the ROLLBACK fails it throws
  /// StoreError after the callbacks ran; the connection is discarded. Throws std::logic_error if
  /// already finished.
  void rollback();
  /// True until commit() or rollback().
  bool active() const noexcept { return active_; }
  /// Opens a SQL savepoint that keeps the outbox in step (see Savepoint). Throws
  /// std::logic_error if the transaction is finished, outbox::StoreError on database failure.
  Savepoint savepoint();

 private:
  friend class TransactionManager;
  Transaction(sql::PooledConnection conn, ThreadLocalTxContext& context);
  void finish(ThreadLocalTxContext::Frame::Outcome outcome) noexcept;

  sql::PooledConnection conn_;
  ThreadLocalTxContext* context_;
  std::unique_ptr<ThreadLocalTxContext::Frame> frame_;
  bool active_ = true;
};

/// A transaction the caller began and will end on a connection it owns (a wrapped sqlite3*,
/// PGconn*, MYSQL* or libpqxx transaction), made visible to OutboxWriter through a
/// ThreadLocalTxContext for as long as this object lives. The caller ends the transaction with its
/// own API and then reports the outcome; without a report the destructor assumes a rollback.
/// Neither copyable nor movable (the thread's context points at it): keep it in the scope of the
/// caller's transaction, on the thread that created it.
class ExternalTransaction {
 public:
  /// Binds `connection` (which must stay open) for the calling thread. Throws std::logic_error if
  /// the thread already has a transaction on `context`.
  ExternalTransaction(ThreadLocalTxContext& context, sql::Connection& connection);
  ExternalTransaction(const ExternalTransaction&) = delete;
  ExternalTransaction& operator=(const ExternalTransaction&) = delete;
  ExternalTransaction(ExternalTransaction&&) = delete;
  ExternalTransaction& operator=(ExternalTransaction&&) = delete;
  ~ExternalTransaction();
  /// The bound connection. Throws std::logic_error once the outcome is reported.
  sql::Connection& connection() const;
  /// The caller committed: runs after-commit callbacks (the hot path). Throws std::logic_error if
  /// already reported.
  void committed();
  /// The caller rolled back: runs after-rollback callbacks. Throws std::logic_error likewise.
  void rolled_back();
  /// The caller's COMMIT got no answer (the connection died meanwhile; libpqxx: in_doubt_error):
  /// runs the after-unknown-outcome callbacks only, so the hot path hands nothing over and the
  /// poller delivers the events whose rows were committed. Throws std::logic_error likewise.
  void outcome_unknown();
  /// Opens a savepoint on the bound connection (see Savepoint): prefer it to a SAVEPOINT of your
  /// own around outbox writes. Throws std::logic_error once reported, StoreError on failure.
  Savepoint savepoint();

 private:
  void finish(ThreadLocalTxContext::Frame::Outcome outcome);
  ThreadLocalTxContext* context_;
  std::unique_ptr<ThreadLocalTxContext::Frame> frame_;
};

/// A SQL savepoint that keeps the outbox in step with the rows: rolled back, the events written
/// since it began are forgotten by the hot path too (their after-rollback callbacks run, their
/// after-commit and after-unknown-outcome callbacks are dropped), so an event whose row was undone
/// is never delivered. A SAVEPOINT run as plain SQL instead makes OutboxWriter check after commit
/// that each event's row exists (see sql::Connection::transaction_suspect). Savepoints nest; end
/// them innermost first. Without release() or rollback() the destructor rolls back. Move-only; use
/// on the thread of its transaction.
class Savepoint {
 public:
  Savepoint(Savepoint&& other) noexcept;
  Savepoint& operator=(Savepoint&&) = delete;
  Savepoint(const Savepoint&) = delete;
  Savepoint& operator=(const Savepoint&) = delete;
  ~Savepoint();

  /// ROLLBACK TO the savepoint (then RELEASE it). Throws std::logic_error if it already ended or
  /// an inner savepoint is still open, outbox::StoreError on database failure.
  void rollback();
  /// RELEASE: what was written since stays in the transaction. Throws as rollback().
  void release();
  /// True until rollback(), release() or the end of its transaction.
  bool active() const noexcept { return frame_ != nullptr; }

 private:
  friend class Transaction;
  friend class ExternalTransaction;
  friend struct ThreadLocalTxContext::Frame;
  explicit Savepoint(ThreadLocalTxContext::Frame& frame);
  std::size_t position(const char* what) const;
  static void run(sql::Connection& conn, const std::string& sql);

  ThreadLocalTxContext::Frame* frame_;
  std::string name_;
};

/// Begins transactions on connections from a provider and binds them to a ThreadLocalTxContext.
/// Thread-safe.
class TransactionManager {
 public:
  TransactionManager(std::shared_ptr<sql::ConnectionProvider> provider,
                     std::shared_ptr<ThreadLocalTxContext> context);
  /// Borrows a connection and begins. Throws std::logic_error if this thread already has a
  /// transaction on the same context, outbox::StoreError on database failure.
  Transaction begin();

 private:
  std::shared_ptr<sql::ConnectionProvider> provider_;
  std::shared_ptr<ThreadLocalTxContext> context_;
};

}  // namespace outbox
