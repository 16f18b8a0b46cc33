#include "outbox/mysql/store.hpp"

#include <algorithm>
#include <stdexcept>

#include "outbox/internal/event_row.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::mysql {
namespace {

using sql::TextRef;
using sql::Value;

constexpr std::size_t kInsertChunk = 500;
constexpr std::size_t kIdChunk = 500;
constexpr const char* kEpoch = "TIMESTAMP'1970-01-01 00:00:00'";

std::string micros(const std::string& column) {
  return std::string("TIMESTAMPDIFF(MICROSECOND, ") + kEpoch + ", " + column + ")";
}

// Builds a statement and its `?` parameters side by side, so a timestamp can be the server's
// clock (no parameter) or the caller's (one parameter) without renumbering anything.
class Query {
 public:
  explicit Query(bool database_clock) : database_clock_(database_clock) {}
  Query& sql(const std::string& text) {
    sql_ += text;
    return *this;
  }
  Query& param(Value v) {
    sql_ += '?';
    params_.push_back(std::move(v));
    return *this;
  }
  /// The current time: UTC_TIMESTAMP(6), or the caller's `now`.
  Query& now(Timestamp now) {
    if (database_clock_) {
      sql_ += "UTC_TIMESTAMP(6)";
      return *this;
    }
    return at(now);
  }
  /// A caller-given instant.
  Query& at(Timestamp t) {
    sql_ += std::string("(") + kEpoch + " + INTERVAL ";
    param(to_micros(t));
    sql_ += " MICROSECOND)";
    return *this;
  }
  Query& ids(const std::vector<std::string>& ids, std::size_t from, std::size_t n) {
    sql_ += '(';
    for (std::size_t k = 0; k < n; ++k) {
      if (k > 0) {
        sql_ += ',';
      }
      param(TextRef{ids[from + k]});
    }
    sql_ += ')';
    return *this;
  }
  /// The claim condition of a status update; an empty owner means no claim locking.
  Query& owned(std::string_view owner) {
    if (!owner.empty()) {
      sql(" AND locked_by = ").param(TextRef{owner});
    }
    return *this;
  }
  std::int64_t execute(sql::Connection& conn) const { return conn.execute(sql_, params_); }
  std::vector<sql::Row> query(sql::Connection& conn) const { return conn.query(sql_, params_); }

 private:
  bool database_clock_;
  std::string sql_;
  std::vector<Value> params_;
};

std::string select_list() {
  return "event_id, event_type, aggregate_type, aggregate_id, tenant_id, payload, headers, status, "
         "attempts, " +
         micros("available_at") + ", " + micros("created_at") + ", " + micros("done_at") +
         ", last_error, locked_by, " + micros("locked_at") + ", payload_bytes";
}

// skip_recent counts from occurred_at on the caller's clock, from the time the row became due
// (server time) on the database clock, since writers' clocks may be skewed.
std::string recent_column(const MySqlOutboxStore::Options& o) {
  return o.use_database_clock ? "available_at" : "pending_at";
}

int to_int(std::int64_t n) {
  return static_cast<int>(n);
}

// Runs `work` in a transaction of its own unless the caller has one open: row locks taken with
// FOR UPDATE SKIP LOCKED must last until the rows are updated.
template <typename Work>
auto in_own_transaction(sql::Connection& conn, Work&& work) {
  const bool own_tx = !conn.in_transaction();
  if (own_tx) {
    conn.begin();
  }
  try {
    auto result = work();
    if (own_tx) {
      conn.commit();
    }
    return result;
  } catch (...) {
    if (own_tx && conn.in_transaction()) {
      try {
        conn.rollback();
      } catch (const std::exception&) {
        // The original error is the one worth reporting.
      }
    }
    throw;
  }
}

}  // namespace

void create_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // No partial indexes here: pending_at / terminal_at are NULL outside their statuses, so their
  // indexes hold the pending (resp. terminal) rows in claim (resp. purge) order at the front of a
  // range scan, whatever the size of the rest of the table.
  conn.execute("CREATE TABLE IF NOT EXISTS " + table +
               " ("
               "event_id VARCHAR(64) NOT NULL PRIMARY KEY, "
               "event_type VARCHAR(128) NOT NULL, "
               "aggregate_type VARCHAR(64), "
               "aggregate_id VARCHAR(128), "
               "tenant_id VARCHAR(64), "
               "payload JSON NULL, "
               "payload_bytes LONGBLOB NULL, "
               "headers JSON NULL, "
               "status TINYINT NOT NULL, "
               "attempts INT NOT NULL DEFAULT 0, "
               "available_at DATETIME(6) NOT NULL, "
               "created_at DATETIME(6) NOT NULL, "
               "done_at DATETIME(6) NULL, "
               "last_error TEXT NULL, "
               "locked_by VARCHAR(128) NULL, "
               "locked_at DATETIME(6) NULL, "
               "pending_at DATETIME(6) AS (IF(status IN (0, 2), created_at, NULL)) STORED, "
               "terminal_at DATETIME(6) AS (IF(status IN (1, 3), COALESCE(done_at, created_at), "
               "NULL)) STORED, "
               "INDEX " +
               derived_name(table, "_pending") + " (pending_at, event_id), INDEX " +
               derived_name(table, "_terminal") + " (terminal_at), INDEX " +
               derived_name(table, "_created") + " (created_at), CONSTRAINT " +
               derived_name(table, "_one_payload") +
               " CHECK ((payload IS NULL) <> (payload_bytes IS NULL))"
               ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin");
}

MySqlOutboxStore::MySqlOutboxStore(Options options) : options_(std::move(options)) {
  validate_table_name(options_.table);
  if (!options_.codec) {
    options_.codec = &JsonCodec::default_codec();
  }
  select_ = select_list();
  select_without_payload_ = select_;
  select_without_payload_.replace(select_without_payload_.find("payload,"), 8, "'',");
  select_without_payload_.replace(select_without_payload_.rfind("payload_bytes"), 13, "NULL");
}

void MySqlOutboxStore::insert_new(sql::Connection& conn, const EventEnvelope& event,
                                  std::string_view lock_owner) {
  insert_batch(conn, {event}, lock_owner);
}

void MySqlOutboxStore::insert_batch(sql::Connection& conn, const std::vector<EventEnvelope>& events,
                                    std::string_view lock_owner) {
  const bool db_clock = options_.use_database_clock;
  const Timestamp claimed_at = Clock::system()->now();
  // Chunks by rows and by bytes: one statement larger than the server's max_allowed_packet
  // fails as "server has gone away" (20 events of 1 MiB once did under the 16 MiB default).
  const std::size_t budget = events.size() > 1 ? packet_budget(conn) : 0;
  // Encoded once, and measured as sent: JSON escaping can make headers six times their text.
  std::vector<std::optional<std::string>> all_headers(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    all_headers[i] = options_.codec->to_json(events[i].headers());
  }
  std::size_t start = 0;
  while (start < events.size()) {
    std::size_t n = 0, bytes = 0;
    while (start + n < events.size() && n < kInsertChunk) {
      const EventEnvelope& e = events[start + n];
      const std::size_t size =
          e.payload_bytes().size() + e.event_id().size() + e.event_type().size() +
          e.aggregate_type().size() + e.aggregate_id().value_or("").size() +
          e.tenant_id().value_or("").size() + all_headers[start + n].value_or("").size() + 256;
      if (n > 0 && bytes + size > budget) {
        break;
      }
      bytes += size;
      ++n;
    }
    Query q(db_clock);
    q.sql("INSERT INTO " + options_.table +
          " (event_id, event_type, aggregate_type, aggregate_id, tenant_id, payload, "
          "payload_bytes, headers, status, attempts, available_at, created_at, locked_by, "
          "locked_at) VALUES ");
    for (std::size_t i = 0; i < n; ++i) {
      const EventEnvelope& e = events[start + i];
      q.sql(i == 0 ? "(" : ",(");
      q.param(TextRef{e.event_id()}).sql(",").param(TextRef{e.event_type()}).sql(",");
      q.param(TextRef{e.aggregate_type()}).sql(",").param(sql::text_or_null(e.aggregate_id()));
      q.sql(",").param(sql::text_or_null(e.tenant_id())).sql(",");
      if (e.has_json_payload()) {
        q.param(TextRef{e.payload_json()}).sql(",NULL,");
      } else {
        q.sql("NULL,").param(sql::BlobRef{e.payload_bytes()}).sql(",");
      }
      q.param(sql::text_or_null(all_headers[start + i])).sql(",0,0,");
      const auto created = to_micros(e.occurred_at());
      const auto available = e.available_at() ? to_micros(*e.available_at()) : created;
      if (db_clock) {
        q.sql("UTC_TIMESTAMP(6) + INTERVAL ")
            .param(std::max<std::int64_t>(0, available - created))
            .sql(" MICROSECOND");
      } else {
        q.at(from_micros(available));
      }
      q.sql(",").at(e.occurred_at()).sql(",");
      if (lock_owner.empty()) {
        q.sql("NULL,NULL)");
      } else {
        // The claim starts at the insert, never at the envelope's (possibly back-dated)
        // occurred_at.
        q.param(TextRef{lock_owner}).sql(",").now(claimed_at).sql(")");
      }
    }
    q.execute(conn);
    start += n;
  }
}

std::size_t MySqlOutboxStore::packet_budget(sql::Connection& conn) {
  if (const std::size_t known = packet_budget_.load(); known != 0) {
    return known;
  }
  const auto rows = conn.query("SELECT @@max_allowed_packet");
  const auto limit = rows.empty() ? 0 : rows[0].get_int(0);
  // Half of it leaves room for the statement text, escaping and the protocol's own overhead.
  const std::size_t budget = std::max<std::size_t>(64 * 1024, static_cast<std::size_t>(limit) / 2);
  packet_budget_ = budget;
  return budget;
}

int MySqlOutboxStore::mark_done(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                std::string_view owner) {
  return mark_done_batch(conn, {std::string(event_id)}, now, owner);
}

int MySqlOutboxStore::mark_done_batch(sql::Connection& conn,
                                      const std::vector<std::string>& event_ids, Timestamp now,
                                      std::string_view owner) {
  int changed = 0;
  for (std::size_t i = 0; i < event_ids.size(); i += kIdChunk) {
    const std::size_t n = std::min(kIdChunk, event_ids.size() - i);
    Query q(options_.use_database_clock);
    q.sql("UPDATE " + options_.table + " SET status = 1, done_at = ")
        .now(now)
        .sql(", locked_by = NULL, locked_at = NULL WHERE event_id IN ")
        .ids(event_ids, i, n)
        .sql(" AND status IN (0, 2)")
        .owned(owner);
    changed += to_int(q.execute(conn));
  }
  return changed;
}

int MySqlOutboxStore::mark_retry(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                 std::chrono::milliseconds delay, std::string_view error,
                                 std::string_view owner) {
  return reschedule(conn, event_id, now, delay, error, true, owner);
}

int MySqlOutboxStore::mark_deferred(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                    std::chrono::milliseconds delay, std::string_view reason,
                                    std::string_view owner) {
  return reschedule(conn, event_id, now, delay, reason, false, owner);
}

int MySqlOutboxStore::reschedule(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                 std::chrono::milliseconds delay, std::string_view message,
                                 bool count_attempt, std::string_view owner) {
  const std::string truncated = truncate_error(message);
  Query q(options_.use_database_clock);
  q.sql("UPDATE " + options_.table + " SET status = 2, attempts = attempts + " +
        (count_attempt ? "1" : "0") + ", available_at = ")
      .now(now)
      .sql(" + INTERVAL ")
      .param(static_cast<std::int64_t>(clamp_delay(delay).count()) * 1000)
      .sql(" MICROSECOND, last_error = ")
      .param(TextRef{truncated})
      .sql(", locked_by = NULL, locked_at = NULL WHERE event_id = ")
      .param(TextRef{event_id})
      .sql(" AND status IN (0, 2)")
      .owned(owner);
  return to_int(q.execute(conn));
}

int MySqlOutboxStore::mark_dead(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                std::string_view error, bool count_attempt,
                                std::string_view owner) {
  const std::string truncated = truncate_error(error);
  Query q(options_.use_database_clock);
  q.sql("UPDATE " + options_.table + " SET status = 3, attempts = attempts + ")
      .param(std::int64_t{count_attempt ? 1 : 0})
      .sql(", last_error = ")
      .param(TextRef{truncated})
      .sql(", done_at = ")
      .now(now)
      .sql(", locked_by = NULL, locked_at = NULL WHERE event_id = ")
      .param(TextRef{event_id})
      .sql(" AND status IN (0, 2)")
      .owned(owner);
  return to_int(q.execute(conn));
}

std::vector<std::string> MySqlOutboxStore::renew_claims(sql::Connection& conn,
                                                        std::string_view owner,
                                                        const std::vector<std::string>& event_ids,
                                                        Timestamp now) {
  return in_own_transaction(conn, [&] {
    std::vector<std::string> renewed;
    for (std::size_t i = 0; i < event_ids.size(); i += kIdChunk) {
      const std::size_t n = std::min(kIdChunk, event_ids.size() - i);
      // Which rows this owner still holds, skipping rows a statement holds locked right now.
      Query pick(options_.use_database_clock);
      pick.sql("SELECT event_id FROM " + options_.table + " WHERE event_id IN ")
          .ids(event_ids, i, n)
          .sql(" AND status IN (0, 2) AND locked_by = ")
          .param(TextRef{owner})
          .sql(" FOR UPDATE SKIP LOCKED");
      std::vector<std::string> held;
      for (const auto& row : pick.query(conn)) {
        held.push_back(row.get_text(0));
      }
      if (held.empty()) {
        continue;
      }
      Query stamp(options_.use_database_clock);
      stamp.sql("UPDATE " + options_.table + " SET locked_at = ")
          .now(now)
          .sql(" WHERE event_id IN ")
          .ids(held, 0, held.size());
      stamp.execute(conn);
      renewed.insert(renewed.end(), held.begin(), held.end());
    }
    return renewed;
  });
}

namespace {

// The keyset condition for `after`, spelled out: MariaDB plans an OR of ranges on the pending
// index, where a row-value comparison would scan.
void after_condition(Query& q, const PendingKey* after) {
  if (after == nullptr) {
    return;
  }
  q.sql(" AND (pending_at > ")
      .at(after->created_at)
      .sql(" OR (pending_at = ")
      .at(after->created_at)
      .sql(" AND event_id > ")
      .param(TextRef{after->event_id})
      .sql("))");
}

}  // namespace

std::vector<OutboxEvent> MySqlOutboxStore::poll_pending(sql::Connection& conn, Timestamp now,
                                                        std::chrono::microseconds skip_recent,
                                                        int limit, const PendingKey* after) {
  Query q(options_.use_database_clock);
  q.sql("SELECT " + select_ + " FROM " + options_.table + " WHERE pending_at IS NOT NULL AND " +
        recent_column(options_) + " <= ")
      .now(now)
      .sql(" - INTERVAL ")
      .param(static_cast<std::int64_t>(skip_recent.count()))
      .sql(" MICROSECOND AND available_at <= ")
      .now(now);
  after_condition(q, after);
  q.sql(" ORDER BY pending_at, event_id LIMIT ").param(std::int64_t{limit});
  return internal::events_from_rows(q.query(conn));
}

std::vector<OutboxEvent> MySqlOutboxStore::claim_pending(sql::Connection& conn,
                                                         std::string_view owner, Timestamp now,
                                                         std::chrono::milliseconds lock_timeout,
                                                         std::chrono::microseconds skip_recent,
                                                         int limit, const PendingKey* after) {
  return in_own_transaction(conn, [&] {
    // Lock the oldest claimable rows, skipping rows other nodes hold locked right now.
    Query pick(options_.use_database_clock);
    pick.sql("SELECT event_id FROM " + options_.table + " WHERE pending_at IS NOT NULL AND " +
             recent_column(options_) + " <= ")
        .now(now)
        .sql(" - INTERVAL ")
        .param(static_cast<std::int64_t>(skip_recent.count()))
        .sql(" MICROSECOND AND available_at <= ")
        .now(now)
        .sql(" AND (locked_by IS NULL OR locked_at < ")
        .now(now)
        .sql(" - INTERVAL ")
        .param(static_cast<std::int64_t>(lock_timeout.count()) * 1000)
        .sql(" MICROSECOND OR (locked_by = ")
        .param(TextRef{owner})
        .sql(" AND locked_at < ")
        .now(now)
        .sql(" - INTERVAL ")
        .param(static_cast<std::int64_t>(own_claim_grace(lock_timeout).count()) * 1000)
        .sql(" MICROSECOND))");
    after_condition(pick, after);
    pick.sql(" ORDER BY pending_at, event_id LIMIT ")
        .param(std::int64_t{limit})
        .sql(" FOR UPDATE SKIP LOCKED");
    std::vector<std::string> ids;
    for (const auto& r : pick.query(conn)) {
      ids.push_back(r.get_text(0));
    }
    std::vector<OutboxEvent> events;
    if (!ids.empty()) {
      Query stamp(options_.use_database_clock);
      stamp.sql("UPDATE " + options_.table + " SET locked_by = ")
          .param(TextRef{owner})
          .sql(", locked_at = ")
          .now(now)
          .sql(" WHERE event_id IN ")
          .ids(ids, 0, ids.size());
      stamp.execute(conn);
      Query read(options_.use_database_clock);
      read.sql("SELECT " + select_ + " FROM " + options_.table + " WHERE event_id IN ")
          .ids(ids, 0, ids.size())
          .sql(" ORDER BY created_at, event_id");
      events = internal::events_from_rows(read.query(conn));
    }
    return events;
  });
}

std::vector<OutboxEvent> MySqlOutboxStore::query_dead(
    sql::Connection& conn, std::optional<std::string_view> event_type,
    std::optional<std::string_view> aggregate_type, int limit, bool with_payloads) {
  return internal::events_from_rows(conn.query(
      "SELECT " + (with_payloads ? select_ : select_without_payload_) + " FROM " + options_.table +
          " WHERE status = 3 AND (? IS NULL OR event_type = ?) AND "
          "(? IS NULL OR aggregate_type = ?) ORDER BY created_at, event_id LIMIT ?",
      {sql::text_or_null(event_type), sql::text_or_null(event_type),
       sql::text_or_null(aggregate_type), sql::text_or_null(aggregate_type), std::int64_t{limit}}));
}

int MySqlOutboxStore::replay_dead(sql::Connection& conn, std::string_view event_id, Timestamp now) {
  Query q(options_.use_database_clock);
  q.sql("UPDATE " + options_.table + " SET status = 0, attempts = 0, available_at = ")
      .now(now)
      .sql(", done_at = NULL, locked_by = NULL, locked_at = NULL WHERE event_id = ")
      .param(TextRef{event_id})
      .sql(" AND status = 3");
  return to_int(q.execute(conn));
}

int MySqlOutboxStore::count_dead(sql::Connection& conn,
                                 std::optional<std::string_view> event_type) {
  return to_int(conn.query("SELECT COUNT(*) FROM " + options_.table +
                               " WHERE status = 3 AND (? IS NULL OR event_type = ?)",
                           {sql::text_or_null(event_type), sql::text_or_null(event_type)})
                    .at(0)
                    .get_int(0));
}

std::optional<OutboxEvent> MySqlOutboxStore::find(sql::Connection& conn,
                                                  std::string_view event_id) {
  auto rows = conn.query("SELECT " + select_ + " FROM " + options_.table + " WHERE event_id = ?",
                         {TextRef{event_id}});
  if (rows.empty()) {
    return std::nullopt;
  }
  return internal::event_from_row(rows.front());
}

std::vector<std::int64_t> MySqlOutboxStore::count_by_status(sql::Connection& conn) {
  return internal::count_by_status(conn, options_.table);
}

int MySqlOutboxStore::release_claims(sql::Connection& conn, std::string_view owner) {
  return internal::release_claims(conn, options_.table, "?", owner);
}

std::vector<std::pair<std::string, std::int64_t>> MySqlOutboxStore::count_dead_by_type(
    sql::Connection& conn) {
  return internal::count_dead_by_type(conn, options_.table);
}

std::optional<Timestamp> MySqlOutboxStore::oldest_pending(sql::Connection& conn) {
  return internal::optional_micros(
      conn, std::string("SELECT ") + micros("MIN(pending_at)") + " FROM " + options_.table + "");
}

MySqlEventPurger::MySqlEventPurger(std::string table) : table_(std::move(table)) {
  validate_table_name(table_);
}

int MySqlEventPurger::purge(sql::Connection& conn, Timestamp before, int limit) {
  Query q(false);
  q.sql("DELETE FROM " + table_ + " WHERE terminal_at IS NOT NULL AND terminal_at < ")
      .at(before)
      .sql(" AND (status = 1 OR done_at IS NOT NULL) ORDER BY terminal_at LIMIT ")
      .param(std::int64_t{limit});
  return to_int(q.execute(conn));
}

MySqlAgeBasedPurger::MySqlAgeBasedPurger(std::string table) : table_(std::move(table)) {
  validate_table_name(table_);
}

int MySqlAgeBasedPurger::purge(sql::Connection& conn, Timestamp before, int limit) {
  Query q(false);
  q.sql("DELETE FROM " + table_ + " WHERE created_at < ")
      .at(before)
      .sql(" AND NOT (status IN (0, 2) AND locked_by IS NOT NULL) ORDER BY created_at LIMIT ")
      .param(std::int64_t{limit});
  return to_int(q.execute(conn));
}

}  // namespace outbox::mysql
