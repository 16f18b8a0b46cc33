#include "outbox/sql/sql_store.hpp"

#include <algorithm>
#include <limits>

#include "outbox/errors.hpp"
#include "outbox/internal/ascii.hpp"
#include "outbox/internal/event_row.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/sql/stream_store.hpp"
#include "outbox/trace_context.hpp"

namespace outbox::sql {
namespace {

constexpr std::size_t kInsertChunk = 500;  // rows per INSERT: far below every engine's limits
constexpr std::size_t kIdChunk = 500;      // ids per IN (…) list

// `value` escaped for java.util.Properties.load: a backslash, a line break or a leading blank
// would otherwise change what is read (or fail it: "\uZZZZ" throws in Java).
std::string properties_value(std::string_view value) {
  std::string out;
  for (std::size_t i = 0; i < value.size(); ++i) {
    const char c = value[i];
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\f':
        out += "\\f";
        break;
      case ' ':
        out += i == 0 ? "\\ " : " ";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// The trace context as Debezium's outbox event router reads it from tracingspancontext: the text
// of a java.util.Properties ("traceparent=…\ntracestate=…\n"); NULL without a traceparent.
Value tracing_span_context(const EventEnvelope& e) {
  std::string text;
  for (const auto name : {kTraceparentHeader, kTracestateHeader}) {
    for (const auto& [key, value] : e.headers()) {
      if (internal::iequals(key, name)) {
        text += std::string(name) + "=" + properties_value(value) + "\n";
        break;
      }
    }
    if (text.empty()) {
      break;  // a tracestate alone is no context
    }
  }
  return text.empty() ? Value(std::monostate{}) : Value(std::move(text));
}

int to_int(std::int64_t n) {
  return static_cast<int>(n);
}

// The same DELETE on every engine: through a sub-select of the table, or with ORDER BY … LIMIT
// where the engine cannot select from the table it deletes from. `condition` appends the rows'
// condition (its parameters too) and is called again for the outer DELETE: a row changed while
// the DELETE waited for its lock is re-checked against it.
template <typename Condition>
int delete_oldest(Connection& conn, const Dialect& d, const std::string& table,
                  const std::string& order, int limit, Condition condition) {
  Statement s(d, false);
  if (d.delete_with_limit()) {
    s.sql("DELETE FROM " + table + " WHERE ");
    condition(s);
    s.sql(" ORDER BY " + order + " LIMIT ").param(std::int64_t{limit});
    return to_int(s.execute(conn));
  }
  s.sql("DELETE FROM " + table + " WHERE event_id IN (SELECT event_id FROM " + table + " WHERE ");
  condition(s);
  s.sql(" ORDER BY " + order + " LIMIT ").param(std::int64_t{limit}).sql(") AND ");
  condition(s);
  return to_int(s.execute(conn));
}

// A row a subscription has not read yet is kept, whatever its age or status, unless that
// subscription released its rows (StreamStore::release_retention).
std::string not_retained_by_subscriptions(const Dialect& d, const std::string& table) {
  return " AND NOT EXISTS (SELECT 1 FROM " + subscription_table_name(table) +
         " s WHERE s.released_at IS NULL AND " + d.after_cursor() + ")";
}

}  // namespace

SqlOutboxStore::SqlOutboxStore(const Dialect& dialect, Options options)
    : dialect_(dialect),
      options_(std::move(options)),
      database_clock_(options_.use_database_clock && !dialect.server_now().empty()),
      columns_(internal::event_columns(dialect, true)),
      columns_without_payload_(internal::event_columns(dialect, false)) {
  validate_table_name(options_.table);
  if (!options_.fence_table.empty()) {
    validate_table_name(options_.fence_table);
  }
  lease_table_ =
      lease_table_name(options_.fence_table.empty() ? options_.table : options_.fence_table);
  if (options_.codec == nullptr) {
    options_.codec = &JsonCodec::default_codec();
  }
}

void SqlOutboxStore::condition_on_lease(Statement& s) const {
  if (!options_.fence) {
    return;
  }
  const auto token = options_.fence->token();
  if (!token) {
    throw LeaseLostError(
        "not the holder of the lease this store's writes are fenced on: nothing "
        "written (its holder does the work)");
  }
  append_fence(s, dialect_, lease_table_, *token);
}

void SqlOutboxStore::done_by(Statement& s, std::string_view owner) {
  // A grouped row is held by its partition's lease, not locked (GroupStore::claim): a DONE mark
  // says it was delivered, whoever delivered it. Other rows only while `owner` holds their claim.
  if (!owner.empty()) {
    s.sql(" AND (message_group IS NOT NULL OR locked_by = ").param(TextRef{owner}).sql(")");
  }
}

int SqlOutboxStore::fenced_result(std::int64_t changed, std::size_t expected) const {
  if (options_.fence && changed < static_cast<std::int64_t>(expected)) {
    options_.fence->verify();
  }
  return to_int(changed);
}

std::size_t SqlOutboxStore::id_chunk() const {
  return dialect_.id_array() ? std::numeric_limits<std::size_t>::max() : kIdChunk;
}

std::size_t SqlOutboxStore::insert_byte_budget(Connection&) {
  return std::numeric_limits<std::size_t>::max();
}

void SqlOutboxStore::require_json_payloads(const EventEnvelope* events, std::size_t count) const {
  if (!options_.debezium) {
    return;
  }
  for (std::size_t i = 0; i < count; ++i) {
    if (!events[i].has_json_payload()) {
      throw std::invalid_argument("event " + events[i].event_id() +
                                  ": a table Debezium reads takes JSON payloads only (its outbox "
                                  "event router reads one payload column); nothing was written");
    }
  }
}

void SqlOutboxStore::insert_new(Connection& conn, const EventEnvelope& event,
                                std::string_view lock_owner) {
  require_json_payloads(&event, 1);
  const std::optional<std::string> headers = options_.codec->to_json(event.headers());
  insert_chunk(conn, &event, &headers, 1, lock_owner, Clock::system()->now());
}

void SqlOutboxStore::insert_batch(Connection& conn, const std::vector<EventEnvelope>& events,
                                  std::string_view lock_owner) {
  // Before the first chunk: a refusal must leave none of the batch behind.
  require_json_payloads(events.data(), events.size());
  // A claim starts when the row is written, whatever the envelope's occurred_at says: a
  // back-dated event must not be born with an expired claim that another node may take at once.
  const Timestamp claimed_at = Clock::system()->now();
  // Encoded once, and measured as sent: JSON escaping can make headers six times their text.
  std::vector<std::optional<std::string>> headers(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    headers[i] = options_.codec->to_json(events[i].headers());
  }
  // Chunks by rows and by bytes: one statement larger than what the server accepts fails.
  const std::size_t budget =
      events.size() > 1 ? insert_byte_budget(conn) : std::numeric_limits<std::size_t>::max();
  std::size_t start = 0;
  while (start < events.size()) {
    std::size_t n = 0, bytes = 0;
    while (start + n < events.size() && n < kInsertChunk) {
      const EventEnvelope& e = events[start + n];
      std::size_t size = e.payload_bytes().size() + e.event_id().size() + e.event_type().size() +
                         e.aggregate_type().size() + e.aggregate_id().value_or("").size() +
                         e.tenant_id().value_or("").size() + e.message_group().value_or("").size() +
                         headers[start + n].value_or("").size() + 256;
      for (const auto& [name, value] : e.tags()) {
        size += 6 * (name.size() + value.size()) + 8;  // as JSON, escapes at their widest
      }
      if (n > 0 && bytes + size > budget) {
        break;
      }
      bytes += size;
      ++n;
    }
    insert_chunk(conn, events.data() + start, headers.data() + start, n, lock_owner, claimed_at);
    start += n;
  }
}

void SqlOutboxStore::insert_chunk(Connection& conn, const EventEnvelope* events,
                                  const std::optional<std::string>* headers, std::size_t count,
                                  std::string_view lock_owner, Timestamp claimed_at) {
  const bool bytes_column = dialect_.has_bytes_column();
  const bool debezium = options_.debezium.has_value();
  // Only a chunk that has tags names their column: writers that use none keep working on a table
  // not yet migrated to schema version 4.
  std::vector<std::optional<std::string>> tags;
  for (std::size_t i = 0; i < count; ++i) {
    if (!events[i].tags().empty()) {
      tags.resize(count);
      for (std::size_t j = 0; j < count; ++j) {
        tags[j] = options_.codec->to_json(events[j].tags());
      }
      break;
    }
  }
  // The same for message groups (schema version 5).
  const bool groups =
      std::any_of(events, events + count, [](const EventEnvelope& e) { return e.message_group(); });
  Statement s = statement();
  s.sql("INSERT INTO " + options_.table +
        " (event_id, event_type, aggregate_type, aggregate_id, tenant_id, payload, " +
        (bytes_column ? "payload_bytes, " : "") + (tags.empty() ? "" : "tags, ") +
        (groups ? "message_group, partition_no, " : "") + (debezium ? "tracingspancontext, " : "") +
        "headers, status, attempts, available_at, created_at, locked_by, locked_at) VALUES ");
  const std::string fresh = "," + status_sql(EventStatus::New) + ",0,";
  for (std::size_t i = 0; i < count; ++i) {
    const EventEnvelope& e = events[i];
    s.sql(i == 0 ? "(" : ",(");
    s.param(TextRef{e.event_id()}).sql(",").param(TextRef{e.event_type()}).sql(",");
    s.param(TextRef{e.aggregate_type()}).sql(",").param(text_or_null(e.aggregate_id())).sql(",");
    s.param(text_or_null(e.tenant_id())).sql(",");
    if (!bytes_column) {
      s.param(e.has_json_payload() ? Value(TextRef{e.payload_json()})
                                   : Value(BlobRef{e.payload_bytes()}));
    } else if (e.has_json_payload()) {
      s.param(TextRef{e.payload_json()}, "jsonb").sql(",NULL");
    } else {
      s.sql("NULL,").param(BlobRef{e.payload_bytes()}, "bytea");
    }
    if (!tags.empty()) {
      s.sql(",").param(text_or_null(tags[i]), "jsonb");
    }
    if (groups) {
      if (const auto& group = e.message_group()) {
        s.sql(",")
            .param(TextRef{*group})
            .sql(",")
            .param(std::int64_t{message_group_partition(*group)});
      } else {
        s.sql(",NULL,NULL");
      }
    }
    if (debezium) {
      s.sql(",").param(tracing_span_context(e));
    }
    s.sql(",").param(text_or_null(headers[i]), "jsonb").sql(fresh);
    const auto created = to_micros(e.occurred_at());
    const auto available = e.available_at() ? to_micros(*e.available_at()) : created;
    if (database_clock_) {
      // Due after the event's delay on the server's clock: writers' clocks may be skewed.
      s.sql("(").now(claimed_at).sql(" + ").micros(std::max<std::int64_t>(0, available - created));
      s.sql(")");
    } else {
      s.at(from_micros(available));
    }
    s.sql(",").at(e.occurred_at()).sql(",");
    if (lock_owner.empty()) {
      s.sql("NULL,NULL)");
    } else {
      s.param(TextRef{lock_owner}).sql(",").now(claimed_at).sql(")");
    }
  }
  s.execute(conn);
  if (debezium && options_.debezium->delete_after_insert) {
    std::vector<std::string> ids;
    ids.reserve(count);
    for (std::size_t i = 0; i < count; ++i) {
      ids.push_back(events[i].event_id());
    }
    Statement d = statement();
    d.sql("DELETE FROM " + options_.table + " WHERE").ids_in("event_id", ids, 0, ids.size());
    d.execute(conn);
  }
}

int SqlOutboxStore::mark_done(Connection& conn, std::string_view event_id, Timestamp now,
                              std::string_view owner) {
  Statement s = statement();
  s.sql("UPDATE " + options_.table + " SET status = " + status_sql(EventStatus::Done) +
        ", done_at = ")
      .now(now)
      .sql(", locked_by = NULL, locked_at = NULL WHERE event_id = ")
      .param(TextRef{event_id})
      .sql(" AND " + pending_statuses());
  done_by(s, owner);
  condition_on_lease(s);
  return fenced_result(s.execute(conn), 1);
}

int SqlOutboxStore::mark_done_batch(Connection& conn, const std::vector<std::string>& event_ids,
                                    Timestamp now, std::string_view owner) {
  int changed = 0;
  const std::size_t chunk = id_chunk();
  for (std::size_t i = 0; i < event_ids.size(); i += chunk) {
    const std::size_t n = std::min(chunk, event_ids.size() - i);
    Statement s = statement();
    s.sql("UPDATE " + options_.table + " SET status = " + status_sql(EventStatus::Done) +
          ", done_at = ")
        .now(now)
        .sql(", locked_by = NULL, locked_at = NULL WHERE")
        .ids_in("event_id", event_ids, i, n)
        .sql(" AND " + pending_statuses());
    done_by(s, owner);
    condition_on_lease(s);
    changed += fenced_result(s.execute(conn), n);
  }
  return changed;
}

int SqlOutboxStore::mark_retry(Connection& conn, std::string_view event_id, Timestamp now,
                               std::chrono::milliseconds delay, std::string_view error,
                               std::string_view owner) {
  return reschedule(conn, event_id, now, delay, error, true, owner);
}

int SqlOutboxStore::mark_deferred(Connection& conn, std::string_view event_id, Timestamp now,
                                  std::chrono::milliseconds delay, std::string_view reason,
                                  std::string_view owner) {
  return reschedule(conn, event_id, now, delay, reason, false, owner);
}

int SqlOutboxStore::reschedule(Connection& conn, std::string_view event_id, Timestamp now,
                               std::chrono::milliseconds delay, std::string_view message,
                               bool count_attempt, std::string_view owner) {
  const std::string truncated = truncate_error(message);
  Statement s = statement();
  s.sql("UPDATE " + options_.table + " SET status = " + status_sql(EventStatus::Retry) +
        ", attempts = attempts + " + (count_attempt ? "1" : "0") + ", available_at = ")
      .now(now)
      .sql(" + ")
      .micros(static_cast<std::int64_t>(clamp_delay(delay).count()) * 1000)
      .sql(", last_error = ")
      .param(TextRef{truncated})
      .sql(", locked_by = NULL, locked_at = NULL WHERE event_id = ")
      .param(TextRef{event_id})
      .sql(" AND " + pending_statuses())
      .owned_by(owner);
  condition_on_lease(s);
  return fenced_result(s.execute(conn), 1);
}

int SqlOutboxStore::mark_dead(Connection& conn, std::string_view event_id, Timestamp now,
                              std::string_view error, bool count_attempt, std::string_view owner) {
  const std::string truncated = truncate_error(error);
  Statement s = statement();
  s.sql("UPDATE " + options_.table + " SET status = " + status_sql(EventStatus::Dead) +
        ", attempts = attempts + " + (count_attempt ? "1" : "0") + ", last_error = ")
      .param(TextRef{truncated})
      .sql(", done_at = ")
      .now(now)
      .sql(", locked_by = NULL, locked_at = NULL WHERE event_id = ")
      .param(TextRef{event_id})
      .sql(" AND " + pending_statuses())
      .owned_by(owner);
  condition_on_lease(s);
  return fenced_result(s.execute(conn), 1);
}

void SqlOutboxStore::where_due(Statement& s, Timestamp now,
                               std::chrono::microseconds skip_recent) const {
  // skip_recent counts from the writer's occurred_at on the caller's clock, but from the time the
  // row became due (server time) on the database clock: writers' clocks may be skewed.
  const std::string recent = database_clock_ ? "available_at" : dialect_.pending_column();
  s.sql(" WHERE " + dialect_.pending_filter() + " AND available_at <= ")
      .now(now)
      .sql(" AND " + recent + " <= ")
      .now(now)
      .sql(" - ")
      .micros(static_cast<std::int64_t>(skip_recent.count()));
}

void SqlOutboxStore::claimable(Statement& s, std::string_view owner, Timestamp now,
                               std::chrono::milliseconds lock_timeout,
                               const PendingKey* after) const {
  s.sql(" AND (locked_by IS NULL OR locked_at < ")
      .now(now)
      .sql(" - ")
      .micros(static_cast<std::int64_t>(lock_timeout.count()) * 1000)
      .sql(" OR (locked_by = ")
      .param(TextRef{owner})
      .sql(" AND locked_at < ")
      .now(now)
      .sql(" - ")
      .micros(static_cast<std::int64_t>(own_claim_grace(lock_timeout).count()) * 1000)
      .sql("))");
  after_key(s, after);
}

void SqlOutboxStore::after_key(Statement& s, const PendingKey* after) const {
  if (after == nullptr) {
    return;
  }
  const std::string column = dialect_.pending_column();
  if (dialect_.row_value_keyset()) {
    s.sql(" AND (" + column + ", event_id) > (")
        .at(after->created_at)
        .sql(", ")
        .param(TextRef{after->event_id})
        .sql(")");
    return;
  }
  s.sql(" AND (" + column + " > ")
      .at(after->created_at)
      .sql(" OR (" + column + " = ")
      .at(after->created_at)
      .sql(" AND event_id > ")
      .param(TextRef{after->event_id})
      .sql("))");
}

void SqlOutboxStore::oldest_first(Statement& s, int limit) const {
  s.sql(" ORDER BY " + dialect_.pending_column() + ", event_id LIMIT ").param(std::int64_t{limit});
}

bool SqlOutboxStore::claim_would_take(Connection& conn, std::string_view owner, Timestamp now,
                                      std::chrono::milliseconds lock_timeout,
                                      std::chrono::microseconds skip_recent,
                                      const PendingKey* after) const {
  Statement s = statement();
  s.sql("SELECT 1 FROM " + options_.table);
  where_due(s, now, skip_recent);
  claimable(s, owner, now, lock_timeout, after);
  oldest_first(s, 1);
  return !s.query(conn).empty();
}

std::vector<OutboxEvent> SqlOutboxStore::poll_pending(Connection& conn, Timestamp now,
                                                      std::chrono::microseconds skip_recent,
                                                      int limit, const PendingKey* after) {
  Statement s = statement();
  s.sql("SELECT " + columns_ + " FROM " + options_.table);
  where_due(s, now, skip_recent);
  after_key(s, after);
  oldest_first(s, limit);
  return internal::events_from_rows(s.query(conn));
}

std::vector<OutboxEvent> SqlOutboxStore::query_dead(Connection& conn,
                                                    std::optional<std::string_view> event_type,
                                                    std::optional<std::string_view> aggregate_type,
                                                    int limit, bool with_payloads) {
  Statement s = statement();
  s.sql("SELECT " + columns(with_payloads) + " FROM " + options_.table +
        " WHERE status = " + status_sql(EventStatus::Dead));
  if (event_type) {
    s.sql(" AND event_type = ").param(TextRef{*event_type});
  }
  if (aggregate_type) {
    s.sql(" AND aggregate_type = ").param(TextRef{*aggregate_type});
  }
  // Insert order, not created_at (writers' clocks): replayed in this order, a message group's
  // events become pending head first, so a relay running meanwhile never sees a later one alone.
  s.sql(" ORDER BY " + dialect_.group_order_column() + " LIMIT ").param(std::int64_t{limit});
  return internal::events_from_rows(s.query(conn));
}

namespace {

// "AND last_error = ?" (IS NULL for none): the row still failed the way it was listed.
void same_error(Statement& s, const std::optional<std::string>& last_error) {
  if (last_error) {
    s.sql(" AND last_error = ").param(TextRef{*last_error});
  } else {
    s.sql(" AND last_error IS NULL");
  }
}

}  // namespace

int SqlOutboxStore::replay(Connection& conn, std::string_view event_id, Timestamp now,
                           const std::optional<std::string>* last_error) {
  Statement s = statement();
  s.sql("UPDATE " + options_.table + " SET status = " + status_sql(EventStatus::New) +
        ", attempts = 0, available_at = ")
      .now(now)
      .sql(", done_at = NULL, locked_by = NULL, locked_at = NULL WHERE event_id = ")
      .param(TextRef{event_id})
      .sql(" AND status = " + status_sql(EventStatus::Dead));
  if (last_error) {
    same_error(s, *last_error);
  }
  return to_int(s.execute(conn));
}

int SqlOutboxStore::replay_dead(Connection& conn, std::string_view event_id, Timestamp now) {
  return replay(conn, event_id, now, nullptr);
}

int SqlOutboxStore::replay_dead_if(Connection& conn, std::string_view event_id,
                                   const std::optional<std::string>& last_error, Timestamp now) {
  return replay(conn, event_id, now, &last_error);
}

int SqlOutboxStore::discard_dead(Connection& conn, std::string_view event_id,
                                 const std::optional<std::string>& last_error) {
  Statement s = statement();
  s.sql("DELETE FROM " + options_.table + " WHERE event_id = ")
      .param(TextRef{event_id})
      .sql(" AND status = " + status_sql(EventStatus::Dead) +
           not_retained_by_subscriptions(dialect_, options_.table));
  same_error(s, last_error);
  return to_int(s.execute(conn));
}

int SqlOutboxStore::count_dead(Connection& conn, std::optional<std::string_view> event_type) {
  Statement s = statement();
  s.sql("SELECT COUNT(*) FROM " + options_.table +
        " WHERE status = " + status_sql(EventStatus::Dead));
  if (event_type) {
    s.sql(" AND event_type = ").param(TextRef{*event_type});
  }
  return to_int(s.query(conn).at(0).get_int(0));
}

std::optional<OutboxEvent> SqlOutboxStore::find(Connection& conn, std::string_view event_id) {
  Statement s = statement();
  s.sql("SELECT " + columns_ + " FROM " + options_.table + " WHERE event_id = ")
      .param(TextRef{event_id});
  auto rows = s.query(conn);
  if (rows.empty()) {
    return std::nullopt;
  }
  return internal::event_from_row(rows.front());
}

std::vector<std::int64_t> SqlOutboxStore::count_by_status(Connection& conn) {
  // Grouped by status the whole table was read (0.26 s at 1,000,000 rows on SQLite, every 2 s
  // with the dashboard open). Each part is counted in an index that holds it instead, reading no
  // row: the pending rows with a group and without, the RETRY and DEAD ones by status, the
  // terminal ones; NEW and DONE are what is left. One statement, so one snapshot: a row settled
  // meanwhile is counted once.
  const std::string& t = options_.table;
  const std::string from = ", COUNT(*) FROM " + t + " WHERE ";
  const auto rows =
      statement()
          .sql("SELECT -1" + from + dialect_.pending_filter() + " UNION ALL SELECT -1" + from +
               dialect_.group_pending_filter() + " UNION ALL SELECT -2" + from +
               dialect_.terminal_filter() + " UNION ALL SELECT " + dialect_.retry_dead_status() +
               from + dialect_.retry_dead_filter() + " GROUP BY " + dialect_.retry_dead_status())
          .query(conn);
  std::int64_t pending = 0, terminal = 0;
  std::vector<std::int64_t> counts(4, 0);
  for (const auto& r : rows) {
    const auto part = r.get_int(0);
    if (part == -1) {
      pending += r.get_int(1);
    } else if (part == -2) {
      terminal = r.get_int(1);
    } else if (part == static_cast<int>(EventStatus::Retry) ||
               part == static_cast<int>(EventStatus::Dead)) {
      counts[static_cast<std::size_t>(part)] = r.get_int(1);
    }
  }
  counts[0] = pending - counts[2];
  counts[1] = terminal - counts[3];
  return counts;
}

int SqlOutboxStore::release_claims(Connection& conn, std::string_view owner) {
  // By status alone, a read of the whole table (0.07-0.13 s at 1,000,000 rows on SQLite). Through
  // the pending rows' indexes it was faster with a small backlog and slower with a big one: a
  // row read per pending row, out of table order for the grouped ones (1.2 s at 1,000,000).
  Statement s = statement();
  s.sql("UPDATE " + options_.table + " SET locked_by = NULL, locked_at = NULL WHERE locked_by = ")
      .param(TextRef{owner})
      .sql(" AND " + pending_statuses());
  return to_int(s.execute(conn));
}

std::vector<std::pair<std::string, std::int64_t>> SqlOutboxStore::count_dead_by_type(
    Connection& conn) {
  // Through the index of the RETRY and DEAD rows (its condition written out, so that SQLite
  // reads it): the table was read whole.
  std::vector<std::pair<std::string, std::int64_t>> out;
  for (const auto& r :
       statement()
           .sql("SELECT event_type, COUNT(*) FROM " + options_.table + " WHERE " +
                dialect_.retry_dead_filter() + " AND " + dialect_.retry_dead_status() + " = " +
                status_sql(EventStatus::Dead) + " GROUP BY 1 ORDER BY 2 DESC, 1")
           .query(conn)) {
    out.emplace_back(r.get_text(0), r.get_int(1));
  }
  return out;
}

std::optional<Timestamp> SqlOutboxStore::oldest_pending(Connection& conn) {
  // Without an index of the grouped rows' created_at, MIN(created_at) of them walks the index of
  // every row's created_at from its oldest end, passing every row older than the oldest grouped
  // pending one: all of them when there is none (0.17 s at 900,000 DONE rows on SQLite, every 2 s
  // with the dashboard open). Whether there is one is asked first, of their own index. (Read
  // through that index instead, the minimum cost a row read per grouped pending row: 1.1 s at
  // 1,000,000.)
  const bool grouped = !statement()
                            .sql("SELECT 1 FROM " + options_.table + " WHERE " +
                                 dialect_.group_pending_filter() + " LIMIT 1")
                            .query(conn)
                            .empty();
  std::string sql = "SELECT " + dialect_.micros("MIN(p)") + " FROM (SELECT MIN(" +
                    dialect_.pending_column() + ") AS p FROM " + options_.table + " WHERE " +
                    dialect_.pending_filter();
  if (grouped) {
    sql += " UNION ALL SELECT MIN(created_at) FROM " + options_.table + " WHERE " +
           dialect_.group_pending_filter();
  }
  const auto rows = statement().sql(sql + ") m").query(conn);
  if (rows.empty() || rows[0].is_null(0)) {
    return std::nullopt;
  }
  return from_micros(rows[0].get_int(0));
}

SqlEventPurger::SqlEventPurger(const Dialect& dialect, std::string table, bool use_database_clock)
    : dialect_(dialect), table_(std::move(table)), use_database_clock_(use_database_clock) {
  validate_table_name(table_);
}

int SqlEventPurger::purge(Connection& conn, Timestamp before, int limit) {
  return purge_where(conn, limit, [&](Statement& s) { s.at(before); });
}

int SqlEventPurger::purge_older_than(Connection& conn, std::chrono::microseconds retention,
                                     Timestamp now, int limit) {
  const std::string server_now = dialect_.server_now();
  if (!use_database_clock_ || server_now.empty()) {
    return purge(conn, now - retention, limit);
  }
  return purge_where(conn, limit, [&](Statement& s) {
    s.sql(server_now + " - ").micros(static_cast<std::int64_t>(retention.count()));
  });
}

int SqlEventPurger::purge_where(Connection& conn, int limit,
                                const std::function<void(Statement&)>& cutoff) {
  const std::string retention = dialect_.terminal_column();
  return delete_oldest(
      conn, dialect_, table_, dialect_.terminal_order_column(), limit, [&](Statement& s) {
        s.sql(dialect_.terminal_filter() + " AND " + retention + " < ");
        cutoff(s);
        s.sql(" AND (status = " + status_sql(EventStatus::Done) + " OR done_at IS NOT NULL)" +
              not_retained_by_subscriptions(dialect_, table_));
      });
}

SqlAgeBasedPurger::SqlAgeBasedPurger(const Dialect& dialect, std::string table)
    : dialect_(dialect), table_(std::move(table)) {
  validate_table_name(table_);
}

int SqlAgeBasedPurger::purge(Connection& conn, Timestamp before, int limit) {
  return delete_oldest(conn, dialect_, table_, "created_at", limit, [&](Statement& s) {
    s.sql("created_at < ")
        .at(before)
        .sql(" AND NOT (" + pending_statuses() + " AND locked_by IS NOT NULL)" +
             not_retained_by_subscriptions(dialect_, table_));
  });
}

}  // namespace outbox::sql
