#include "outbox/mysql/stream.hpp"

#include <algorithm>

#include "outbox/errors.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::mysql {
namespace {

std::string head_table_name(const std::string& table) {
  return derived_name(table, "_stream_head");
}

}  // namespace

void create_stream_schema(sql::Connection& conn, const std::string& table) {
  validate_table_name(table);
  // stream_seq is NULL until the sequencer numbers the row, in stream_id (insert) order: one
  // transaction's events keep their write order whatever their occurred_at. The index holds the
  // rows to number first, in that order, and the numbered ones in stream order for readers.
  conn.execute("ALTER TABLE " + table +
               " ADD COLUMN IF NOT EXISTS tags JSON NULL, "
               "ADD COLUMN IF NOT EXISTS stream_seq BIGINT NULL, "
               "ADD COLUMN IF NOT EXISTS stream_id BIGINT NOT NULL AUTO_INCREMENT, "
               "ADD UNIQUE INDEX IF NOT EXISTS " +
               derived_name(table, "_stream_id") + " (stream_id), ADD INDEX IF NOT EXISTS " +
               derived_name(table, "_stream") + " (stream_seq, stream_id)");
  conn.execute("CREATE TABLE IF NOT EXISTS " + head_table_name(table) +
               " (id TINYINT NOT NULL PRIMARY KEY, next_seq BIGINT NOT NULL) ENGINE=InnoDB");
  conn.execute("INSERT IGNORE INTO " + head_table_name(table) + " (id, next_seq) VALUES (1, 1)");
  conn.execute("CREATE TABLE IF NOT EXISTS " + sql::subscription_table_name(table) +
               " (name VARCHAR(200) NOT NULL PRIMARY KEY, filter TEXT NOT NULL, "
               "publisher VARCHAR(200) NOT NULL DEFAULT '', target TEXT NOT NULL, "
               "status VARCHAR(16) NOT NULL DEFAULT 'ACTIVE' "
               "CHECK (status IN ('ACTIVE', 'PAUSED', 'FAILED')), "
               "cursor_xid BIGINT NOT NULL DEFAULT 0, cursor_seq BIGINT NOT NULL DEFAULT 0, "
               "error_count INT NOT NULL DEFAULT 0, last_error TEXT NULL, "
               "delivered BIGINT NOT NULL DEFAULT 0, "
               "created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), "
               "updated_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), "
               "last_delivered_at DATETIME(6) NULL, released_at DATETIME(6) NULL"
               ") ENGINE=InnoDB DEFAULT CHARSET=utf8mb4 COLLATE=utf8mb4_bin");
}

MySqlStreamStore::MySqlStreamStore(std::string table)
    : SqlStreamStore(dialect(), std::move(table)), head_table_(head_table_name(this->table())) {}

int MySqlStreamStore::sequence(sql::Connection& conn, int limit) {
  // READ COMMITTED: the read of unnumbered rows sees every row committed when it runs (never an
  // open insert, which would otherwise be numbered before its transaction ends).
  conn.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED");
  conn.begin();
  try {
    const auto head =
        conn.query("SELECT next_seq FROM " + head_table_ + " WHERE id = 1 FOR UPDATE");
    if (head.empty()) {
      throw StoreError("mysql: the stream head row of " + table() +
                       " is missing (run `outbox migrate`)");
    }
    // Past any number a writer set itself (nothing stops an INSERT naming stream_seq): a reader
    // that read that row must still see every row numbered after it.
    const auto top = conn.query("SELECT MAX(stream_seq) FROM " + table());
    const std::int64_t next =
        std::max(head[0].get_int(0), top[0].get_optional_int(0).value_or(0) + 1);
    auto read = statement();
    read.sql("SELECT event_id FROM " + table() +
             " WHERE stream_seq IS NULL ORDER BY stream_id LIMIT ")
        .param(std::int64_t{limit});
    const auto rows = read.query(conn);
    if (rows.empty()) {
      conn.commit();
      return 0;
    }
    std::vector<std::string> ids;
    ids.reserve(rows.size());
    for (const auto& r : rows) {
      ids.push_back(r.get_text(0));
    }
    auto number = statement();
    number.sql("UPDATE " + table() + " SET stream_seq = CASE event_id");
    for (std::size_t i = 0; i < ids.size(); ++i) {
      number.sql(" WHEN ")
          .param(sql::TextRef{ids[i]})
          .sql(" THEN ")
          .param(next + static_cast<std::int64_t>(i));
    }
    number.sql(" END WHERE stream_seq IS NULL AND").ids_in("event_id", ids, 0, ids.size());
    const auto numbered = number.execute(conn);
    conn.execute("UPDATE " + head_table_ + " SET next_seq = " +
                 std::to_string(next + static_cast<std::int64_t>(ids.size())) + " WHERE id = 1");
    conn.commit();
    return static_cast<int>(numbered);
  } catch (...) {
    if (conn.in_transaction()) {
      try {
        conn.rollback();
      } catch (const std::exception&) {
        // The original error is the one worth reporting.
      }
    }
    throw;
  }
}

}  // namespace outbox::mysql
