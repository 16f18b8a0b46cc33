#pragma once
// A sql::Connection over a libpqxx transaction the caller owns, so a service that uses libpqxx
// writes its business rows and its outbox rows in one pqxx::work (with PostgresOutboxStore).

#include <memory>

#include "outbox/sql/connection.hpp"

namespace pqxx {
class transaction_base;
}

namespace outbox {
class ExternalTransaction;
}

namespace outbox::pqxx_adapter {

/// Runs statements ($1 … parameters) inside `tx`, which must outlive the returned connection.
/// begin/commit/rollback throw std::logic_error: the caller commits through libpqxx and reports
/// the outcome to an ExternalTransaction. Database errors throw outbox::StoreError with SQLSTATE.
std::unique_ptr<sql::Connection> wrap(pqxx::transaction_base& tx);

/// Commits `tx` and reports the outcome to `ext` (bound to the connection wrapped from `tx`):
/// committed() on success. After a failed statement through that connection (PostgreSQL then
/// aborts the transaction) or on a lost connection it aborts `tx` instead, reports rolled_back()
/// and throws StoreError (25P02) or ConnectionLostError. pqxx::in_doubt_error (the connection died
/// during COMMIT) reports outcome_unknown() and throws CommitOutcomeUnknownError; any other libpqxx
/// failure reports rolled_back() and throws ConnectionLostError or StoreError.
void commit(pqxx::transaction_base& tx, ExternalTransaction& ext);

}  // namespace outbox::pqxx_adapter
