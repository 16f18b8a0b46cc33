#include "outbox/detect/detect.hpp"

#include <stdexcept>

#include "outbox/sql/connection.hpp"

#ifdef OUTBOX_HAVE_SQLITE
#include "outbox/sqlite/store.hpp"
#endif
#ifdef OUTBOX_HAVE_POSTGRES
#include "outbox/postgres/store.hpp"
#endif
#ifdef OUTBOX_HAVE_MYSQL
#include "outbox/mysql/store.hpp"
#endif

namespace outbox {
namespace {

[[noreturn]] void unsupported(std::string_view dialect) {
  throw std::invalid_argument("no outbox store for dialect '" + std::string(dialect) +
                              "' in this build");
}

}  // namespace

std::shared_ptr<OutboxStore> detect_store(sql::Connection& conn, const std::string& table,
                                          const JsonCodec& codec) {
  const auto dialect = conn.dialect();
#ifdef OUTBOX_HAVE_SQLITE
  if (dialect == "sqlite") {
    return std::make_shared<sqlite::SqliteOutboxStore>(table, codec);
  }
#endif
#ifdef OUTBOX_HAVE_POSTGRES
  if (dialect == "postgres") {
    return std::make_shared<postgres::PostgresOutboxStore>(
        postgres::PostgresOutboxStore::Options{.table = table, .codec = &codec});
  }
#endif
#ifdef OUTBOX_HAVE_MYSQL
  if (dialect == "mysql") {
    return std::make_shared<mysql::MySqlOutboxStore>(
        mysql::MySqlOutboxStore::Options{.table = table, .codec = &codec});
  }
#endif
  unsupported(dialect);
}

std::shared_ptr<EventPurger> detect_purger(sql::Connection& conn, const std::string& table) {
  const auto dialect = conn.dialect();
#ifdef OUTBOX_HAVE_SQLITE
  if (dialect == "sqlite") {
    return std::make_shared<sqlite::SqliteEventPurger>(table);
  }
#endif
#ifdef OUTBOX_HAVE_POSTGRES
  if (dialect == "postgres") {
    return std::make_shared<postgres::PostgresEventPurger>(table);
  }
#endif
#ifdef OUTBOX_HAVE_MYSQL
  if (dialect == "mysql") {
    return std::make_shared<mysql::MySqlEventPurger>(table);
  }
#endif
  unsupported(dialect);
}

void create_schema_for(sql::Connection& conn, const std::string& table) {
  const auto dialect = conn.dialect();
#ifdef OUTBOX_HAVE_SQLITE
  if (dialect == "sqlite") {
    return sqlite::create_schema(conn, table);
  }
#endif
#ifdef OUTBOX_HAVE_POSTGRES
  if (dialect == "postgres") {
    return postgres::create_schema(conn, table);
  }
#endif
#ifdef OUTBOX_HAVE_MYSQL
  if (dialect == "mysql") {
    return mysql::create_schema(conn, table);
  }
#endif
  unsupported(dialect);
}

}  // namespace outbox
