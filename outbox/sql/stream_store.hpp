#pragma once
// The stream and the subscription table written once over a Dialect. An engine derives its stream
// store from SqlStreamStore and says how positions are spelled and which rows are readable.

#include <string>

#include "outbox/sql/dialect.hpp"
#include "outbox/stream.hpp"

namespace outbox::sql {

/// The subscription table of the outbox table `table`.
std::string subscription_table_name(const std::string& table);

/// StreamStore over `dialect` (which must outlive it) on `table` at schema version 4.
/// Thread-safe (stateless apart from configuration).
class SqlStreamStore : public StreamStore {
 public:
  std::vector<StreamEvent> read(Connection& conn, StreamPosition after, int limit) override;
  StreamPosition head(Connection& conn) override;
  StreamPosition position_before(Connection& conn, Timestamp t) override;
  StreamLag lag(Connection& conn, StreamPosition after) override;
  std::optional<StreamHoldback> holdback(Connection& conn) override;
  void check(Connection& conn) override;

  bool create(Connection& conn, const SubscriptionSpec& spec, StreamPosition start) override;
  bool update_spec(Connection& conn, const SubscriptionSpec& spec) override;
  bool remove(Connection& conn, std::string_view name) override;
  std::optional<SubscriptionState> find(Connection& conn, std::string_view name) override;
  std::vector<SubscriptionState> list(Connection& conn) override;
  bool advance(Connection& conn, std::string_view name, StreamPosition from, StreamPosition to,
               std::int64_t delivered, const LeaseToken* token) override;
  std::optional<SubscriptionStatus> record_error(Connection& conn, std::string_view name,
                                                 std::string_view error, int max_errors,
                                                 const LeaseToken* token) override;
  bool set_status(Connection& conn, std::string_view name, SubscriptionStatus to,
                  std::vector<SubscriptionStatus> from) override;
  bool rewind(Connection& conn, std::string_view name, StreamPosition to) override;
  bool release_retention(Connection& conn, std::string_view name, std::string_view reason) override;
  std::optional<StreamPosition> retained_from(Connection& conn) override;

  const std::string& table() const { return table_; }
  const std::string& subscription_table() const { return subscription_table_; }

 protected:
  /// Throws std::invalid_argument on a bad table name.
  SqlStreamStore(const Dialect& dialect, std::string table);

  /// The two position columns of a SELECT list: xid (0 where there is none) and seq, under
  /// names of their own (position_xid, position_seq).
  virtual std::string position_columns() const {
    return "0 AS position_xid, stream_seq AS position_seq";
  }
  /// Appends the condition "position > after".
  virtual void after(Statement& s, StreamPosition after) const;
  /// The condition of readable rows (" AND …"), appended after after().
  virtual std::string readable() const { return {}; }
  /// The stream order, ascending or descending.
  virtual std::string order(bool descending) const {
    return descending ? "stream_seq DESC" : "stream_seq";
  }
  /// The position just before `p`.
  static StreamPosition before(StreamPosition p) { return {p.xid, p.seq - 1}; }

  const Dialect& sql_dialect() const { return dialect_; }
  Statement statement() const { return Statement(dialect_, true); }

 private:
  std::vector<SubscriptionState> select(Connection& conn, std::string_view name);
  void fence(Statement& s, const LeaseToken* token) const;
  /// "UPDATE … SET" the cursor to `to`, errors cleared: the start of advance() and rewind().
  Statement move_cursor(StreamPosition to, Timestamp now) const;

  const Dialect& dialect_;
  std::string table_;
  std::string subscription_table_;
  std::string lease_table_;
  std::string columns_;
};

}  // namespace outbox::sql
