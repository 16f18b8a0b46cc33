#include "outbox/sqlite/engine.hpp"

#include <stdexcept>

#include "outbox/sqlite/data_version_watcher.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/sqlite/stream.hpp"

namespace outbox::sqlite {

const sql::Engine& engine() {
  static const sql::Engine instance{
      .name = "sqlite",
      .accepts = [](std::string_view url) { return url.starts_with("sqlite://"); },
      .open_pool =
          [](const std::string& url, const sql::PoolOptions& options) {
            const std::string path = url.substr(9);
            if (path.empty()) {
              throw std::invalid_argument("database URL '" + url + "' has no file path");
            }
            return make_pool(path, options.max_size,
                             OpenOptions{.create = options.create_sqlite_file});
          },
      .dialect = dialect,
      .make_store = [](const sql::StoreOptions& options) -> std::shared_ptr<OutboxStore> {
        return std::make_shared<SqliteOutboxStore>(options);
      },
      .make_purger = [](const std::string& table) -> std::shared_ptr<EventPurger> {
        return std::make_shared<SqliteEventPurger>(table);
      },
      .create_schema = [](sql::Connection& conn,
                          const std::string& table) { create_schema(conn, table); },
      .create_lease_schema = [](sql::Connection& conn,
                                const std::string& table) { create_lease_schema(conn, table); },
      .create_stream_schema = [](sql::Connection& conn,
                                 const std::string& table) { create_stream_schema(conn, table); },
      .create_group_schema = [](sql::Connection& conn,
                                const std::string& table) { create_group_schema(conn, table); },
      .create_writer_defaults =
          [](sql::Connection& conn, const std::string& table) {
            create_writer_defaults(conn, table);
          },
      .create_tracing_column = [](sql::Connection& conn,
                                  const std::string& table) { create_tracing_column(conn, table); },
      .create_retry_dead_index =
          [](sql::Connection& conn, const std::string& table) {
            create_retry_dead_index(conn, table);
          },
      .make_stream_store = [](const std::string& table) -> std::shared_ptr<StreamStore> {
        return std::make_shared<SqliteStreamStore>(table);
      },
      // DDL is transactional: the whole migration is one transaction, begun under the write lock
      // (BEGIN IMMEDIATE).
      .lock_migrations = [](sql::Connection& conn) { conn.begin(); },
      .unlock_migrations = sql::finish_transaction,
      // The table does not matter: any commit to the file moves data_version.
      .make_change_watcher = [](const std::string& url, const std::string& /*table*/,
                                const sql::NetworkTimeouts&) -> std::unique_ptr<ChangeWatcher> {
        return std::make_unique<DataVersionWatcher>(
            DataVersionWatcher::Options{.path = url.substr(9)});
      },
  };
  return instance;
}

}  // namespace outbox::sqlite
