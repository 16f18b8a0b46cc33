#pragma once
// MariaDB/MySQL driver for the sql::Connection interface (MariaDB Connector/C; its header stays out
// of here). Parameters are written `?`. Server-side prepared statements, binary-safe.

#include <memory>
#include <string>

#include "outbox/sql/connection.hpp"
#include "outbox/sql/pool.hpp"

struct st_mysql;

namespace outbox::mysql {

/// Where and how to connect.
struct ConnectOptions {
  std::string host = "127.0.0.1";
  unsigned port = 3306;
  std::string user = "root";
  std::string password;
  std::string database;
  sql::NetworkTimeouts timeouts;  ///< connect, and each read and write (io); whole seconds
};

/// Parses mysql://user:password@host:port/database (also mariadb://). The password may instead come
/// from the environment variable named by `password_env` when the URL has none. Throws
/// std::invalid_argument on a malformed URL.
ConnectOptions parse_url(const std::string& url, const char* password_env = "OUTBOX_DB_PASSWORD");

/// Opens a connection: UTC session time zone, READ COMMITTED, strict SQL mode (too long a value
/// is an error, never cut), "found rows" counts for UPDATE, connect/read/write timeouts. Throws
/// outbox::StoreError.
std::unique_ptr<sql::Connection> connect(const ConnectOptions& options);
std::unique_ptr<sql::Connection> connect(const std::string& url);

/// Wraps a caller-owned handle (not closed, not reconfigured); the caller keeps ownership. Its
/// session should use time_zone '+00:00' for the stored DATETIME values to be UTC.
std::unique_ptr<sql::Connection> wrap(st_mysql* conn);

/// A pool of connections to one database.
std::shared_ptr<sql::ConnectionPool> make_pool(const std::string& url, std::size_t max_size = 8,
                                               const sql::NetworkTimeouts& timeouts = {});

}  // namespace outbox::mysql
