#pragma once
// The MariaDB stream: writers leave stream_seq NULL; a sequencer numbers committed rows in short
// transactions of its own, so readers only ever see a gap-free prefix of numbered rows.

#include <string>

#include "outbox/sql/stream_store.hpp"

namespace outbox::mysql {

/// Adds the stream column (stream_seq) and its index, the tags column, the sequencer's head table
/// and the subscription table to `table` if missing: schema version 4, also made by
/// create_schema. Throws outbox::StoreError, std::invalid_argument.
void create_stream_schema(sql::Connection& conn, const std::string& table = "outbox_event");

/// StreamStore for MariaDB. Thread-safe (stateless).
class MySqlStreamStore final : public sql::SqlStreamStore {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit MySqlStreamStore(std::string table = "outbox_event");

  bool needs_sequencer() const override { return true; }
  /// One READ COMMITTED transaction: locks the head row (sequencers take turns), reads committed
  /// rows without a number in insert order (stream_id), numbers them from the head (or past the
  /// highest number present) and moves the head.
  int sequence(sql::Connection& conn, int limit) override;

 private:
  std::string head_table_;
};

}  // namespace outbox::mysql
