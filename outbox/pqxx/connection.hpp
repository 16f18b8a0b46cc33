#pragma once
// A sql::Connection over a libpqxx transaction the caller owns, so a service that uses libpqxx
// writes its business rows and its outbox rows in one pqxx::work (with PostgresOutboxStore).

#include <memory>

#include "outbox/sql/connection.hpp"

namespace pqxx {
class transaction_base;
}

namespace outbox::pqxx_adapter {

/// Runs statements ($1 … parameters) inside `tx`, which must outlive the returned connection.
/// begin/commit/rollback throw std::logic_error: the caller commits through libpqxx and reports
/// the outcome to an ExternalTransaction. Database errors throw outbox::StoreError with SQLSTATE.
std::unique_ptr<sql::Connection> wrap(pqxx::transaction_base& tx);

}  // namespace outbox::pqxx_adapter
