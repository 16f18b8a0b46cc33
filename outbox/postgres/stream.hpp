#pragma once
// The PostgreSQL stream: positions are (transaction id, sequence), read only below the oldest
// transaction still open, so a transaction that commits late is never skipped.

#include <string>

#include "outbox/sql/stream_store.hpp"

namespace outbox::postgres {

/// Adds the stream columns (stream_xid, stream_seq), the tags column and the subscription table
/// to `table` if missing: schema version 4, also made by create_schema. Rows already there are
/// numbered in created_at order. Throws outbox::StoreError, std::invalid_argument.
void create_stream_schema(sql::Connection& conn, const std::string& table = "outbox_event");

/// StreamStore for PostgreSQL. Thread-safe (stateless).
class PostgresStreamStore final : public sql::SqlStreamStore {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit PostgresStreamStore(std::string table = "outbox_event");

  std::optional<StreamHoldback> holdback(sql::Connection& conn) override;
  /// Throws StreamError when the table holds transaction ids the server has not reached (a
  /// database restored from a dump into a new cluster): `outbox stream rebase` fixes it.
  void check(sql::Connection& conn) override;
  std::int64_t rebase(sql::Connection& conn) override;
  bool positions_have_xid() const override { return true; }

 protected:
  std::string position_columns() const override;
  void after(sql::Statement& s, StreamPosition after) const override;
  std::string readable() const override;
  std::string order(bool descending) const override;
};

}  // namespace outbox::postgres
