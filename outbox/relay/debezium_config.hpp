#pragma once
// Debezium as a drop-in relay: the Kafka Connect connector that reads an outbox table with
// Debezium's outbox event router and sends each event where the relay's routes would
// (docs/debezium.md).

#include <string>
#include <vector>

#include "outbox/relay/config.hpp"

namespace outbox::sql {
class Connection;
}

namespace outbox::relay {

/// Where the connector reads from.
struct DebeziumSource {
  std::string engine;  ///< "postgres" or "mysql"
  std::string host;
  int port = 0;
  std::string user;
  std::string database;
  std::string schema;  ///< PostgreSQL: the table's schema
  std::string table;
};

/// The connector and what the user must still see to (printed beside it).
struct DebeziumConnector {
  std::string json;                ///< {"name": …, "config": {…}}
  std::vector<std::string> notes;  ///< e.g. the password to fill in, wal_level to set
};

/// Asks the server `conn` is connected to (PostgreSQL: its address, port, user, database and
/// schema) or reads `url` (MariaDB) for the connector's source; checks `table` has the
/// tracingspancontext column (schema version 7). Throws ConfigError for SQLite (Debezium has no
/// connector for it) or an unmigrated table, StoreError when a query fails.
DebeziumSource debezium_source(sql::Connection& conn, const std::string& url,
                               const std::string& table);

/// Without a relay configuration: one route sending every event of `table` to
/// "outbox.event.<aggregate type>" (the router's own default) through a Kafka publisher whose
/// brokers (MariaDB's schema history needs them) are left to fill in.
RelayConfig debezium_default_config(const std::string& url, const std::string& table);

/// The connector for `source.table` from `config`'s routes of that table. Throws ConfigError
/// naming each route the router cannot express: none or several routes, a publisher other than
/// Kafka, a filter on event or aggregate type, more than one {placeholder} in the target.
DebeziumConnector debezium_connector(const RelayConfig& config, const DebeziumSource& source);

}  // namespace outbox::relay
