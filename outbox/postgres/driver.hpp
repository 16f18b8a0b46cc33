#pragma once
// PostgreSQL driver for the sql::Connection interface (libpq; its header stays out of here).
// Parameters are written $1, $2 … as in PostgreSQL itself.

#include <memory>
#include <string>

#include "outbox/sql/connection.hpp"
#include "outbox/sql/pool.hpp"

struct pg_conn;

namespace outbox::postgres {

/// Opens a connection from a libpq connection string or URI, with connect_timeout, TCP
/// keepalives and tcp_user_timeout from `timeouts` unless the string sets them, and JIT
/// compilation off for the session (`SET jit = off`). Throws outbox::StoreError.
std::unique_ptr<sql::Connection> connect(const std::string& conninfo,
                                         const sql::NetworkTimeouts& timeouts = {});

/// Wraps a caller-owned connection; the caller keeps ownership and must outlive the wrapper.
/// It prepares no named statements (the caller's pool may DISCARD ALL or reset the session).
std::unique_ptr<sql::Connection> wrap(pg_conn* conn);

/// A pool of connections to one database.
std::shared_ptr<sql::ConnectionPool> make_pool(const std::string& conninfo,
                                               std::size_t max_size = 8,
                                               const sql::NetworkTimeouts& timeouts = {});

}  // namespace outbox::postgres
