#include "outbox/postgres/store.hpp"

#include "outbox/errors.hpp"
#include "outbox/internal/event_row.hpp"
#include "outbox/log.hpp"
#include "outbox/postgres/stream.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"
#include "outbox/sql/lease_store.hpp"

namespace outbox::postgres {
namespace {

class PostgresDialect final : public sql::Dialect {
 public:
  std::string_view name() const override { return "postgres"; }
  bool unions_or_of_ranges() const override { return true; }
  std::string placeholder(int n) const override { return "$" + std::to_string(n); }
  std::string typed(const std::string& marker, std::string_view type) const override {
    return marker + "::" + std::string(type);
  }
  std::string instant(const std::string& marker) const override {
    return "('epoch'::timestamptz + " + marker + "::bigint * interval '1 microsecond')";
  }
  std::string micros_interval(const std::string& marker) const override {
    return "(" + marker + "::bigint * interval '1 microsecond')";
  }
  // Not now(): that is the transaction's start, so a row written late in a long transaction
  // would be due (and its claim would expire) early.
  std::string server_now() const override { return "statement_timestamp()"; }
  std::string share_lock() const override { return " FOR SHARE"; }
  std::string micros(const std::string& column) const override {
    return "(EXTRACT(EPOCH FROM " + column + ") * 1000000)::bigint";
  }
  std::string json_text(const std::string& column) const override { return column + "::text"; }
  bool id_array() const override { return true; }
  std::string after_cursor() const override {
    return "(stream_xid, stream_seq) > (s.cursor_xid::text::xid8, s.cursor_seq)";
  }
  std::string insert_ignore(const std::string& into_values, const std::string& key) const override {
    return "INSERT " + into_values + " ON CONFLICT (" + key + ") DO NOTHING";
  }
};

}  // namespace

const sql::Dialect& dialect() {
  static const PostgresDialect instance;
  return instance;
}

void require_index(sql::Connection& conn, const std::string& table, const std::string& index) {
  const auto rows = conn.query("SELECT count(*) FROM pg_indexes WHERE tablename = lower('" + table +
                               "') AND indexname = lower('" + index + "')");
  if (rows.empty() || rows[0].get_int(0) == 0) {
    throw StoreError("postgres: index " + index + " of " + table +
                         " could not be created: another table's index has that name",
                     "42P07");
  }
}

void create_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("CREATE TABLE IF NOT EXISTS " + table +
               " ("
               "event_id TEXT PRIMARY KEY, "
               "event_type TEXT NOT NULL, "
               "aggregate_type TEXT, "
               "aggregate_id TEXT, "
               "tenant_id TEXT, "
               "payload JSONB, "
               "payload_bytes BYTEA, "
               "headers JSONB, "
               "status SMALLINT NOT NULL, "
               "attempts INT NOT NULL DEFAULT 0, "
               "available_at TIMESTAMPTZ NOT NULL, "
               "created_at TIMESTAMPTZ NOT NULL, "
               "done_at TIMESTAMPTZ, "
               "last_error TEXT, "
               "locked_by TEXT, "
               "locked_at TIMESTAMPTZ, "
               "tags JSONB, "
               // Stream positions (schema version 4): see postgres/stream.hpp.
               "stream_xid xid8 NOT NULL DEFAULT pg_current_xact_id(), "
               "stream_seq BIGINT GENERATED ALWAYS AS IDENTITY, "
               "CONSTRAINT " +
               derived_name(table, "_one_payload") +
               " CHECK ((payload IS NULL) <> (payload_bytes IS NULL)));" +
               // Pending rows only, in claim order: claim and poll read the head of this small
               // index instead of sorting the backlog (see docs/guide.md, "Indexes").
               "CREATE INDEX IF NOT EXISTS " + derived_name(table, "_pending") + " ON " + table +
               " (created_at, event_id) WHERE " + sql::pending_statuses() + ";" +
               "CREATE INDEX IF NOT EXISTS " + derived_name(table, "_terminal") + " ON " + table +
               " (created_at) WHERE " + sql::terminal_statuses() + ";" +
               "CREATE INDEX IF NOT EXISTS " + derived_name(table, "_created") + " ON " + table +
               " (created_at);");
  for (const char* suffix : {"_pending", "_terminal", "_created"}) {
    require_index(conn, table, derived_name(table, suffix));
  }
  create_lease_schema(conn, table);
  create_stream_schema(conn, table);
  create_group_schema(conn, table);
  create_writer_defaults(conn, table);
  create_tracing_column(conn, table);
  create_retry_dead_index(conn, table);
}

void create_retry_dead_index(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // The status report counts the RETRY and DEAD rows, and the DEAD ones' types, here (the
  // dashboard asks every 2 s): counted in the table, they cost a read of every row. Empty while
  // nothing fails, so it costs an insert nothing.
  const std::string index = derived_name(table, "_retry_dead");
  const auto taken = conn.query(
      "SELECT c.relkind::text, CASE WHEN i.indrelid = '" + table +
      "'::regclass THEN 1 ELSE 0 END FROM pg_class c LEFT JOIN pg_index i ON i.indexrelid = c.oid "
      "WHERE c.relname = lower('" +
      index + "') AND c.relnamespace = (SELECT relnamespace FROM pg_class WHERE oid = '" + table +
      "'::regclass)");
  if (!taken.empty() && taken[0].get_int(1) == 0) {
    // An application's relation (a dead-letter archive, say): the counts read the table instead.
    log(LogLevel::Warning, "postgres: " + index +
                               " is the name of another relation: the status counts of " + table +
                               " read the whole table");
    return;
  }
  conn.execute("CREATE INDEX IF NOT EXISTS " + index + " ON " + table + " (" +
               dialect().retry_dead_status() + ", event_type) WHERE " +
               dialect().retry_dead_filter());
}

void create_tracing_column(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("ALTER TABLE " + table + " ADD COLUMN IF NOT EXISTS tracingspancontext TEXT");
}

void create_writer_defaults(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // clock_timestamp(), not now(): rows one transaction inserts keep their insert order in
  // created_at (now() is the transaction's start, the same for all of them).
  conn.execute("ALTER TABLE " + table +
               " ALTER COLUMN status SET DEFAULT 0, "
               "ALTER COLUMN available_at SET DEFAULT clock_timestamp(), "
               "ALTER COLUMN created_at SET DEFAULT clock_timestamp()");
}

void create_group_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("ALTER TABLE " + table +
               " ADD COLUMN IF NOT EXISTS message_group TEXT, "
               "ADD COLUMN IF NOT EXISTS partition_no SMALLINT");
  // Grouped rows leave the claim order of the pending index: their own index holds them per
  // partition and group in insert order, which is what a claim of group heads walks.
  const std::string pending = derived_name(table, "_pending");
  const auto def = conn.query("SELECT indexdef FROM pg_indexes WHERE tablename = lower('" + table +
                              "') AND indexname = lower('" + pending + "')");
  if (def.empty() || def[0].get_text(0).find("message_group") == std::string::npos) {
    conn.execute("DROP INDEX IF EXISTS " + pending);
    conn.execute("CREATE INDEX " + pending + " ON " + table + " (created_at, event_id) WHERE " +
                 sql::pending_statuses() + " AND message_group IS NULL");
  }
  const std::string groups = derived_name(table, "_groups");
  conn.execute("CREATE INDEX IF NOT EXISTS " + groups + " ON " + table +
               " (partition_no, message_group, stream_seq) WHERE " + sql::pending_statuses() +
               " AND message_group IS NOT NULL");
  require_index(conn, table, groups);
  // Grouped pending rows numbered outside the partitions (schema version 12; normally empty):
  // an action on one group reads its such rows here.
  const std::string outside = derived_name(table, "_groups_outside");
  conn.execute("CREATE INDEX IF NOT EXISTS " + outside + " ON " + table +
               " (message_group) WHERE " + sql::pending_statuses() +
               " AND message_group IS NOT NULL AND " + sql::group_partition_out_of_range());
  require_index(conn, table, outside);
  // Grouped pending rows that have failed (schema version 12), which `groups list` and GET
  // /api/groups look for: without it they read every pending grouped row. Empty while nothing
  // fails.
  const std::string failing = derived_name(table, "_groups_failing");
  conn.execute("CREATE INDEX IF NOT EXISTS " + failing + " ON " + table +
               " (message_group) WHERE " + sql::pending_statuses() +
               " AND message_group IS NOT NULL AND attempts > 0");
  require_index(conn, table, failing);
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::group_block_table_name(table) +
               " (message_group TEXT PRIMARY KEY, event_id TEXT NOT NULL, "
               "partition_no SMALLINT, blocked_at TIMESTAMPTZ NOT NULL, "
               "attempts INT NOT NULL DEFAULT 0, last_error TEXT)");
}

void create_lease_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::lease_table_name(table) +
               " (name TEXT PRIMARY KEY, owner TEXT, epoch BIGINT NOT NULL DEFAULT 0, "
               "acquired_at TIMESTAMPTZ, renewed_at TIMESTAMPTZ, expires_at TIMESTAMPTZ)");
}

PostgresOutboxStore::PostgresOutboxStore(Options options)
    : SqlOutboxStore(dialect(), std::move(options)) {}

std::vector<std::string> PostgresOutboxStore::renew_claims(
    sql::Connection& conn, std::string_view owner, const std::vector<std::string>& event_ids,
    Timestamp now) {
  if (event_ids.empty()) {
    return {};
  }
  // Rows locked right now (a DONE batch, a status write) are being finished: skip them rather
  // than wait, since two multi-row updates locking rows in different orders would deadlock.
  auto s = statement();
  s.sql("WITH c AS (SELECT event_id FROM " + table() + " WHERE")
      .ids_in("event_id", event_ids, 0, event_ids.size())
      .sql(" AND locked_by = ")
      .param(sql::TextRef{owner})
      .sql(" AND " + sql::pending_statuses() + " FOR UPDATE SKIP LOCKED) UPDATE " + table() +
           " o SET locked_at = ")
      .now(now)
      .sql(" FROM c WHERE o.event_id = c.event_id RETURNING o.event_id");
  std::vector<std::string> renewed;
  for (const auto& row : s.query(conn)) {
    renewed.push_back(row.get_text(0));
  }
  return renewed;
}

std::vector<OutboxEvent> PostgresOutboxStore::claim_pending(sql::Connection& conn,
                                                            std::string_view owner, Timestamp now,
                                                            std::chrono::milliseconds lock_timeout,
                                                            std::chrono::microseconds skip_recent,
                                                            int limit, const PendingKey* after) {
  // One round trip: lock the oldest claimable rows (skipping rows other nodes are claiming right
  // now), stamp them, and return them in claim order.
  auto s = statement();
  s.sql("WITH c AS (SELECT event_id FROM " + table());
  where_due(s, now, skip_recent);
  claimable(s, owner, now, lock_timeout, after);
  oldest_first(s, limit);
  s.sql(" FOR UPDATE SKIP LOCKED), u AS (UPDATE " + table() + " o SET locked_by = ")
      .param(sql::TextRef{owner})
      .sql(", locked_at = ")
      .now(now)
      .sql(" FROM c WHERE o.event_id = c.event_id RETURNING o.*) SELECT " + columns() +
           " FROM u ORDER BY created_at, event_id");
  return internal::events_from_rows(s.query(conn));
}

}  // namespace outbox::postgres
