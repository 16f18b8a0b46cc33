#include "outbox/sqlite/stream.hpp"

#include "outbox/sqlite/store.hpp"

namespace outbox::sqlite {

SqliteStreamStore::SqliteStreamStore(std::string table)
    : SqlStreamStore(dialect(), std::move(table)) {}

}  // namespace outbox::sqlite
