#include "outbox/postgres/store.hpp"

#include <algorithm>
#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/internal/event_row.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::postgres {
namespace {

using sql::TextRef;
using sql::Value;

constexpr std::size_t kInsertChunk = 500;  // 11 parameters a row, well under 65535

// A timestamp parameter given as microseconds since the epoch.
std::string ts(int param) {
  return "('epoch'::timestamptz + $" + std::to_string(param) +
         "::bigint * interval '1 microsecond')";
}

// The keyset condition for `after` (empty without one); its two parameters are appended.
std::string after_sql(const PendingKey* after, std::vector<sql::Value>& params) {
  if (after == nullptr) {
    return {};
  }
  params.emplace_back(to_micros(after->created_at));
  params.emplace_back(TextRef{after->event_id});
  const int n = static_cast<int>(params.size());
  return " AND (created_at, event_id) > (" + ts(n - 1) + ", $" + std::to_string(n) + ")";
}

std::string micros(const std::string& column) {
  return "(EXTRACT(EPOCH FROM " + column + ") * 1000000)::bigint";
}

std::string select_list() {
  return "event_id, event_type, aggregate_type, aggregate_id, tenant_id, payload::text, "
         "headers::text, status, attempts, " +
         micros("available_at") + ", " + micros("created_at") + ", " + micros("done_at") +
         ", last_error, locked_by, " + micros("locked_at") + ", payload_bytes";
}

// A text[] literal: {"a","b"} with quotes and backslashes escaped.
std::string text_array(const std::vector<std::string>& items) {
  std::string out = "{";
  for (std::size_t i = 0; i < items.size(); ++i) {
    if (i > 0) {
      out.push_back(',');
    }
    out.push_back('"');
    for (char c : items[i]) {
      if (c == '"' || c == '\\') {
        out.push_back('\\');
      }
      out.push_back(c);
    }
    out.push_back('"');
  }
  out.push_back('}');
  return out;
}

int to_int(std::int64_t n) {
  return static_cast<int>(n);
}

// The claim condition of a status update: an empty owner parameter means no claim locking.
std::string owned(int param) {
  const std::string p = "$" + std::to_string(param) + "::text";
  return " AND (" + p + " = '' OR locked_by = " + p + ")";
}

}  // namespace

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
               "CONSTRAINT " +
               derived_name(table, "_one_payload") +
               " CHECK ((payload IS NULL) <> (payload_bytes IS NULL)));" +
               // Pending rows only, in claim order: claim and poll read the head of this small
               // index instead of sorting the backlog (see docs/guide.md, "Indexes").
               "CREATE INDEX IF NOT EXISTS " + derived_name(table, "_pending") + " ON " + table +
               " (created_at, event_id) WHERE status IN (0, 2);" + "CREATE INDEX IF NOT EXISTS " +
               derived_name(table, "_terminal") + " ON " + table +
               " (created_at) WHERE status IN (1, 3);" + "CREATE INDEX IF NOT EXISTS " +
               derived_name(table, "_created") + " ON " + table + " (created_at);");
  // IF NOT EXISTS also skips a name another table's index holds (index names are per schema):
  // without its indexes the table would work, slowly, and nobody would know.
  for (const char* suffix : {"_pending", "_terminal", "_created"}) {
    const std::string index = derived_name(table, suffix);
    const auto rows = conn.query("SELECT count(*) FROM pg_indexes WHERE tablename = lower('" +
                                 table + "') AND indexname = lower('" + index + "')");
    if (rows.empty() || rows[0].get_int(0) == 0) {
      throw StoreError("postgres: index " + index + " of " + table +
                           " could not be created: another table's index has that name",
                       "42P07");
    }
  }
}

PostgresOutboxStore::PostgresOutboxStore(Options options) : options_(std::move(options)) {
  validate_table_name(options_.table);
  if (!options_.codec) {
    options_.codec = &JsonCodec::default_codec();
  }
  select_ = select_list();
  select_without_payload_ = select_;
  select_without_payload_.replace(select_without_payload_.find("payload::text"), 13, "''::text");
  select_without_payload_.replace(select_without_payload_.rfind("payload_bytes"), 13,
                                  "NULL::bytea");
  insert_one_sql_ = insert_sql(1);
}

std::string PostgresOutboxStore::recent_column() const {
  // skip_recent counts from the writer's occurred_at on the caller's clock, but from the time the
  // row became due (server time) on the database clock: writers' clocks may be skewed.
  return options_.use_database_clock ? "available_at" : "created_at";
}

std::string PostgresOutboxStore::now_sql(int param) const {
  // Not now(): that is the transaction's start, so a row written late in a long transaction
  // would be due (and its claim would expire) early.
  return options_.use_database_clock ? std::string("statement_timestamp()") : ts(param);
}

std::string PostgresOutboxStore::insert_sql(std::size_t rows) const {
  std::string sql =
      "INSERT INTO " + options_.table +
      " (event_id, event_type, aggregate_type, aggregate_id, tenant_id, payload, "
      "payload_bytes, headers, status, attempts, available_at, created_at, locked_by, "
      "locked_at) VALUES ";
  for (std::size_t i = 0; i < rows; ++i) {
    const int b = static_cast<int>(i) * 11;
    auto arg = [&](int k) { return "$" + std::to_string(b + k); };
    // Due time: the statement's server time plus the event's delay, or the absolute caller time.
    const std::string due = options_.use_database_clock ? "(statement_timestamp() + " + arg(9) +
                                                              "::bigint * interval '1 microsecond')"
                                                        : ts(b + 9);
    // The claim starts at the insert, never at the envelope's (possibly back-dated) occurred_at.
    // (No CASE … END: END would make every writing transaction look suspect to the connection.)
    const std::string claimed =
        options_.use_database_clock ? "statement_timestamp()" : ts(static_cast<int>(rows) * 11 + 1);
    sql += (i == 0 ? "(" : ",(") + arg(1) + "," + arg(2) + "," + arg(3) + "," + arg(4) + "," +
           arg(5) + "," + arg(6) + "::jsonb," + arg(7) + "::bytea," + arg(8) + "::jsonb,0,0," +
           due + "," + ts(b + 10) + "," + arg(11) + "::text,(SELECT " + claimed + " WHERE " +
           arg(11) + "::text IS NOT NULL))";
  }
  return sql;
}

void PostgresOutboxStore::insert_new(sql::Connection& conn, const EventEnvelope& event,
                                     std::string_view lock_owner) {
  insert_batch(conn, {event}, lock_owner);
}

void PostgresOutboxStore::insert_batch(sql::Connection& conn,
                                       const std::vector<EventEnvelope>& events,
                                       std::string_view lock_owner) {
  for (std::size_t start = 0; start < events.size(); start += kInsertChunk) {
    const std::size_t n = std::min(kInsertChunk, events.size() - start);
    // The one-row statement (every hot-path write) is built once; larger chunks per call.
    std::string chunk_sql;
    const std::string& sql = n == 1 ? insert_one_sql_ : (chunk_sql = insert_sql(n));
    std::vector<Value> params;
    params.reserve(n * 11 + 1);
    std::vector<std::optional<std::string>> headers(n);
    for (std::size_t i = 0; i < n; ++i) {
      const EventEnvelope& e = events[start + i];
      headers[i] = options_.codec->to_json(e.headers());
      params.emplace_back(TextRef{e.event_id()});
      params.emplace_back(TextRef{e.event_type()});
      params.emplace_back(TextRef{e.aggregate_type()});
      params.push_back(sql::text_or_null(e.aggregate_id()));
      params.push_back(sql::text_or_null(e.tenant_id()));
      if (e.has_json_payload()) {
        params.emplace_back(TextRef{e.payload_json()});
        params.emplace_back(std::monostate{});
      } else {
        params.emplace_back(std::monostate{});
        params.emplace_back(sql::BlobRef{e.payload_bytes()});
      }
      params.push_back(sql::text_or_null(headers[i]));
      const auto created = to_micros(e.occurred_at());
      const auto available = e.available_at() ? to_micros(*e.available_at()) : created;
      params.emplace_back(
          options_.use_database_clock ? std::max<std::int64_t>(0, available - created) : available);
      params.emplace_back(created);
      params.emplace_back(lock_owner.empty() ? Value(std::monostate{})
                                             : Value(TextRef{lock_owner}));
    }
    if (!options_.use_database_clock) {
      params.emplace_back(to_micros(Clock::system()->now()));
    }
    conn.execute(sql, params);
  }
}

int PostgresOutboxStore::mark_done(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                   std::string_view owner) {
  return mark_done_batch(conn, {std::string(event_id)}, now, owner);
}

int PostgresOutboxStore::mark_done_batch(sql::Connection& conn,
                                         const std::vector<std::string>& event_ids, Timestamp now,
                                         std::string_view owner) {
  if (event_ids.empty()) {
    return 0;
  }
  const std::string sql = "UPDATE " + options_.table + " SET status = 1, done_at = " + now_sql(3) +
                          ", locked_by = NULL, locked_at = NULL "
                          "WHERE event_id = ANY($1::text[]) AND status IN (0, 2)" +
                          owned(2);
  const std::string ids = text_array(event_ids);
  if (options_.use_database_clock) {
    return to_int(conn.execute(sql, {TextRef{ids}, TextRef{owner}}));
  }
  return to_int(conn.execute(sql, {TextRef{ids}, TextRef{owner}, to_micros(now)}));
}

int PostgresOutboxStore::mark_retry(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                    std::chrono::milliseconds delay, std::string_view error,
                                    std::string_view owner) {
  return reschedule(conn, event_id, now, delay, error, true, owner);
}

int PostgresOutboxStore::mark_deferred(sql::Connection& conn, std::string_view event_id,
                                       Timestamp now, std::chrono::milliseconds delay,
                                       std::string_view reason, std::string_view owner) {
  return reschedule(conn, event_id, now, delay, reason, false, owner);
}

int PostgresOutboxStore::reschedule(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                    std::chrono::milliseconds delay, std::string_view message,
                                    bool count_attempt, std::string_view owner) {
  const std::string sql = "UPDATE " + options_.table + " SET status = 2, attempts = attempts + " +
                          (count_attempt ? "1" : "0") + ", available_at = " + now_sql(5) +
                          " + $3::bigint * interval '1 millisecond', last_error = $2, "
                          "locked_by = NULL, locked_at = NULL "
                          "WHERE event_id = $1 AND status IN (0, 2)" +
                          owned(4);
  const std::string truncated = truncate_error(message);
  std::vector<Value> params = {TextRef{event_id}, TextRef{truncated},
                               static_cast<std::int64_t>(clamp_delay(delay).count()),
                               TextRef{owner}};
  if (!options_.use_database_clock) {
    params.emplace_back(to_micros(now));
  }
  return to_int(conn.execute(sql, params));
}

int PostgresOutboxStore::mark_dead(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                   std::string_view error, bool count_attempt,
                                   std::string_view owner) {
  const std::string truncated = truncate_error(error);
  const std::string sql = "UPDATE " + options_.table +
                          " SET status = 3, attempts = attempts + $3::int, last_error = $2, "
                          "done_at = " +
                          now_sql(5) +
                          ", locked_by = NULL, locked_at = NULL "
                          "WHERE event_id = $1 AND status IN (0, 2)" +
                          owned(4);
  std::vector<Value> params = {TextRef{event_id}, TextRef{truncated},
                               std::int64_t{count_attempt ? 1 : 0}, TextRef{owner}};
  if (!options_.use_database_clock) {
    params.emplace_back(to_micros(now));
  }
  return to_int(conn.execute(sql, params));
}

std::vector<std::string> PostgresOutboxStore::renew_claims(
    sql::Connection& conn, std::string_view owner, const std::vector<std::string>& event_ids,
    Timestamp now) {
  if (event_ids.empty()) {
    return {};
  }
  // Rows locked right now (a DONE batch, a status write) are being finished: skip them rather
  // than wait, since two multi-row updates locking rows in different orders would deadlock.
  const std::string sql = "WITH c AS (SELECT event_id FROM " + options_.table +
                          " WHERE event_id = ANY($1::text[]) AND locked_by = $2 AND "
                          "status IN (0, 2) FOR UPDATE SKIP LOCKED) UPDATE " +
                          options_.table + " o SET locked_at = " + now_sql(3) +
                          " FROM c WHERE o.event_id = c.event_id RETURNING o.event_id";
  const std::string ids = text_array(event_ids);
  std::vector<sql::Value> params = {TextRef{ids}, TextRef{owner}};
  if (!options_.use_database_clock) {
    params.emplace_back(to_micros(now));
  }
  std::vector<std::string> renewed;
  for (const auto& row : conn.query(sql, params)) {
    renewed.push_back(row.get_text(0));
  }
  return renewed;
}

std::vector<OutboxEvent> PostgresOutboxStore::poll_pending(sql::Connection& conn, Timestamp now,
                                                           std::chrono::microseconds skip_recent,
                                                           int limit, const PendingKey* after) {
  std::vector<sql::Value> params = {std::int64_t{limit},
                                    static_cast<std::int64_t>(skip_recent.count())};
  if (!options_.use_database_clock) {
    params.emplace_back(to_micros(now));
  }
  const std::string sql = "SELECT " + select_ + " FROM " + options_.table +
                          " WHERE status IN (0, 2) AND available_at <= " + now_sql(3) + " AND " +
                          recent_column() + " <= " + now_sql(3) +
                          " - $2::bigint * interval '1 microsecond'" + after_sql(after, params) +
                          " ORDER BY created_at, event_id LIMIT $1";
  return internal::events_from_rows(conn.query(sql, params));
}

std::vector<OutboxEvent> PostgresOutboxStore::claim_pending(sql::Connection& conn,
                                                            std::string_view owner, Timestamp now,
                                                            std::chrono::milliseconds lock_timeout,
                                                            std::chrono::microseconds skip_recent,
                                                            int limit, const PendingKey* after) {
  const auto& t = options_.table;
  std::vector<sql::Value> params = {TextRef{owner}, std::int64_t{limit},
                                    static_cast<std::int64_t>(skip_recent.count()),
                                    static_cast<std::int64_t>(lock_timeout.count())};
  if (!options_.use_database_clock) {
    params.emplace_back(to_micros(now));
  }
  // One round trip: lock the oldest claimable rows (skipping rows other nodes are claiming right
  // now), stamp them, and return them in claim order.
  const std::string sql =
      "WITH c AS (SELECT event_id FROM " + t +
      " WHERE status IN (0, 2) AND available_at <= " + now_sql(5) + " AND " + recent_column() +
      " <= " + now_sql(5) +
      " - $3::bigint * interval '1 microsecond' AND (locked_by IS NULL OR locked_at < " +
      now_sql(5) + " - $4::bigint * interval '1 millisecond' OR (locked_by = $1 AND locked_at < " +
      now_sql(5) + " - LEAST($4::bigint / 10, 10000) * interval '1 millisecond'))" +
      after_sql(after, params) +
      " ORDER BY created_at, event_id LIMIT $2 "
      "FOR UPDATE SKIP LOCKED), "
      "u AS (UPDATE " +
      t + " o SET locked_by = $1, locked_at = " + now_sql(5) +
      " FROM c WHERE o.event_id = c.event_id RETURNING o.*) SELECT " + select_ +
      " FROM u ORDER BY created_at, event_id";
  return internal::events_from_rows(conn.query(sql, params));
}

std::vector<OutboxEvent> PostgresOutboxStore::query_dead(
    sql::Connection& conn, std::optional<std::string_view> event_type,
    std::optional<std::string_view> aggregate_type, int limit, bool with_payloads) {
  return internal::events_from_rows(conn.query(
      "SELECT " + (with_payloads ? select_ : select_without_payload_) + " FROM " + options_.table +
          " WHERE status = 3 AND ($1::text IS NULL OR event_type = $1) AND "
          "($2::text IS NULL OR aggregate_type = $2) "
          "ORDER BY created_at, event_id LIMIT $3",
      {sql::text_or_null(event_type), sql::text_or_null(aggregate_type), std::int64_t{limit}}));
}

int PostgresOutboxStore::replay_dead(sql::Connection& conn, std::string_view event_id,
                                     Timestamp now) {
  const std::string sql = "UPDATE " + options_.table +
                          " SET status = 0, attempts = 0, available_at = " + now_sql(2) +
                          ", done_at = NULL, locked_by = NULL, locked_at = NULL "
                          "WHERE event_id = $1 AND status = 3";
  if (options_.use_database_clock) {
    return to_int(conn.execute(sql, {TextRef{event_id}}));
  }
  return to_int(conn.execute(sql, {TextRef{event_id}, to_micros(now)}));
}

int PostgresOutboxStore::count_dead(sql::Connection& conn,
                                    std::optional<std::string_view> event_type) {
  return to_int(conn.query("SELECT COUNT(*) FROM " + options_.table +
                               " WHERE status = 3 AND ($1::text IS NULL OR event_type = $1)",
                           {sql::text_or_null(event_type)})
                    .at(0)
                    .get_int(0));
}

std::optional<OutboxEvent> PostgresOutboxStore::find(sql::Connection& conn,
                                                     std::string_view event_id) {
  auto rows = conn.query("SELECT " + select_ + " FROM " + options_.table + " WHERE event_id = $1",
                         {TextRef{event_id}});
  if (rows.empty()) {
    return std::nullopt;
  }
  return internal::event_from_row(rows.front());
}

std::vector<std::int64_t> PostgresOutboxStore::count_by_status(sql::Connection& conn) {
  return internal::count_by_status(conn, options_.table);
}

int PostgresOutboxStore::release_claims(sql::Connection& conn, std::string_view owner) {
  return internal::release_claims(conn, options_.table, "$1", owner);
}

std::vector<std::pair<std::string, std::int64_t>> PostgresOutboxStore::count_dead_by_type(
    sql::Connection& conn) {
  return internal::count_dead_by_type(conn, options_.table);
}

std::optional<Timestamp> PostgresOutboxStore::oldest_pending(sql::Connection& conn) {
  return internal::optional_micros(conn, std::string("SELECT ") + micros("MIN(created_at)") +
                                             " FROM " + options_.table + " WHERE status IN (0, 2)");
}

PostgresEventPurger::PostgresEventPurger(std::string table) : table_(std::move(table)) {
  validate_table_name(table_);
}

int PostgresEventPurger::purge(sql::Connection& conn, Timestamp before, int limit) {
  return to_int(
      // The conditions stand in the DELETE too, not only in the sub-select: a row replayed (or
      // otherwise changed) while the DELETE waits for its lock is re-checked against them.
      conn.execute("DELETE FROM " + table_ + " WHERE event_id IN (SELECT event_id FROM " + table_ +
                       " WHERE status IN (1, 3) AND COALESCE(done_at, created_at) < " + ts(1) +
                       " AND (status = 1 OR done_at IS NOT NULL) ORDER BY created_at LIMIT $2)" +
                       " AND status IN (1, 3) AND COALESCE(done_at, created_at) < " + ts(1) +
                       " AND (status = 1 OR done_at IS NOT NULL)",
                   {to_micros(before), std::int64_t{limit}}));
}

PostgresAgeBasedPurger::PostgresAgeBasedPurger(std::string table) : table_(std::move(table)) {
  validate_table_name(table_);
}

int PostgresAgeBasedPurger::purge(sql::Connection& conn, Timestamp before, int limit) {
  return to_int(conn.execute("DELETE FROM " + table_ + " WHERE event_id IN (SELECT event_id FROM " +
                                 table_ + " WHERE created_at < " + ts(1) +
                                 " AND NOT (status IN (0, 2) AND locked_by IS NOT NULL)"
                                 " ORDER BY created_at LIMIT $2)"
                                 " AND NOT (status IN (0, 2) AND locked_by IS NOT NULL)",
                             {to_micros(before), std::int64_t{limit}}));
}

}  // namespace outbox::postgres
