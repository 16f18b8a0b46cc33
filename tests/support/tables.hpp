#pragma once
// Removes what `outbox migrate` (or create_schema_for) made for a test's own table on a server.

#include <string>

#include "outbox/errors.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/sql/stream_store.hpp"
#include "outbox/store.hpp"

namespace outbox::testing {

/// Drops `table` and its side tables (leases, group blocks, subscriptions, stream head) and
/// forgets its schema version. Throws outbox::StoreError.
inline void drop_outbox_tables(sql::Connection& conn, const std::string& table) {
  for (const auto& t :
       {sql::lease_table_name(table), sql::group_block_table_name(table),
        sql::subscription_table_name(table), derived_name(table, "_stream_head"), table}) {
    conn.execute("DROP TABLE IF EXISTS " + t);
  }
  try {
    conn.execute("DELETE FROM outbox_schema_version WHERE table_name = '" + table + "'");
  } catch (const StoreError&) {  // made by create_schema_for: no version table
  }
}

}  // namespace outbox::testing
