#include "outbox/mysql/store.hpp"

#include <algorithm>
#include <map>

#include "outbox/internal/event_row.hpp"
#include "outbox/mysql/stream.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"
#include "outbox/sql/lease_store.hpp"

namespace outbox::mysql {
namespace {

constexpr const char* kEpoch = "TIMESTAMP'1970-01-01 00:00:00'";
// Owners remembered as idle (MySqlOutboxStore::claim_pending): nodes come and go with their
// owners' names; past this many the others just claim without reading first.
constexpr std::size_t kMaxIdleOwners = 1024;

class MySqlDialect final : public sql::Dialect {
 public:
  std::string_view name() const override { return "mysql"; }
  std::string placeholder(int) const override { return "?"; }
  std::string instant(const std::string& marker) const override {
    return std::string("(") + kEpoch + " + INTERVAL " + marker + " MICROSECOND)";
  }
  std::string micros_interval(const std::string& marker) const override {
    return "INTERVAL " + marker + " MICROSECOND";
  }
  std::string server_now() const override { return "UTC_TIMESTAMP(6)"; }
  bool update_returning() const override { return false; }
  std::string remember(const std::string& expr) const override {
    return "(@outbox_remembered := " + expr + ")";
  }
  std::string remembered() const override { return "SELECT @outbox_remembered"; }
  std::string share_lock() const override { return " LOCK IN SHARE MODE"; }
  std::string micros(const std::string& column) const override {
    return std::string("TIMESTAMPDIFF(MICROSECOND, ") + kEpoch + ", " + column + ")";
  }
  // No partial indexes: pending_at / terminal_at are NULL outside their statuses, so their
  // indexes hold the pending (resp. terminal) rows in claim (resp. purge) order.
  std::string pending_column() const override { return "pending_at"; }
  std::string retry_dead_filter() const override { return "retry_dead IS NOT NULL"; }
  std::string retry_dead_status() const override { return "retry_dead"; }
  std::string pending_filter() const override { return "pending_at IS NOT NULL"; }
  std::string group_pending_filter() const override { return "group_pending = 1"; }
  std::string group_order_column() const override { return "stream_id"; }
  bool update_through_derived_table() const override { return true; }
  std::string terminal_column() const override { return "terminal_at"; }
  std::string terminal_filter() const override { return "terminal_at IS NOT NULL"; }
  std::string terminal_order_column() const override { return "terminal_at"; }
  // MariaDB plans an OR of ranges on the pending index, where a row-value comparison would scan.
  bool row_value_keyset() const override { return false; }
  // MariaDB cannot delete from a table it selects from in a sub-query.
  bool delete_with_limit() const override { return true; }
  std::string after_cursor() const override {
    return "(stream_seq IS NULL OR stream_seq > s.cursor_seq)";
  }
  std::string insert_ignore(const std::string& into_values, const std::string&) const override {
    return "INSERT IGNORE " + into_values;
  }
};

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

const sql::Dialect& dialect() {
  static const MySqlDialect instance;
  return instance;
}

void create_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // No partial indexes here: pending_at / terminal_at are NULL outside their statuses, so their
  // indexes hold the pending (resp. terminal) rows in claim (resp. purge) order at the front of a
  // range scan, whatever the size of the rest of the table.
  conn.execute("CREATE TABLE IF NOT EXISTS " + table +
               " ("
               "event_id VARCHAR(64) NOT NULL, "
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
               "tags JSON NULL, "
               // Schema version 4 (see mysql/stream.hpp): the stream position, and the insert
               // order the sequencer numbers committed rows in.
               "stream_seq BIGINT NULL, "
               // The primary key: InnoDB stores rows in its order (schema version 8).
               "stream_id BIGINT NOT NULL AUTO_INCREMENT PRIMARY KEY, "
               "UNIQUE INDEX " +
               derived_name(table, "_event_id") +
               " (event_id), "

               "pending_at DATETIME(6) AS (IF(" +
               sql::pending_statuses() +
               ", created_at, NULL)) STORED, "
               "terminal_at DATETIME(6) AS (IF(" +
               sql::terminal_statuses() +
               ", COALESCE(done_at, created_at), NULL)) STORED, "
               "INDEX " +
               derived_name(table, "_pending") + " (pending_at, event_id), INDEX " +
               derived_name(table, "_terminal") + " (terminal_at), INDEX " +
               derived_name(table, "_created") + " (created_at), INDEX " +
               derived_name(table, "_stream") + " (stream_seq, stream_id), CONSTRAINT " +
               derived_name(table, "_one_payload") +
               " CHECK ((payload IS NULL) <> (payload_bytes IS NULL))"
               ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin");
  create_lease_schema(conn, table);
  create_stream_schema(conn, table);
  create_group_schema(conn, table);
  create_writer_defaults(conn, table);
  create_tracing_column(conn, table);
  create_retry_dead_index(conn, table);
  cluster_by_insert_order(conn, table);
}

void cluster_by_insert_order(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // Per index: unique or not, and its columns in order (SHOW INDEX: Non_unique, Key_name,
  // Seq_in_index, Column_name).
  std::map<std::string, std::pair<bool, std::string>> indexes;
  for (const auto& row : conn.query("SHOW INDEX FROM " + table)) {
    auto& [unique, columns] = indexes[row.get_text(2)];
    unique = row.get_int(1) == 0;
    columns += (columns.empty() ? "" : ",") + row.get_text(4);
  }
  const auto primary = indexes.find("PRIMARY");
  const bool keyed = primary != indexes.end() && primary->second.second == "stream_id";
  // A unique index of event_id alone other than the primary key, which is about to go.
  const bool unique_ids = std::any_of(indexes.begin(), indexes.end(), [](const auto& index) {
    return index.first != "PRIMARY" && index.second.first && index.second.second == "event_id";
  });
  const std::string event_index = derived_name(table, "_event_id");
  std::string alter;
  if (!unique_ids) {
    // An index of that name that is not the unique one (a user's) makes way for it.
    if (indexes.count(event_index) != 0) {
      alter += ", DROP INDEX " + event_index;
    }
    alter += ", ADD UNIQUE INDEX " + event_index + " (event_id)";
  }
  if (!keyed) {
    alter += std::string(primary != indexes.end() ? ", DROP PRIMARY KEY" : "") +
             ", ADD PRIMARY KEY (stream_id)";
  }
  if (!alter.empty()) {
    // Rebuilt in place, writes allowed meanwhile.
    conn.execute("ALTER TABLE " + table + " " + alter.substr(2));
  }
  // The key the stream schema gave stream_id before it was the primary key.
  conn.execute("ALTER TABLE " + table + " DROP INDEX IF EXISTS " +
               derived_name(table, "_stream_id"));
}

void create_tracing_column(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("ALTER TABLE " + table + " ADD COLUMN IF NOT EXISTS tracingspancontext TEXT NULL");
}

void create_retry_dead_index(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // No partial indexes here: retry_dead is the status of a RETRY or DEAD row and NULL otherwise, so
  // its index holds those rows by status and type, which the status counts read (the dashboard
  // asks every 2 s) instead of the whole table (0.2 s at 1,000,000 rows). Virtual, not stored: both
  // statements run without a copy of the table, writes allowed (at 1,000,000 rows 0.03 s and
  // 1.2 s); a stored column copied it with writes held for 9.5 s.
  conn.execute("ALTER TABLE " + table +
               " ADD COLUMN IF NOT EXISTS retry_dead TINYINT AS (IF(status IN (" +
               sql::status_sql(EventStatus::Retry) + ", " + sql::status_sql(EventStatus::Dead) +
               "), status, NULL)) VIRTUAL");
  conn.execute("ALTER TABLE " + table + " ADD INDEX IF NOT EXISTS " +
               derived_name(table, "_retry_dead") + " (retry_dead, event_type)");
}

void create_writer_defaults(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // UTC, as the library writes its instants; a change of defaults only (no table copy).
  conn.execute("ALTER TABLE " + table +
               " ALTER COLUMN status SET DEFAULT 0, "
               "ALTER COLUMN available_at SET DEFAULT (UTC_TIMESTAMP(6)), "
               "ALTER COLUMN created_at SET DEFAULT (UTC_TIMESTAMP(6))");
}

void create_group_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // group_pending marks grouped pending rows (no partial indexes here); its index holds them per
  // partition in insert order, which is what a claim of group heads walks.
  conn.execute("ALTER TABLE " + table +
               // NO PAD: 'k1' and 'k1 ' are two groups here as everywhere else.
               " ADD COLUMN IF NOT EXISTS message_group VARCHAR(200) COLLATE utf8mb4_nopad_bin "
               "NULL, "
               "ADD COLUMN IF NOT EXISTS partition_no SMALLINT NULL, "
               "ADD COLUMN IF NOT EXISTS group_pending TINYINT AS (IF(" +
               sql::pending_statuses() +
               " AND message_group IS NOT NULL, 1, NULL)) STORED, "
               "ADD INDEX IF NOT EXISTS " +
               derived_name(table, "_groups") +
               " (group_pending, partition_no, message_group, stream_id)");
  // Grouped rows leave the claim order of the pending index.
  const auto expr = conn.query(
      "SELECT GENERATION_EXPRESSION FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
      "DATABASE() AND TABLE_NAME = '" +
      table + "' AND COLUMN_NAME = 'pending_at'");
  if (expr.empty() ||
      expr[0].get_optional_text(0).value_or("").find("message_group") == std::string::npos) {
    conn.execute("ALTER TABLE " + table + " MODIFY pending_at DATETIME(6) AS (IF(" +
                 sql::pending_statuses() + " AND message_group IS NULL, created_at, NULL)) STORED");
  }
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::group_block_table_name(table) +
               " (message_group VARCHAR(200) COLLATE utf8mb4_nopad_bin NOT NULL PRIMARY KEY, "
               "event_id VARCHAR(64) NOT NULL, partition_no SMALLINT NULL, "
               "blocked_at DATETIME(6) NOT NULL, attempts INT NOT NULL DEFAULT 0, "
               "last_error TEXT NULL"
               ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin");
}

void create_lease_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::lease_table_name(table) +
               " (name VARCHAR(200) NOT NULL PRIMARY KEY, owner VARCHAR(200) NULL, "
               "epoch BIGINT NOT NULL DEFAULT 0, acquired_at DATETIME(6) NULL, "
               "renewed_at DATETIME(6) NULL, expires_at DATETIME(6) NULL"
               ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin");
}

MySqlOutboxStore::MySqlOutboxStore(Options options)
    : SqlOutboxStore(dialect(), std::move(options)) {}

std::size_t MySqlOutboxStore::insert_byte_budget(sql::Connection& conn) {
  // One statement larger than max_allowed_packet fails as "server has gone away" (20 events of
  // 1 MiB once did under the 16 MiB default). Asked on this connection for every multi-row
  // insert: the limit is the session's, fixed when it connected, and a lowered global one (or a
  // pool of sessions from before and after the change) differs per connection.
  const auto rows = conn.query("SELECT @@max_allowed_packet");
  const auto limit = rows.empty() ? 0 : rows[0].get_int(0);
  // Half of it leaves room for the statement text, escaping and the protocol's own overhead.
  return std::max<std::size_t>(64 * 1024, static_cast<std::size_t>(limit) / 2);
}

std::vector<std::string> MySqlOutboxStore::renew_claims(sql::Connection& conn,
                                                        std::string_view owner,
                                                        const std::vector<std::string>& event_ids,
                                                        Timestamp now) {
  return in_own_transaction(conn, [&] {
    std::vector<std::string> renewed;
    const std::size_t chunk = id_chunk();
    for (std::size_t i = 0; i < event_ids.size(); i += chunk) {
      // Which rows this owner still holds, skipping rows a statement holds locked right now.
      auto pick = statement();
      pick.sql("SELECT event_id FROM " + table() + " WHERE")
          .ids_in("event_id", event_ids, i, std::min(chunk, event_ids.size() - i))
          .sql(" AND " + sql::pending_statuses() + " AND locked_by = ")
          .param(sql::TextRef{owner})
          .sql(" FOR UPDATE SKIP LOCKED");
      std::vector<std::string> held;
      for (const auto& row : pick.query(conn)) {
        held.push_back(row.get_text(0));
      }
      if (held.empty()) {
        continue;
      }
      auto stamp = statement();
      stamp.sql("UPDATE " + table() + " SET locked_at = ")
          .now(now)
          .sql(" WHERE")
          .ids_in("event_id", held, 0, held.size())
          .execute(conn);
      renewed.insert(renewed.end(), held.begin(), held.end());
    }
    return renewed;
  });
}

std::vector<OutboxEvent> MySqlOutboxStore::claim_pending(sql::Connection& conn,
                                                         std::string_view owner, Timestamp now,
                                                         std::chrono::milliseconds lock_timeout,
                                                         std::chrono::microseconds skip_recent,
                                                         int limit, const PendingKey* after) {
  const std::string owner_name(owner);
  bool idle;
  {
    std::lock_guard lock(mutex_);
    idle = idle_owners_.contains(owner_name);
  }
  if (idle && !conn.in_transaction()) {
    // After a claim of this owner that found nothing, a read first: the claims of a relay
    // draining only message groups (whose rows are not claimed here) then cost one statement
    // each, not a transaction of three round trips. A drain of ungrouped rows does not pay for
    // the read, nor do other nodes sharing this store for one that finds nothing.
    const bool found = claim_would_take(conn, owner, now, lock_timeout, skip_recent, after);
    if (conn.in_transaction()) {
      conn.commit();  // the read began one (a session with autocommit off): this claim's to end
    }
    if (!found) {
      return {};
    }
  }
  auto claimed = in_own_transaction(conn, [&] {
    // Lock and read the oldest claimable rows, skipping rows other nodes hold locked right now;
    // no UPDATE … RETURNING here, so the rows are read as they are locked rather than again
    // after the UPDATE, which finds them by primary key (stream_id) and stamps the claim time
    // read with them (the last two columns), so the rows returned hold what the table holds.
    auto pick = statement();
    pick.sql("SELECT " + columns() +
             ", stream_id, TIMESTAMPDIFF(MICROSECOND, TIMESTAMP'1970-01-01 00:00:00', ")
        .now(now)
        .sql(") FROM " + table());
    where_due(pick, now, skip_recent);
    claimable(pick, owner, now, lock_timeout, after);
    oldest_first(pick, limit);
    pick.sql(" FOR UPDATE SKIP LOCKED");
    const auto rows = pick.query(conn);
    std::vector<OutboxEvent> events = internal::events_from_rows(rows);
    if (!events.empty()) {
      const Timestamp claimed_at = from_micros(rows[0].get_int(rows[0].size() - 1));
      auto stamp = statement();
      stamp.sql("UPDATE " + table() + " SET locked_by = ")
          .param(sql::TextRef{owner})
          .sql(", locked_at = ")
          .at(claimed_at)
          .sql(" WHERE stream_id IN (");
      for (std::size_t i = 0; i < rows.size(); ++i) {
        stamp.sql(i == 0 ? "" : ",").param(rows[i].get_int(rows[i].size() - 2));
        events[i].locked_by = std::string(owner);
        events[i].locked_at = claimed_at;
      }
      stamp.sql(")").execute(conn);
    }
    return events;
  });
  {
    std::lock_guard lock(mutex_);
    if (!claimed.empty()) {
      idle_owners_.erase(owner_name);
    } else if (idle_owners_.size() < kMaxIdleOwners) {
      idle_owners_.insert(owner_name);
    }
  }
  return claimed;
}

}  // namespace outbox::mysql
