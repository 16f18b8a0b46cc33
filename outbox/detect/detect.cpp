#include "outbox/detect/detect.hpp"

#include <optional>
#include <stdexcept>
#include <string>

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

namespace {

// What holds the name `name` when it is not an index of `table` ("a table", "an index of table
// X"; empty when nothing does); nullopt when it is the table's own index (SQLite). Triggers have
// names of their own.
std::optional<std::string> not_own_index(sql::Connection& conn, const std::string& name,
                                         const std::string& table) {
  const auto holders = conn.query("SELECT type, tbl_name FROM sqlite_master WHERE name = '" + name +
                                  "' COLLATE NOCASE AND type <> 'trigger'");
  for (const auto& row : holders) {
    if (row.get_text(0) == "index" && internal::iequals(row.get_text(1), table)) {
      return std::nullopt;
    }
  }
  if (holders.empty()) {
    return std::string();
  }
  return holders[0].get_text(0) == "index" ? "an index of table " + holders[0].get_text(1)
                                           : "a " + holders[0].get_text(0);
}

// The warning for an index of `table` that is missing or whose name another object holds: what
// it costs, and the statement that makes it (a migration at the current version makes nothing
// again).
std::string missing_index(const std::string& table, const std::string& name,
                          const std::string& holder, const std::string& cost,
                          const std::string& make) {
  return "message groups on " + table + ": " +
         (holder.empty() ? "no index " + name : "the name " + name + " is taken by " + holder) +
         ", so " + cost + "; " +
         (holder.empty() ? "`outbox migrate` makes it on an older schema, or make it with: "
                         : "rename that, then make the index with: ") +
         make;
}

}  // namespace

std::shared_ptr<GroupStore> detect_group_store(sql::Connection& conn, const std::string& table) {
  const auto& engine = engine_for(conn.dialect());
  const auto& dialect = engine.dialect();
  // SQLite has no server clock: its statements use the caller's either way.
  auto store = std::make_shared<sql::SqlGroupStore>(dialect, table, true);
  if (!store->has_fronts()) {
    return store;
  }
  // SQLite's indexes of grouped rows beside the group index (sqlite::create_group_schema), said
  // as the store is made (a relay's start, an `outbox groups` command) when they are missing: the
  // claims still deliver in order, only slower. A table not migrated to version 9 has no index
  // of fronts: read there, each front would sort its whole partition, so claims read in key
  // order only. An index of the name on another table is not the table's (index names are
  // global in a database).
  const std::string front = table + "_groups_front";
  if (const auto holder = not_own_index(conn, front, table)) {
    store->without_fronts();
    log(LogLevel::Warning,
        missing_index(table, front, *holder,
                      "the table has no index of fronts and claims read each partition in key "
                      "order",
                      "CREATE INDEX " + front + " ON " + table +
                          " (partition_no, stream_seq) WHERE " + dialect.group_pending_filter()));
  }
  // A column declared as text (a table made by hand) keeps partition numbers as text: SQLite
  // then compares them as text, so '41.0' or '100' matches no partition and is not counted as
  // outside 0 … 63 either, and such a row waits for ever.
  const auto declared = conn.query("SELECT type FROM pragma_table_info('" + table +
                                   "') WHERE name = 'partition_no' COLLATE NOCASE");
  if (!declared.empty() && !declared[0].is_null(0)) {
    std::string type;
    for (const char c : declared[0].get_text(0)) {
      type += internal::ascii_lower(c);
    }
    const bool text =
        type.find("int") == std::string::npos &&
        (type.find("char") != std::string::npos || type.find("clob") != std::string::npos ||
         type.find("text") != std::string::npos);
    if (text) {
      log(LogLevel::Warning, "message groups on " + table + ": partition_no is declared " +
                                 declared[0].get_text(0) +
                                 ", so SQLite keeps partition numbers as text and rows whose "
                                 "number is not written as a whole number in 0 … 63 are never "
                                 "delivered; declare it INTEGER");
    }
  }
  const std::string fractional = table + "_groups_fractional";
  if (const auto holder = dialect.fractional_partition().empty()
                              ? std::nullopt
                              : not_own_index(conn, fractional, table)) {
    log(LogLevel::Warning,
        missing_index(table, fractional, *holder,
                      "each cycle reads the whole group index for rows whose partition number is "
                      "not a whole number",
                      "CREATE INDEX " + fractional + " ON " + table + " (message_group) WHERE " +
                          dialect.group_pending_filter() + " AND " +
                          dialect.fractional_partition()));
  }
  // Schema version 12's indexes only spare reads: without them (a name another table's index
  // holds, say) an operator's list and an action on one group still do what they say.
  struct Sparing {
    std::string suffix, cost, condition;
  };
  const Sparing sparing[] = {
      {"_groups_failing", "groups list and GET /api/groups read every pending grouped row",
       "attempts > 0"},
      {"_groups_outside",
       "an action on one group reads the rows numbered outside 0 … 63 of every key",
       sql::group_partition_out_of_range()}};
  for (const auto& [suffix, cost, condition] : sparing) {
    const std::string index = table + suffix;
    if (const auto holder = not_own_index(conn, index, table)) {
      log(LogLevel::Warning,
          missing_index(table, index, *holder, cost,
                        "CREATE INDEX " + index + " ON " + table + " (message_group) WHERE " +
                            dialect.group_pending_filter() + " AND " + condition));
    }
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
