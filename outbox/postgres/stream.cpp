#include "outbox/postgres/stream.hpp"

#include "outbox/errors.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::postgres {
namespace {

bool has_column(sql::Connection& conn, const std::string& table, const std::string& column) {
  // ::regclass resolves the name as the table's own statements do (search_path, folding).
  return conn.query("SELECT count(*) FROM pg_attribute WHERE attrelid = '" + table +
                    "'::regclass AND attname = '" + column + "' AND NOT attisdropped")[0]
             .get_int(0) > 0;
}

}  // namespace

void create_stream_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  if (!has_column(conn, table, "stream_seq")) {
    // Every row present gets the migration's transaction id and a number in created_at order:
    // a subscription created at the start of the stream reads them oldest first.
    conn.execute("ALTER TABLE " + table +
                 " ADD COLUMN IF NOT EXISTS tags JSONB, "
                 "ADD COLUMN stream_xid xid8 NOT NULL DEFAULT pg_current_xact_id(), "
                 "ADD COLUMN stream_seq BIGINT");
    conn.execute("UPDATE " + table + " o SET stream_seq = r.n FROM (SELECT event_id, " +
                 "row_number() OVER (ORDER BY created_at, event_id) AS n FROM " + table +
                 ") r WHERE o.event_id = r.event_id");
    const auto next = conn.query("SELECT COALESCE(max(stream_seq), 0) + 1 FROM " + table);
    conn.execute("ALTER TABLE " + table + " ALTER COLUMN stream_seq SET NOT NULL");
    conn.execute("ALTER TABLE " + table +
                 " ALTER COLUMN stream_seq ADD GENERATED ALWAYS AS IDENTITY (START WITH " +
                 std::to_string(next[0].get_int(0)) + ")");
  }
  const std::string index = derived_name(table, "_stream");
  conn.execute("CREATE INDEX IF NOT EXISTS " + index + " ON " + table +
               " (stream_xid, stream_seq)");
  require_index(conn, table, index);
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::subscription_table_name(table) +
               " (name TEXT PRIMARY KEY, filter TEXT NOT NULL DEFAULT '{}', "
               "publisher TEXT NOT NULL DEFAULT '', target TEXT NOT NULL DEFAULT '', "
               "status TEXT NOT NULL DEFAULT 'ACTIVE' "
               "CHECK (status IN ('ACTIVE', 'PAUSED', 'FAILED')), "
               "cursor_xid BIGINT NOT NULL DEFAULT 0, cursor_seq BIGINT NOT NULL DEFAULT 0, "
               "error_count INT NOT NULL DEFAULT 0, last_error TEXT, "
               "delivered BIGINT NOT NULL DEFAULT 0, "
               "created_at TIMESTAMPTZ NOT NULL DEFAULT now(), "
               "updated_at TIMESTAMPTZ NOT NULL DEFAULT now(), last_delivered_at TIMESTAMPTZ, "
               "released_at TIMESTAMPTZ)");
}

PostgresStreamStore::PostgresStreamStore(std::string table)
    : SqlStreamStore(dialect(), std::move(table)) {}

std::string PostgresStreamStore::position_columns() const {
  // Named apart from the columns: ORDER BY stream_xid would otherwise mean this bigint (output
  // names come first there) and sort the table instead of walking the index.
  return "stream_xid::text::bigint AS position_xid, stream_seq AS position_seq";
}

void PostgresStreamStore::after(sql::Statement& s, StreamPosition after) const {
  s.sql("(stream_xid, stream_seq) > (")
      .param(after.xid, "text::xid8")
      .sql(", ")
      .param(after.seq, "bigint")
      .sql(")");
}

// Every transaction below the snapshot's xmin has ended: no row can appear there any more.
std::string PostgresStreamStore::readable() const {
  return " AND stream_xid < pg_snapshot_xmin(pg_current_snapshot())";
}

std::string PostgresStreamStore::order(bool descending) const {
  return descending ? "stream_xid DESC, stream_seq DESC" : "stream_xid, stream_seq";
}

std::optional<StreamHoldback> PostgresStreamStore::holdback(sql::Connection& conn) {
  // Prepared (two-phase) transactions hold it back too, with no session to show.
  const auto rows = conn.query(
      "SELECT pid, ms, state FROM (SELECT pid, (EXTRACT(EPOCH FROM clock_timestamp() - "
      "xact_start) * 1000)::bigint AS ms, COALESCE(state, '') AS state, age(backend_xid) AS a "
      "FROM pg_stat_activity WHERE backend_xid IS NOT NULL AND xact_start IS NOT NULL "
      "UNION ALL SELECT 0, (EXTRACT(EPOCH FROM clock_timestamp() - prepared) * 1000)::bigint, "
      "'prepared transaction ' || gid, age(transaction) FROM pg_prepared_xacts) h "
      "ORDER BY a DESC LIMIT 1");
  if (rows.empty()) {
    return std::nullopt;
  }
  return StreamHoldback{rows[0].get_int(0), std::chrono::milliseconds(rows[0].get_int(1)),
                        rows[0].get_text(2)};
}

void PostgresStreamStore::check(sql::Connection& conn) {
  // xmax is the next transaction id the server will assign: a stored id at or past it comes from
  // another cluster (pg_dump and restore), and rows written from now on would sort before it.
  const auto rows =
      conn.query("SELECT (SELECT stream_xid::text FROM " + table() +
                 " ORDER BY stream_xid DESC LIMIT 1), (SELECT max(cursor_xid) FROM " +
                 subscription_table() + ")::text, pg_snapshot_xmax(pg_current_snapshot())::text");
  const auto next = std::stoll(rows[0].get_text(2));
  const auto row_xid = rows[0].get_optional_text(0);
  const auto cursor_xid = rows[0].get_optional_text(1);
  if ((row_xid && std::stoll(*row_xid) >= next) ||
      (cursor_xid && std::stoll(*cursor_xid) >= next)) {
    throw StreamError("the stream of " + table() + " holds transaction ids up to " +
                      std::to_string(std::max(std::stoll(row_xid.value_or("0")),
                                              std::stoll(cursor_xid.value_or("0")))) +
                      " but this server is at " + std::to_string(next) +
                      " (a database restored into another cluster?): new events would sort "
                      "before old ones. Fix: outbox stream rebase --db URL --table " +
                      table());
  }
}

std::int64_t PostgresStreamStore::rebase(sql::Connection& conn) {
  conn.begin();
  try {
    // Writers wait until the rebase commits: no row may be added under the old numbering.
    conn.execute("LOCK TABLE " + table() + " IN SHARE MODE");
    // Unread: the rows after the cursor in the old order, and every row written since the
    // restore (their ids are small, but their numbers follow the restored sequence, so above the
    // cursor's). The cursor goes just before the first of them: rows read already that sort after
    // it are delivered again, none is skipped.
    conn.execute("UPDATE " + subscription_table() + " s SET cursor_seq = COALESCE((SELECT " +
                 "min(o.stream_seq) - 1 FROM " + table() +
                 " o WHERE (o.stream_xid, o.stream_seq) > (s.cursor_xid::text::xid8, "
                 "s.cursor_seq) OR o.stream_seq > s.cursor_seq), (SELECT max(stream_seq) FROM " +
                 table() + "), s.cursor_seq), cursor_xid = 1, updated_at = now()");
    const auto moved = conn.execute("UPDATE " + table() +
                                    " SET stream_xid = '1'::xid8 WHERE stream_xid <> '1'::xid8");
    conn.commit();
    return moved;
  } catch (...) {
    if (conn.in_transaction()) {
      conn.rollback();
    }
    throw;
  }
}

}  // namespace outbox::postgres
