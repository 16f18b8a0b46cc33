#include "outbox/sqlite/store.hpp"

#include <algorithm>
#include <stdexcept>

#include "outbox/internal/event_row.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::sqlite {
namespace {

using sql::TextRef;
using sql::Value;

constexpr int kColumnsPerRow = 13;
// SQLite allows 32766 bound variables per statement (3.32+); stay well below it.
constexpr std::size_t kInsertChunk = 500;
constexpr std::size_t kIdChunk = 500;

}  // namespace

void create_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("CREATE TABLE IF NOT EXISTS " + table +
               " ("
               "event_id TEXT PRIMARY KEY NOT NULL, "
               "event_type TEXT NOT NULL, "
               "aggregate_type TEXT, "
               "aggregate_id TEXT, "
               "tenant_id TEXT, "
               "payload BLOB NOT NULL, "
               "headers TEXT, "
               "status INTEGER NOT NULL, "
               "attempts INTEGER NOT NULL DEFAULT 0, "
               "available_at INTEGER NOT NULL, "
               "created_at INTEGER NOT NULL, "
               "done_at INTEGER, "
               "last_error TEXT, "
               "locked_by TEXT, "
               "locked_at INTEGER)");
  // Pending rows only, in poll order: poll and claim walk this small index instead of the whole
  // table, however many DONE rows wait for purge.
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_pending ON " + table +
               " (created_at, event_id) WHERE status IN (0, 2)");
  // Terminal rows in purge order.
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_terminal ON " + table +
               " (created_at) WHERE status IN (1, 3)");
  conn.execute("CREATE INDEX IF NOT EXISTS " + table + "_created ON " + table + " (created_at)");
}

SqliteOutboxStore::SqliteOutboxStore(std::string table, const JsonCodec& codec)
    : table_(std::move(table)), codec_(codec) {
  validate_table_name(table_);
  select_columns_ =
      "event_id, event_type, aggregate_type, aggregate_id, tenant_id, payload, headers, status, "
      "attempts, available_at, created_at, done_at, last_error, locked_by, locked_at";
  select_without_payload_ = select_columns_;
  select_without_payload_.replace(select_without_payload_.find("payload,"), 8, "'',");
  // Built once so the hot path does not format SQL.
  // An empty owner parameter means "whoever holds the row" (no claim locking).
  const auto owned = [](int param) {
    const std::string p = "?" + std::to_string(param);
    return " AND status IN (0, 2) AND (" + p + " = '' OR locked_by = " + p + ")";
  };
  mark_done_sql_ = "UPDATE " + table_ +
                   " SET status = 1, done_at = ?1, locked_by = NULL, locked_at = NULL "
                   "WHERE event_id = ?2" +
                   owned(3);
  mark_retry_sql_ = "UPDATE " + table_ +
                    " SET status = 2, attempts = attempts + 1, available_at = ?1, "
                    "last_error = ?2, locked_by = NULL, locked_at = NULL WHERE event_id = ?3" +
                    owned(4);
  mark_deferred_sql_ = "UPDATE " + table_ +
                       " SET status = 2, available_at = ?1, last_error = ?2, locked_by = NULL, "
                       "locked_at = NULL WHERE event_id = ?3" +
                       owned(4);
  mark_dead_sql_ = "UPDATE " + table_ +
                   " SET status = 3, attempts = attempts + ?1, last_error = ?2, done_at = ?4, "
                   "locked_by = NULL, locked_at = NULL WHERE event_id = ?3" +
                   owned(5);
  // Each with a keyset variant that starts after a (created_at, event_id) key.
  const auto poll = [&](const std::string& extra) {
    return "SELECT " + select_columns_ + " FROM " + table_ +
           " WHERE status IN (0, 2) AND available_at <= ?1 AND created_at <= ?2" + extra +
           " ORDER BY created_at, event_id LIMIT ?3";
  };
  const auto claim = [&](const std::string& extra) {
    return "UPDATE " + table_ +
           " SET locked_by = ?1, locked_at = ?2 WHERE event_id IN (SELECT event_id FROM " + table_ +
           " WHERE status IN (0, 2) AND available_at <= ?3 AND created_at <= ?4 AND "
           "(locked_by IS NULL OR locked_at < ?5 OR (locked_by = ?1 AND locked_at < ?7))" +
           extra + " ORDER BY created_at, event_id LIMIT ?6) RETURNING " + select_columns_;
  };
  poll_sql_ = poll("");
  poll_after_sql_ = poll(" AND (created_at, event_id) > (?4, ?5)");
  claim_sql_ = claim("");
  claim_after_sql_ = claim(" AND (created_at, event_id) > (?8, ?9)");
}

void SqliteOutboxStore::insert_new(sql::Connection& conn, const EventEnvelope& event,
                                   std::string_view lock_owner) {
  insert_chunk(conn, &event, 1, lock_owner);
}

void SqliteOutboxStore::insert_batch(sql::Connection& conn,
                                     const std::vector<EventEnvelope>& events,
                                     std::string_view lock_owner) {
  for (std::size_t i = 0; i < events.size(); i += kInsertChunk) {
    insert_chunk(conn, events.data() + i, std::min(kInsertChunk, events.size() - i), lock_owner);
  }
}

void SqliteOutboxStore::insert_chunk(sql::Connection& conn, const EventEnvelope* events,
                                     std::size_t count, std::string_view lock_owner) {
  std::string sql =
      "INSERT INTO " + table_ +
      " (event_id, event_type, aggregate_type, aggregate_id, tenant_id, payload, "
      "headers, status, attempts, available_at, created_at, locked_by, locked_at) VALUES ";
  std::vector<Value> params;
  params.reserve(count * kColumnsPerRow);
  // Encoded headers must outlive the statement: the parameters borrow them.
  std::vector<std::optional<std::string>> headers(count);
  // A claim starts when the row is written, whatever the envelope's occurred_at says: a back-dated
  // event must not be born with an expired claim that another node may take at once.
  const std::int64_t claimed_at = to_micros(Clock::system()->now());
  for (std::size_t i = 0; i < count; ++i) {
    const EventEnvelope& e = events[i];
    sql += i == 0 ? "(?,?,?,?,?,?,?,0,0,?,?,?,?)" : ",(?,?,?,?,?,?,?,0,0,?,?,?,?)";
    headers[i] = codec_.to_json(e.headers());
    params.emplace_back(TextRef{e.event_id()});
    params.emplace_back(TextRef{e.event_type()});
    params.emplace_back(TextRef{e.aggregate_type()});
    params.push_back(sql::text_or_null(e.aggregate_id()));
    params.push_back(sql::text_or_null(e.tenant_id()));
    if (e.has_json_payload()) {
      params.emplace_back(TextRef{e.payload_json()});
    } else {
      params.emplace_back(sql::BlobRef{e.payload_bytes()});
    }
    params.push_back(sql::text_or_null(headers[i]));
    const auto created = to_micros(e.occurred_at());
    params.emplace_back(e.available_at() ? to_micros(*e.available_at()) : created);
    params.emplace_back(created);
    if (lock_owner.empty()) {
      params.emplace_back(std::monostate{});
      params.emplace_back(std::monostate{});
    } else {
      params.emplace_back(TextRef{lock_owner});
      params.emplace_back(claimed_at);
    }
  }
  conn.execute(sql, params);
}

int SqliteOutboxStore::mark_done(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                 std::string_view owner) {
  return static_cast<int>(
      conn.execute(mark_done_sql_, {to_micros(now), TextRef{event_id}, TextRef{owner}}));
}

int SqliteOutboxStore::mark_done_batch(sql::Connection& conn,
                                       const std::vector<std::string>& event_ids, Timestamp now,
                                       std::string_view owner) {
  int changed = 0;
  for (std::size_t i = 0; i < event_ids.size(); i += kIdChunk) {
    const std::size_t n = std::min(kIdChunk, event_ids.size() - i);
    std::vector<Value> params;
    params.reserve(n + 3);
    params.emplace_back(to_micros(now));
    for (std::size_t k = 0; k < n; ++k) {
      params.emplace_back(TextRef{event_ids[i + k]});
    }
    params.emplace_back(TextRef{owner});
    params.emplace_back(TextRef{owner});
    changed += static_cast<int>(conn.execute(
        "UPDATE " + table_ +
            " SET status = 1, done_at = ?, locked_by = NULL, locked_at = NULL "
            "WHERE event_id IN (" +
            internal::question_marks(n) + ") AND status IN (0, 2) AND (? = '' OR locked_by = ?)",
        params));
  }
  return changed;
}

int SqliteOutboxStore::mark_retry(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                  std::chrono::milliseconds delay, std::string_view error,
                                  std::string_view owner) {
  const std::string truncated = truncate_error(error);
  return static_cast<int>(
      conn.execute(mark_retry_sql_, {to_micros(now + clamp_delay(delay)), TextRef{truncated},
                                     TextRef{event_id}, TextRef{owner}}));
}

int SqliteOutboxStore::mark_deferred(sql::Connection& conn, std::string_view event_id,
                                     Timestamp now, std::chrono::milliseconds delay,
                                     std::string_view reason, std::string_view owner) {
  const std::string truncated = truncate_error(reason);
  return static_cast<int>(
      conn.execute(mark_deferred_sql_, {to_micros(now + clamp_delay(delay)), TextRef{truncated},
                                        TextRef{event_id}, TextRef{owner}}));
}

int SqliteOutboxStore::mark_dead(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                 std::string_view error, bool count_attempt,
                                 std::string_view owner) {
  const std::string truncated = truncate_error(error);
  return static_cast<int>(
      conn.execute(mark_dead_sql_, {std::int64_t{count_attempt ? 1 : 0}, TextRef{truncated},
                                    TextRef{event_id}, to_micros(now), TextRef{owner}}));
}

std::vector<std::string> SqliteOutboxStore::renew_claims(sql::Connection& conn,
                                                         std::string_view owner,
                                                         const std::vector<std::string>& event_ids,
                                                         Timestamp now) {
  std::vector<std::string> renewed;
  for (std::size_t i = 0; i < event_ids.size(); i += kIdChunk) {
    const std::size_t n = std::min(kIdChunk, event_ids.size() - i);
    std::vector<Value> params;
    params.reserve(n + 2);
    params.emplace_back(to_micros(now));
    params.emplace_back(TextRef{owner});
    for (std::size_t k = 0; k < n; ++k) {
      params.emplace_back(TextRef{event_ids[i + k]});
    }
    for (const auto& row : conn.query("UPDATE " + table_ +
                                          " SET locked_at = ? WHERE locked_by = ? AND "
                                          "status IN (0, 2) AND event_id IN (" +
                                          internal::question_marks(n) + ") RETURNING event_id",
                                      params)) {
      renewed.push_back(row.get_text(0));
    }
  }
  return renewed;
}

std::vector<OutboxEvent> SqliteOutboxStore::poll_pending(sql::Connection& conn, Timestamp now,
                                                         std::chrono::microseconds skip_recent,
                                                         int limit, const PendingKey* after) {
  if (after != nullptr) {
    return internal::events_from_rows(conn.query(
        poll_after_sql_, {to_micros(now), to_micros(now - skip_recent), std::int64_t{limit},
                          to_micros(after->created_at), TextRef{after->event_id}}));
  }
  return internal::events_from_rows(
      conn.query(poll_sql_, {to_micros(now), to_micros(now - skip_recent), std::int64_t{limit}}));
}

std::vector<OutboxEvent> SqliteOutboxStore::claim_pending(sql::Connection& conn,
                                                          std::string_view owner, Timestamp now,
                                                          std::chrono::milliseconds lock_timeout,
                                                          std::chrono::microseconds skip_recent,
                                                          int limit, const PendingKey* after) {
  // One statement: SQLite runs it under the database write lock, so two processes can never
  // both claim a row.
  std::vector<sql::Value> params = {TextRef{owner},
                                    to_micros(now),
                                    to_micros(now),
                                    to_micros(now - skip_recent),
                                    to_micros(now - lock_timeout),
                                    std::int64_t{limit},
                                    to_micros(now - own_claim_grace(lock_timeout))};
  if (after != nullptr) {
    params.emplace_back(to_micros(after->created_at));
    params.emplace_back(TextRef{after->event_id});
  }
  auto events = internal::events_from_rows(
      conn.query(after != nullptr ? claim_after_sql_ : claim_sql_, params));
  // RETURNING gives no order guarantee.
  std::sort(events.begin(), events.end(), [](const OutboxEvent& a, const OutboxEvent& b) {
    return a.created_at != b.created_at ? a.created_at < b.created_at : a.event_id < b.event_id;
  });
  return events;
}

std::vector<OutboxEvent> SqliteOutboxStore::query_dead(
    sql::Connection& conn, std::optional<std::string_view> event_type,
    std::optional<std::string_view> aggregate_type, int limit, bool with_payloads) {
  return internal::events_from_rows(conn.query(
      "SELECT " + (with_payloads ? select_columns_ : select_without_payload_) + " FROM " + table_ +
          " WHERE status = 3 AND (?1 IS NULL OR event_type = ?1) AND "
          "(?2 IS NULL OR aggregate_type = ?2) "
          "ORDER BY created_at, event_id LIMIT ?3",
      {sql::text_or_null(event_type), sql::text_or_null(aggregate_type), std::int64_t{limit}}));
}

int SqliteOutboxStore::replay_dead(sql::Connection& conn, std::string_view event_id,
                                   Timestamp now) {
  return static_cast<int>(conn.execute(
      "UPDATE " + table_ +
          " SET status = 0, attempts = 0, available_at = ?, done_at = NULL, locked_by = NULL, "
          "locked_at = NULL WHERE event_id = ? AND status = 3",
      {to_micros(now), TextRef{event_id}}));
}

int SqliteOutboxStore::count_dead(sql::Connection& conn,
                                  std::optional<std::string_view> event_type) {
  auto rows = conn.query(
      "SELECT COUNT(*) FROM " + table_ + " WHERE status = 3 AND (?1 IS NULL OR event_type = ?1)",
      {sql::text_or_null(event_type)});
  return static_cast<int>(rows.at(0).get_int(0));
}

std::optional<OutboxEvent> SqliteOutboxStore::find(sql::Connection& conn,
                                                   std::string_view event_id) {
  auto rows = conn.query("SELECT " + select_columns_ + " FROM " + table_ + " WHERE event_id = ?",
                         {TextRef{event_id}});
  if (rows.empty()) {
    return std::nullopt;
  }
  return internal::event_from_row(rows.front());
}

std::vector<std::int64_t> SqliteOutboxStore::count_by_status(sql::Connection& conn) {
  return internal::count_by_status(conn, table_);
}

int SqliteOutboxStore::release_claims(sql::Connection& conn, std::string_view owner) {
  return internal::release_claims(conn, table_, "?", owner);
}

std::vector<std::pair<std::string, std::int64_t>> SqliteOutboxStore::count_dead_by_type(
    sql::Connection& conn) {
  return internal::count_dead_by_type(conn, table_);
}

std::optional<Timestamp> SqliteOutboxStore::oldest_pending(sql::Connection& conn) {
  return internal::optional_micros(conn, std::string("SELECT ") + "MIN(created_at)" + " FROM " +
                                             table_ + " WHERE status IN (0, 2)");
}

SqliteEventPurger::SqliteEventPurger(std::string table) : table_(std::move(table)) {
  validate_table_name(table_);
}

int SqliteEventPurger::purge(sql::Connection& conn, Timestamp before, int limit) {
  return static_cast<int>(
      conn.execute("DELETE FROM " + table_ + " WHERE event_id IN (SELECT event_id FROM " + table_ +
                       " WHERE status IN (1, 3) AND COALESCE(done_at, created_at) < ? AND "
                       "(status = 1 OR done_at IS NOT NULL) "
                       "ORDER BY created_at LIMIT ?)",
                   {to_micros(before), std::int64_t{limit}}));
}

SqliteAgeBasedPurger::SqliteAgeBasedPurger(std::string table) : table_(std::move(table)) {
  validate_table_name(table_);
}

int SqliteAgeBasedPurger::purge(sql::Connection& conn, Timestamp before, int limit) {
  return static_cast<int>(conn.execute("DELETE FROM " + table_ +
                                           " WHERE event_id IN (SELECT event_id FROM " + table_ +
                                           " WHERE created_at < ? AND NOT (status IN (0, 2) AND "
                                           "locked_by IS NOT NULL) ORDER BY created_at LIMIT ?)",
                                       {to_micros(before), std::int64_t{limit}}));
}

}  // namespace outbox::sqlite
