#include "outbox/sqlite/store.hpp"

#include <algorithm>
#include <array>
#include <regex>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/errors.hpp"
#include "outbox/internal/ascii.hpp"
#include "outbox/internal/event_row.hpp"
#include "outbox/log.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/sql/stream_store.hpp"

namespace outbox::sqlite {
namespace {

class SqliteDialect final : public sql::Dialect {
 public:
  std::string_view name() const override { return "sqlite"; }
  std::string placeholder(int) const override { return "?"; }
  std::string instant(const std::string& marker) const override { return marker; }
  std::string micros_interval(const std::string& marker) const override { return marker; }
  // julianday('now') is fixed for the whole statement, like a server's statement time.
  std::string lease_now() const override {
    return "CAST((julianday('now') - 2440587.5) * 86400000000.0 AS INTEGER)";
  }
  bool has_bytes_column() const override { return false; }
  bool group_fronts() const override { return true; }
  // A REAL that is a whole number (53.0, as a column declared REAL keeps every number) is one.
  std::string fractional_partition() const override {
    return "typeof(partition_no) = 'real' AND partition_no <> CAST(partition_no AS INTEGER)";
  }
  bool parenthesized_arms() const override { return false; }
  std::string insert_ignore(const std::string& into_values, const std::string&) const override {
    return "INSERT OR IGNORE " + into_values;
  }
};

}  // namespace

const sql::Dialect& dialect() {
  static const SqliteDialect instance;
  return instance;
}

namespace {

// The columns in the order of schema version 4, with the defaults of version 6 (an outside
// writer's minimal insert names event_id, event_type and payload). stream_seq is the rowid, with
// AUTOINCREMENT: a plain rowid is reused once the newest row is purged, and VACUUM may renumber an
// implicit one, either of which would move events behind a subscription's cursor.
std::string columns() {
  const std::string now = "(" + dialect().lease_now() + ")";
  return "stream_seq INTEGER PRIMARY KEY AUTOINCREMENT, "
         "event_id TEXT NOT NULL UNIQUE, "
         "event_type TEXT NOT NULL, "
         "aggregate_type TEXT, "
         "aggregate_id TEXT, "
         "tenant_id TEXT, "
         "payload BLOB NOT NULL, "
         "headers TEXT, "
         "status INTEGER NOT NULL DEFAULT 0, "
         "attempts INTEGER NOT NULL DEFAULT 0, "
         "available_at INTEGER NOT NULL DEFAULT " +
         now + ", created_at INTEGER NOT NULL DEFAULT " + now +
         ", "
         "done_at INTEGER, "
         "last_error TEXT, "
         "locked_by TEXT, "
         "locked_at INTEGER, "
         "tags TEXT";
}

// The names columns() defines: any other column of a table being rebuilt is carried over as it is.
constexpr std::array<std::string_view, 17> kColumnNames = {
    "stream_seq", "event_id",   "event_type", "aggregate_type", "aggregate_id", "tenant_id",
    "payload",    "headers",    "status",     "attempts",       "available_at", "created_at",
    "done_at",    "last_error", "locked_by",  "locked_at",      "tags"};

void create_indexes(sql::Connection& conn, const std::string& table) {
  // Pending rows only, in poll order: poll and claim walk this small index instead of the whole
  // table, however many DONE rows wait for purge.
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_pending ON " + table +
               " (created_at, event_id) WHERE " + sql::pending_statuses());
  // Terminal rows in purge order.
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_terminal ON " + table +
               " (created_at) WHERE " + sql::terminal_statuses());
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_created ON " + table + " (created_at)");
}

bool has_column(sql::Connection& conn, const std::string& table, const std::string& column) {
  return !conn.query("SELECT 1 FROM pragma_table_info('" + table + "') WHERE name = '" + column +
                     "'")
              .empty();
}

std::string quote_identifier(const std::string& name) {
  std::string out = "\"";
  for (char c : name) {
    out += c == '"' ? std::string("\"\"") : std::string(1, c);
  }
  return out + "\"";
}

// Re-creates a table of schema version 3 with columns(): its rowid cannot become the
// AUTOINCREMENT stream_seq in place. In one savepoint (inside the migration's transaction, or
// alone); rows are numbered oldest first. Columns, indexes and triggers an application added are
// carried over, as SQLite's own guide to changing a table does (an added column keeps its type,
// NOT NULL and default, not other constraints); views and other tables' triggers stay.
void rebuild_table(sql::Connection& conn, const std::string& table) {
  const std::string copy = table + "__rebuild";
  conn.execute("SAVEPOINT outbox_rebuild");
  try {
    std::string extra_columns, copied;
    for (const auto& c : conn.query("SELECT name, type, \"notnull\", dflt_value FROM "
                                    "pragma_table_info('" +
                                    table + "')")) {
      const std::string name = c.get_text(0);
      const std::string quoted = quote_identifier(name);
      copied += (copied.empty() ? "" : ", ") + quoted;
      if (std::find(kColumnNames.begin(), kColumnNames.end(), name) == kColumnNames.end()) {
        const auto dflt = c.get_optional_text(3);
        // The default as SQLite reports it, without the parentheses an expression needs.
        extra_columns += ", " + quoted + " " + c.get_text(1) +
                         (c.get_int(2) != 0 && dflt ? " NOT NULL" : "") +
                         (dflt ? " DEFAULT (" + *dflt + ")" : "");
      }
    }
    std::vector<std::string> recreate;
    for (const auto& r :
         conn.query("SELECT sql FROM sqlite_master WHERE tbl_name = '" + table +
                    "' COLLATE NOCASE AND type IN ('index', 'trigger') AND sql IS NOT NULL")) {
      recreate.push_back(r.get_text(0));
    }
    conn.execute("DROP TABLE IF EXISTS " + copy);
    conn.execute("CREATE TABLE " + copy + " (" + columns() + extra_columns + ")");
    conn.execute("INSERT INTO " + copy + " (" + copied + ") SELECT " + copied + " FROM " + table +
                 " ORDER BY created_at, event_id");
    conn.execute("DROP TABLE " + table);
    // Views and other tables' triggers that name the table are left as they are (they name it
    // again once the copy has its name): the current RENAME would re-check them against a
    // schema that has no such table for a moment, and fail.
    conn.execute("PRAGMA legacy_alter_table = ON");
    try {
      conn.execute("ALTER TABLE " + copy + " RENAME TO " + table);
    } catch (...) {
      conn.execute("PRAGMA legacy_alter_table = OFF");
      throw;
    }
    conn.execute("PRAGMA legacy_alter_table = OFF");
    for (const auto& sql : recreate) {
      conn.execute(sql);
    }
    create_indexes(conn, table);  // a table older than some of them
    conn.execute("RELEASE outbox_rebuild");
  } catch (...) {
    try {
      conn.execute("ROLLBACK TO outbox_rebuild");
      conn.execute("RELEASE outbox_rebuild");
    } catch (const std::exception&) {
      // The original error is the one worth reporting.
    }
    throw;
  }
}

}  // namespace

void create_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("CREATE TABLE IF NOT EXISTS " + table + " (" + columns() + ")");
  create_indexes(conn, table);
  create_lease_schema(conn, table);
  create_stream_schema(conn, table);
  create_group_schema(conn, table);
  create_writer_defaults(conn, table);
  create_tracing_column(conn, table);
  create_retry_dead_index(conn, table);
}

void create_tracing_column(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  if (!has_column(conn, table, "tracingspancontext")) {
    conn.execute("ALTER TABLE " + table + " ADD COLUMN tracingspancontext TEXT");
  }
}

void create_writer_defaults(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  const auto rows =
      conn.query("SELECT name, sql FROM sqlite_master WHERE type = 'table' AND name = '" + table +
                 "' COLLATE NOCASE");
  if (rows.empty()) {
    throw StoreError("sqlite: no table " + table);
  }
  const std::string name = rows[0].get_text(0);
  const std::string before = rows[0].get_text(1);
  std::string after = before;
  const std::string now = "(" + dialect().lease_now() + ")";
  for (const auto& [column, value] : {std::pair<std::string, std::string>{"status", "0"},
                                      {"available_at", now},
                                      {"created_at", now}}) {
    // The definition every schema version wrote, not followed by a default yet.
    const std::regex plain("(^|[\\s,(])(" + column + "\\s+INTEGER\\s+NOT\\s+NULL)(\\s*[,)])",
                           std::regex::icase);
    std::smatch m;
    if (std::regex_search(after, m, plain)) {
      after = m.prefix().str() + m[1].str() + m[2].str() + " DEFAULT " + value + m[3].str() +
              m.suffix().str();
    } else if (conn.query("SELECT 1 FROM pragma_table_info('" + name + "') WHERE name = '" +
                          column + "' AND dflt_value IS NOT NULL")
                   .empty()) {
      throw StoreError("sqlite: cannot give column " + column + " of " + name +
                       " a default: its definition is not the one outbox migrate writes (\"" +
                       column + " INTEGER NOT NULL\"); add DEFAULT " + value +
                       " to it, then migrate again");
    }
  }
  if (after == before) {
    return;
  }
  // Changing a column's default changes nothing stored: SQLite's documented way is to edit the
  // table's definition in place (lang_altertable.html, "making other kinds of table schema
  // changes"), in the migration's transaction. No copy: views, triggers, constraints and the
  // AUTOINCREMENT high-water mark stay as they are, at any table size.
  std::string quoted;
  for (char c : after) {
    quoted += c == '\'' ? std::string("''") : std::string(1, c);
  }
  const auto version = conn.query("PRAGMA schema_version")[0].get_int(0);
  conn.execute("PRAGMA writable_schema = ON");
  try {
    conn.execute("UPDATE sqlite_master SET sql = '" + quoted +
                 "' WHERE type = 'table' AND name = '" + name + "'");
    conn.execute("PRAGMA schema_version = " + std::to_string(version + 1));
  } catch (...) {
    conn.execute("PRAGMA writable_schema = OFF");
    throw;
  }
  conn.execute("PRAGMA writable_schema = OFF");
  conn.query("SELECT * FROM " + name + " LIMIT 0");  // the new definition parses
}

namespace {

// `text` in lower case with each run of blanks one space: how two definitions are compared.
std::string normalized_sql(std::string_view text) {
  std::string out;
  bool blank = false;
  for (const char c : text) {
    if (c == ' ' || c == '\t' || c == '\n' || c == '\r') {
      blank = !out.empty();
      continue;
    }
    if (blank) {
      out += ' ';
      blank = false;
    }
    out += internal::ascii_lower(c);
  }
  return out;
}

}  // namespace

void create_retry_dead_index(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // The status report counts the RETRY and DEAD rows, and the DEAD ones' types, here (the
  // dashboard asks every 2 s): counted in the table, they cost a read of every row (0.13 s at
  // 1,000,000). Empty while nothing fails, so it costs an insert nothing.
  const std::string index = table + "_retry_dead";
  const std::string definition = "CREATE INDEX " + index + " ON " + table + " (" +
                                 dialect().retry_dead_status() + ", event_type) WHERE " +
                                 dialect().retry_dead_filter();
  // Tables, views and indexes share names (triggers have their own).
  const auto taken = conn.query("SELECT type, tbl_name, sql FROM sqlite_master WHERE name = '" +
                                index + "' COLLATE NOCASE AND type IN ('table', 'view', 'index')");
  if (taken.empty()) {
    conn.execute(definition);
    return;
  }
  const bool ours = taken[0].get_text(0) == "index" &&
                    internal::iequals(taken[0].get_text(1), table) && !taken[0].is_null(2) &&
                    normalized_sql(taken[0].get_text(2)) == normalized_sql(definition);
  if (!ours) {
    // An application's (a dead-letter archive, say): the counts read the table instead.
    log(LogLevel::Warning, "sqlite: " + index + " is the name of another " + taken[0].get_text(0) +
                               " (on " + taken[0].get_text(1) + "): the status counts of " + table +
                               " read the whole table; the index they read is: " + definition);
  }
}

void create_group_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  if (!has_column(conn, table, "message_group")) {
    conn.execute("ALTER TABLE " + table + " ADD COLUMN message_group TEXT");
  }
  if (!has_column(conn, table, "partition_no")) {
    conn.execute("ALTER TABLE " + table + " ADD COLUMN partition_no INTEGER");
  }
  // Grouped rows leave the claim order of the pending index: their own index holds them per
  // partition and group in insert order, which is what a claim of group heads walks.
  const std::string pending = table + "_pending";
  const auto def = conn.query("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = '" +
                              pending + "' COLLATE NOCASE");
  if (def.empty() || def[0].get_text(0).find("message_group") == std::string::npos) {
    conn.execute("DROP INDEX IF EXISTS " + pending);
    conn.execute("CREATE INDEX " + pending + " ON " + table + " (created_at, event_id) WHERE " +
                 sql::pending_statuses() + " AND message_group IS NULL");
  }
  // Covering what a scan reads (the due time and the id): it then never visits the table, which
  // halved the scan's time on a backlog.
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_groups ON " + table +
               " (partition_no, message_group, stream_seq, available_at, event_id) WHERE " +
               sql::pending_statuses() + " AND message_group IS NOT NULL");
  // Each partition's rows in insert order (schema version 9): its first rows are the oldest
  // groups' heads, which a claim takes first so that its rows, and their DONE marks, share pages.
  // On the partition and stream_seq alone (version 10): a DONE mark, which takes its row out,
  // rewrites a page of short entries instead of one of five columns (WAL frames a mark 0.70 ->
  // 0.54; the relay bench's 100,000-row grouped backlog 4.39 -> 3.73 s). The front reads its 16
  // rows a partition from the table. stream_seq stays in the key: on a table where it is not the
  // rowid (an outside writer's), an index on the partition alone left every front read sorting
  // the partition's rows.
  const std::string front = table + "_groups_front";
  // Only version 9's own index is replaced, known by its whole definition (any letter case): an
  // index of that name made otherwise (other columns, another WHERE, UNIQUE, a sort order or a
  // collation of its own) or on another table is someone's, and stays.
  const auto front_def =
      conn.query("SELECT sql FROM sqlite_master WHERE type = 'index' AND name = '" + front +
                 "' COLLATE NOCASE AND tbl_name = '" + table + "' COLLATE NOCASE");
  const std::string version_9 =
      "create index " + front + " on " + table +
      " (partition_no, stream_seq, message_group, available_at, event_id) where " +
      sql::pending_statuses() + " and message_group is not null";
  if (!front_def.empty() && !front_def[0].is_null(0) &&
      normalized_sql(front_def[0].get_text(0)) == normalized_sql(version_9)) {
    conn.execute("DROP INDEX IF EXISTS " + front);
  }
  conn.execute("CREATE INDEX IF NOT EXISTS " + front + " ON " + table +
               " (partition_no, stream_seq) WHERE " + sql::pending_statuses() +
               " AND message_group IS NOT NULL");
  // A partition number that is not a whole number (SQLite keeps 53.5 as written, whatever the
  // column's type) matched no partition's reads and counted as numbered: the row was never
  // delivered and the rows of its key behind it went first. Such a number counts as none
  // (schema version 11), found through this index (empty unless an outside client wrote one;
  // a trigger normalizing the number cost every insert 20 %, the index's test next to nothing).
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_groups_fractional ON " + table +
               " (message_group) WHERE " + dialect().group_pending_filter() + " AND " +
               dialect().fractional_partition());
  // Grouped pending rows numbered outside the partitions (schema version 12; normally empty):
  // an action on one group reads its such rows here (through a range of partition numbers it
  // read every such row of every key).
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_groups_outside ON " + table +
               " (message_group) WHERE " + dialect().group_pending_filter() + " AND " +
               sql::group_partition_out_of_range());
  // Grouped pending rows that have failed (schema version 12), which `groups list` and GET
  // /api/groups look for: without it they read every pending grouped row (1.2 s at 1,000,000),
  // and the dashboard asks every 2 s. Empty while nothing fails.
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_groups_failing ON " + table +
               " (message_group) WHERE " + dialect().group_pending_filter() + " AND attempts > 0");
  // Instants in microseconds since the epoch, on the host's clock.
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::group_block_table_name(table) +
               " (message_group TEXT PRIMARY KEY NOT NULL, event_id TEXT NOT NULL, "
               "partition_no INTEGER, blocked_at INTEGER NOT NULL, "
               "attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT)");
}

void create_stream_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  if (!has_column(conn, table, "stream_seq")) {
    // The rowid cannot become AUTOINCREMENT in place: the table is copied, oldest row first.
    rebuild_table(conn, table);
  }
  // Instants in microseconds since the epoch, on the host's clock.
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::subscription_table_name(table) +
               " (name TEXT PRIMARY KEY NOT NULL, filter TEXT NOT NULL DEFAULT '{}', "
               "publisher TEXT NOT NULL DEFAULT '', target TEXT NOT NULL DEFAULT '', "
               "status TEXT NOT NULL DEFAULT 'ACTIVE' "
               "CHECK (status IN ('ACTIVE', 'PAUSED', 'FAILED')), "
               "cursor_xid INTEGER NOT NULL DEFAULT 0, cursor_seq INTEGER NOT NULL DEFAULT 0, "
               "error_count INTEGER NOT NULL DEFAULT 0, last_error TEXT, "
               "delivered INTEGER NOT NULL DEFAULT 0, "
               "created_at INTEGER NOT NULL DEFAULT (" +
               dialect().lease_now() + "), updated_at INTEGER NOT NULL DEFAULT (" +
               dialect().lease_now() + "), last_delivered_at INTEGER, released_at INTEGER)");
}

void create_lease_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // Instants in microseconds since the epoch, on the host's clock (Dialect::lease_now).
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::lease_table_name(table) +
               " (name TEXT PRIMARY KEY NOT NULL, owner TEXT, epoch INTEGER NOT NULL DEFAULT 0, "
               "acquired_at INTEGER, renewed_at INTEGER, expires_at INTEGER)");
}

SqliteOutboxStore::SqliteOutboxStore(Options options)
    : SqlOutboxStore(dialect(), std::move(options)) {}

std::vector<std::string> SqliteOutboxStore::renew_claims(sql::Connection& conn,
                                                         std::string_view owner,
                                                         const std::vector<std::string>& event_ids,
                                                         Timestamp now) {
  std::vector<std::string> renewed;
  const std::size_t chunk = id_chunk();
  for (std::size_t i = 0; i < event_ids.size(); i += chunk) {
    auto s = statement();
    s.sql("UPDATE " + table() + " SET locked_at = ")
        .now(now)
        .sql(" WHERE locked_by = ")
        .param(sql::TextRef{owner})
        .sql(" AND " + sql::pending_statuses() + " AND")
        .ids_in("event_id", event_ids, i, std::min(chunk, event_ids.size() - i))
        .sql(" RETURNING event_id");
    for (const auto& row : s.query(conn)) {
      renewed.push_back(row.get_text(0));
    }
  }
  return renewed;
}

std::vector<OutboxEvent> SqliteOutboxStore::claim_pending(sql::Connection& conn,
                                                          std::string_view owner, Timestamp now,
                                                          std::chrono::milliseconds lock_timeout,
                                                          std::chrono::microseconds skip_recent,
                                                          int limit, const PendingKey* after) {
  if (!conn.in_transaction()) {
    // A read first: an UPDATE takes the database's one write lock even when it matches nothing,
    // so a relay draining only message groups queued every cycle behind its own DONE marks for an
    // empty claim (grouped rows are not claimed here, docs/groups.md). Not in a caller's
    // transaction: a deferred one that reads first may then be refused the write (its snapshot
    // is stale once another connection commits).
    if (!claim_would_take(conn, owner, now, lock_timeout, skip_recent, after)) {
      return {};
    }
  }
  // One statement: SQLite runs it under the database write lock, so two processes can never
  // both claim a row.
  auto s = statement();
  s.sql("UPDATE " + table() + " SET locked_by = ")
      .param(sql::TextRef{owner})
      .sql(", locked_at = ")
      .now(now)
      .sql(" WHERE event_id IN (SELECT event_id FROM " + table());
  where_due(s, now, skip_recent);
  claimable(s, owner, now, lock_timeout, after);
  oldest_first(s, limit);
  s.sql(") RETURNING " + columns());
  auto events = internal::events_from_rows(s.query(conn));
  // RETURNING gives no order guarantee.
  std::sort(events.begin(), events.end(), [](const OutboxEvent& a, const OutboxEvent& b) {
    return a.created_at != b.created_at ? a.created_at < b.created_at : a.event_id < b.event_id;
  });
  return events;
}

}  // namespace outbox::sqlite
