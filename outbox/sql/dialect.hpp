#pragma once
// How one SQL engine spells what the generic outbox store (sql/sql_store.hpp) needs, and a
// statement builder that numbers parameters in that spelling.

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/sql/value.hpp"

namespace outbox {
enum class EventStatus;
}

namespace outbox::sql {

class Connection;

/// The SQL differences between engines for the outbox table. Implementations are stateless.
class Dialect {
 public:
  virtual ~Dialect() = default;
  /// What Connection::dialect() reports for this engine ("sqlite", "postgres", "mysql").
  virtual std::string_view name() const = 0;
  /// The marker of parameter `n` (1-based): "?" or "$n".
  virtual std::string placeholder(int n) const = 0;
  /// `marker` as a value of SQL type `type` ("text", "bigint", "int", "jsonb", "bytea") where the
  /// engine cannot infer it; the marker itself elsewhere.
  virtual std::string typed(const std::string& marker, std::string_view /*type*/) const {
    return marker;
  }
  /// An instant given as microseconds since the epoch in parameter `marker`.
  virtual std::string instant(const std::string& marker) const = 0;
  /// A duration of `marker` microseconds, to add to or subtract from an instant.
  virtual std::string micros_interval(const std::string& marker) const = 0;
  /// The server's current time for the statement being run; empty when the engine has no server
  /// clock (the caller's time is then always used).
  virtual std::string server_now() const { return {}; }
  /// The clock leases are timed by, whatever the stores' use_database_clock: the server's, or on
  /// SQLite the host's (every process on a file shares it), never a caller's Clock.
  virtual std::string lease_now() const { return server_now(); }
  /// True when UPDATE … RETURNING returns the changed rows (PostgreSQL, SQLite ≥ 3.35).
  virtual bool update_returning() const { return true; }
  /// Without RETURNING: `expr` as an UPDATE's SET value that also leaves the value in the
  /// session, and the query that reads it back on the same connection (e.g. MariaDB's
  /// `@var := expr` and `SELECT @var`). With RETURNING: `expr` and nothing.
  virtual std::string remember(const std::string& expr) const { return expr; }
  virtual std::string remembered() const { return {}; }
  /// Appended to a sub-select to read its rows with a shared lock (" FOR SHARE"): a fenced write
  /// then holds the lease row until it commits, so no takeover lands between its check and its
  /// change. Empty where one writer at a time makes it moot (SQLite).
  virtual std::string share_lock() const { return {}; }
  /// A timestamp column (or expression) read as BIGINT microseconds since the epoch.
  virtual std::string micros(const std::string& column) const { return column; }
  /// A JSON column read as text.
  virtual std::string json_text(const std::string& column) const { return column; }
  /// True when bytes payloads have a column of their own (payload_bytes); false when `payload`
  /// holds either JSON text or a blob.
  virtual bool has_bytes_column() const { return true; }
  /// True when id lists are one array parameter (`= ANY($n)`), false for `IN (?, ?, …)`.
  virtual bool id_array() const { return false; }
  /// The column that orders pending rows in the pending index, and the condition that selects
  /// pending rows outside message groups through that index.
  virtual std::string pending_column() const { return "created_at"; }
  virtual std::string pending_filter() const;
  /// The condition selecting pending rows of message groups through their index, and the column
  /// that orders a group's rows (insert order).
  virtual std::string group_pending_filter() const;
  virtual std::string group_order_column() const { return "stream_seq"; }
  /// True when an arm of a UNION ALL may be a parenthesized SELECT with its own ORDER BY and
  /// LIMIT; false wraps each arm in a derived table (SQLite).
  virtual bool parenthesized_arms() const { return true; }
  /// True when an UPDATE of rows a SELECT of the same table chooses is written
  /// "UPDATE (<select>) d STRAIGHT_JOIN <table> t ON t.event_id = d.event_id SET t.… WHERE t.…"
  /// (MariaDB, which plans "event_id IN (<select>)" as a subquery per row of a table scan);
  /// false: "UPDATE <table> SET … WHERE … AND event_id IN (<select>)".
  virtual bool update_through_derived_table() const { return false; }
  /// True when the planner reads an OR of index ranges as the union of those ranges
  /// (PostgreSQL's BitmapOr); false where such an OR read every row of the index (SQLite,
  /// MariaDB), and each range is asked for as an arm of a UNION ALL instead.
  virtual bool unions_or_of_ranges() const { return false; }
  /// True when grouped rows are also indexed per partition in insert order (schema version 9) and
  /// a claim reads each partition's front there. Only where settled rows leave that index at once
  /// (SQLite): PostgreSQL's index keeps them until a vacuum and InnoDB's until its purge, and a
  /// front read through them cost more than the locality it gave.
  virtual bool group_fronts() const { return false; }
  /// "The row is RETRY or DEAD" as the index of those rows (schema version 13) is read, and the
  /// column of that index that holds their status (its other column is event_type).
  virtual std::string retry_dead_filter() const;
  virtual std::string retry_dead_status() const { return "status"; }
  /// The condition "partition_no holds a number that is not a whole one" where a column can keep
  /// such a value (SQLite keeps 53.5 in an INTEGER column), empty where the column rounds it.
  /// Such a row counts as unnumbered.
  virtual std::string fractional_partition() const { return {}; }
  /// The instant a terminal row's retention counts from, and the condition selecting terminal rows.
  virtual std::string terminal_column() const { return "COALESCE(done_at, created_at)"; }
  virtual std::string terminal_filter() const;
  /// The column that orders terminal rows in the terminal index (the purge order).
  virtual std::string terminal_order_column() const { return "created_at"; }
  /// True when a keyset condition may be a row-value comparison; false spells it out as an OR
  /// (MariaDB plans ranges for that form only).
  virtual bool row_value_keyset() const { return true; }
  /// True for DELETE … ORDER BY … LIMIT; false deletes through a sub-select of the same table.
  virtual bool delete_with_limit() const { return false; }
  /// The condition "the outbox row (unqualified columns) is after the cursor of subscription
  /// `s`": the row is not yet read by it (rows not yet numbered by a sequencer included).
  virtual std::string after_cursor() const { return "stream_seq > s.cursor_seq"; }
  /// `INSERT … VALUES (…)` that does nothing when the key exists; `into_values` is
  /// "INTO t (cols) VALUES (…)" and `key` the conflicting column.
  virtual std::string insert_ignore(const std::string& into_values,
                                    const std::string& key) const = 0;
};

/// The SQL literal of a status ("1" for Done).
std::string status_sql(EventStatus status);
/// "(0, 2)": an SQL list of statuses.
std::string status_list(std::initializer_list<EventStatus> statuses);
/// "status IN (0, 2)": the rows still to deliver (New, Retry).
std::string pending_statuses();
/// "status IN (1, 3)": the rows delivery is finished with (Done, Dead).
std::string terminal_statuses();

/// SQL text and its parameters, built side by side so that an optional piece (a keyset, an owner,
/// the caller's clock instead of the server's) never renumbers the rest. Parameters borrow what
/// TextRef / BlobRef point to: it must outlive execute()/query().
class Statement {
 public:
  /// `database_clock` makes now() the server's time where the dialect has one.
  Statement(const Dialect& dialect, bool database_clock)
      : dialect_(dialect), database_clock_(database_clock) {}

  /// Appends SQL text.
  Statement& sql(std::string_view text) {
    sql_ += text;
    return *this;
  }
  /// Appends a parameter marker (typed as `type` where the dialect needs it) and its value.
  Statement& param(Value value, std::string_view type = {});
  /// Appends a caller-given instant.
  Statement& at(Timestamp t);
  /// Appends the current time: the server's with the database clock, else `now`.
  Statement& now(Timestamp now);
  /// Appends an interval of `micros` microseconds.
  Statement& micros(std::int64_t micros);
  /// Appends the condition " <column> IN (…)" (or "= ANY(…)") for ids[from, from + n); an IN
  /// list is padded to one of a few lengths by repeating ids[from + n - 1], so its texts repeat.
  Statement& ids_in(std::string_view column, const std::vector<std::string>& ids, std::size_t from,
                    std::size_t n);
  /// The ids are bound by reference until the statement runs: a temporary list would dangle.
  Statement& ids_in(std::string_view column, std::vector<std::string>&& ids, std::size_t from,
                    std::size_t n) = delete;
  /// Appends " AND locked_by = <owner>" unless `owner` is empty (no claim locking).
  Statement& owned_by(std::string_view owner);

  const std::string& text() const { return sql_; }
  /// Replaces the text, keeping the parameters: for wrapping what was built (e.g. into
  /// Dialect::insert_ignore). The new text must hold the same markers in the same order.
  void set_text(std::string text) { sql_ = std::move(text); }
  std::int64_t execute(Connection& conn) const;
  std::vector<Row> query(Connection& conn) const;

 private:
  const Dialect& dialect_;
  bool database_clock_;
  std::string sql_;
  std::vector<Value> params_;
};

}  // namespace outbox::sql
