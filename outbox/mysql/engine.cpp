#include "outbox/mysql/engine.hpp"

#include "outbox/errors.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/mysql/stream.hpp"

namespace outbox::mysql {

const sql::Engine& engine() {
  static const sql::Engine instance{
      .name = "mysql",
      .accepts =
          [](std::string_view url) {
            return url.starts_with("mysql://") || url.starts_with("mariadb://");
          },
      .open_pool =
          [](const std::string& url, const sql::PoolOptions& options) {
            return make_pool(url, options.max_size, options.timeouts);
          },
      .dialect = dialect,
      .make_store = [](const sql::StoreOptions& options) -> std::shared_ptr<OutboxStore> {
        return std::make_shared<MySqlOutboxStore>(options);
      },
      .make_purger = [](const std::string& table) -> std::shared_ptr<EventPurger> {
        return std::make_shared<MySqlEventPurger>(table);
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
      .cluster_by_insert_order =
          [](sql::Connection& conn, const std::string& table) {
            cluster_by_insert_order(conn, table);
          },
      .create_retry_dead_index =
          [](sql::Connection& conn, const std::string& table) {
            create_retry_dead_index(conn, table);
          },
      .make_stream_store = [](const std::string& table) -> std::shared_ptr<StreamStore> {
        return std::make_shared<MySqlStreamStore>(table);
      },
      // DDL commits implicitly in MariaDB, so a transaction cannot hold the lock: a named lock can.
      .lock_migrations =
          [](sql::Connection& conn) {
            const auto rows = conn.query("SELECT GET_LOCK('outbox_migrate', 300)");
            if (rows.empty() || rows[0].is_null(0) || rows[0].get_int(0) != 1) {
              throw StoreError("migrate: another migration held the lock for 5 minutes", "55P03");
            }
          },
      .unlock_migrations = [](sql::Connection& conn,
                              bool) { conn.query("SELECT RELEASE_LOCK('outbox_migrate')"); },
  };
  return instance;
}

}  // namespace outbox::mysql
