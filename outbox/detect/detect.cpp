#include "outbox/detect/detect.hpp"

#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/internal/ascii.hpp"
#include "outbox/log.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/dialect.hpp"
#include "outbox/sql/group_store.hpp"
#include "outbox/sql/lease_store.hpp"

namespace outbox {

const sql::Engine& engine_for(std::string_view dialect) {
  for (const sql::Engine* engine : engines()) {
    if (engine->name == dialect) {
      return *engine;
    }
  }
  throw std::invalid_argument("no outbox store for dialect '" + std::string(dialect) +
                              "' in this build");
}

std::shared_ptr<OutboxStore> detect_store(sql::Connection& conn, const std::string& table,
                                          const JsonCodec& codec) {
  return engine_for(conn.dialect()).make_store({.table = table, .codec = &codec});
}

std::shared_ptr<EventPurger> detect_purger(sql::Connection& conn, const std::string& table) {
  return engine_for(conn.dialect()).make_purger(table);
}

std::shared_ptr<LeaseStore> detect_lease_store(sql::Connection& conn, const std::string& table) {
  return std::make_shared<sql::SqlLeaseStore>(engine_for(conn.dialect()).dialect(), table);
}

std::shared_ptr<StreamStore> detect_stream_store(sql::Connection& conn, const std::string& table) {
  return engine_for(conn.dialect()).make_stream_store(table);
}

std::shared_ptr<GroupStore> detect_group_store(sql::Connection& conn, const std::string& table) {
  const auto& engine = engine_for(conn.dialect());
  // SQLite has no server clock: its statements use the caller's either way.
  auto store = std::make_shared<sql::SqlGroupStore>(engine.dialect(), table, true);
  // A table not migrated to version 9 has no index of fronts: read there, each front would sort
  // its whole partition, so claims read in key order only until `outbox migrate`. An index of
  // that name on another table is not the table's (index names are global in a database).
  if (!store->has_fronts()) {
    return store;
  }
  const std::string front = table + "_groups_front";
  // Any kind of object: a table or a view of that name keeps the index from being made too.
  const auto owners = conn.query("SELECT type, tbl_name FROM sqlite_master WHERE name = '" + front +
                                 "' COLLATE NOCASE");
  bool own = false;
  for (const auto& row : owners) {
    own = own || (row.get_text(0) == "index" && internal::iequals(row.get_text(1), table));
  }
  if (!own) {
    store->without_fronts();
    // Claims still deliver in order, only slower on a backlog: said as the store is made (a
    // relay's start, an `outbox groups` command), with what to do. A migration at the current
    // version makes nothing again, so the statement is given (sqlite::create_group_schema's).
    const std::string make = "CREATE INDEX " + front + " ON " + table +
                             " (partition_no, stream_seq) WHERE " + sql::pending_statuses() +
                             " AND message_group IS NOT NULL";
    log(LogLevel::Warning,
        owners.empty()
            ? "message groups on " + table + ": no index " + front +
                  ", so claims read each partition in key order; `outbox migrate` makes it on a "
                  "schema older than version 9, or make it with: " +
                  make
            : "message groups on " + table + ": the name " + front + " is taken by " +
                  (owners[0].get_text(0) == "index" ? "an index of table " + owners[0].get_text(1)
                                                    : "a " + owners[0].get_text(0)) +
                  ", so the table has no index of fronts and claims read each partition in key "
                  "order; rename that, then make the index with: " +
                  make);
  }
  return store;
}

int schema_version(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  try {
    const auto rows =
        conn.query("SELECT version FROM outbox_schema_version WHERE table_name = '" + table + "'");
    return rows.empty() ? 0 : static_cast<int>(rows[0].get_int(0));
  } catch (const StoreError&) {
    return 0;  // no version table: never migrated (made by create_schema, or not at all)
  }
}

void create_schema_for(sql::Connection& conn, const std::string& table) {
  engine_for(conn.dialect()).create_schema(conn, table);
}

std::shared_ptr<sql::ConnectionPool> open_pool(const std::string& url, std::size_t max_size,
                                               bool create_sqlite_file,
                                               const sql::NetworkTimeouts& timeouts) {
  for (const sql::Engine* engine : engines()) {
    if (engine->accepts(url)) {
      return engine->open_pool(
          url,
          {.max_size = max_size, .create_sqlite_file = create_sqlite_file, .timeouts = timeouts});
    }
  }
  // A known scheme whose engine this build left out says so; anything else is a bad URL.
  for (std::string_view scheme :
       {"sqlite://", "postgresql://", "postgres://", "mysql://", "mariadb://"}) {
    if (url.starts_with(scheme)) {
      throw std::invalid_argument("no outbox store for '" + std::string(scheme) +
                                  "' URLs in this build");
    }
  }
  // Only a scheme is repeated: the rest of an unrecognised string may hold a password.
  const auto colon = url.find("://");
  const std::string scheme = colon == std::string::npos ? std::string() : url.substr(0, colon);
  const bool plain =
      !scheme.empty() && scheme.size() <= 32 &&
      scheme.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789+.-") == std::string::npos;
  throw std::invalid_argument((plain ? "unsupported database URL scheme '" + scheme + "://'"
                                     : std::string("unsupported database URL")) +
                              ": use sqlite:///path.db, postgresql://… or mysql://…");
}

}  // namespace outbox
