#pragma once
// The SQLite stream: one writer at a time, so the AUTOINCREMENT rowid (stream_seq) is commit order.

#include <string>

#include "outbox/sql/stream_store.hpp"

namespace outbox::sqlite {

/// StreamStore for SQLite (create_stream_schema is in sqlite/store.hpp). Thread-safe (stateless).
class SqliteStreamStore final : public sql::SqlStreamStore {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit SqliteStreamStore(std::string table = "outbox_event");
};

}  // namespace outbox::sqlite
