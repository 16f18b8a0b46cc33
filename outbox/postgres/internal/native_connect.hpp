#pragma once
// libpq connections with the driver's network settings, for code that needs the PGconn itself
// (LISTEN waits on its socket).

#include <string>

#include "outbox/sql/connection.hpp"

struct pg_conn;

namespace outbox::postgres::internal {

/// Connects with connect_timeout, keepalives and tcp_user_timeout from `timeouts` unless
/// `conninfo` sets them, and `application_name` unless it sets one (empty: none). The caller owns
/// the result (PQfinish). Throws ConnectionLostError (secrets redacted).
pg_conn* open_native(const std::string& conninfo, const sql::NetworkTimeouts& timeouts,
                     const std::string& application_name = {});
/// The same settings, connecting without blocking (PQconnectStartParams: drive it with
/// PQconnectPoll). nullptr only when out of memory; the caller owns the result (PQfinish).
pg_conn* start_native(const std::string& conninfo, const sql::NetworkTimeouts& timeouts,
                      const std::string& application_name = {});

}  // namespace outbox::postgres::internal
