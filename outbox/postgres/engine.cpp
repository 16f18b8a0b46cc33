#include "outbox/postgres/engine.hpp"

#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/notifications.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/postgres/stream.hpp"

namespace outbox::postgres {

const sql::Engine& engine() {
  static const sql::Engine instance{
      .name = "postgres",
      // A URL, or a libpq "key=value" connection string (whose values may hold "://").
      .accepts =
          [](std::string_view url) {
            if (url.starts_with("postgresql://") || url.starts_with("postgres://")) {
              return true;
            }
            const auto eq = url.find('=');
            const auto key = url.substr(0, eq);
            return eq != std::string_view::npos && eq < url.find("://") && !key.empty() &&
                   key.find_first_not_of(" abcdefghijklmnopqrstuvwxyz_") == std::string_view::npos;
          },
      .open_pool =
          [](const std::string& url, const sql::PoolOptions& options) {
            return make_pool(url, options.max_size, options.timeouts);
          },
      .dialect = dialect,
      .make_store = [](const sql::StoreOptions& options) -> std::shared_ptr<OutboxStore> {
        return std::make_shared<PostgresOutboxStore>(options);
      },
      .make_purger = [](const std::string& table) -> std::shared_ptr<EventPurger> {
        return std::make_shared<PostgresEventPurger>(table);
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
        return std::make_shared<PostgresStreamStore>(table);
      },
      // DDL is transactional: the whole migration is one transaction under an advisory lock.
      .lock_migrations =
          [](sql::Connection& conn) {
            conn.begin();
            try {
              conn.query("SELECT pg_advisory_xact_lock(7100534263114217)");
            } catch (...) {
              conn.rollback();
              throw;
            }
          },
      .unlock_migrations = sql::finish_transaction,
      .make_change_watcher =
          [](const std::string& url, const std::string& table,
             const sql::NetworkTimeouts& timeouts) -> std::unique_ptr<ChangeWatcher> {
        return std::make_unique<NotificationWatcher>(
            NotificationWatcher::Options{.conninfo = url, .table = table, .timeouts = timeouts});
      },
  };
  return instance;
}

}  // namespace outbox::postgres
