#pragma once
// Picks the dialect's store, purger and schema from a connection (spec's JdbcOutboxStores.detect).

#include <memory>
#include <string>

#include "outbox/json_codec.hpp"
#include "outbox/purge.hpp"
#include "outbox/store.hpp"

namespace outbox {

/// The OutboxStore for `conn`'s dialect (sqlite, postgres, mysql) on `table`. Server engines use
/// the database clock. Throws std::invalid_argument for an unknown or not-built dialect or a bad
/// table name.
std::shared_ptr<OutboxStore> detect_store(sql::Connection& conn,
                                          const std::string& table = "outbox_event",
                                          const JsonCodec& codec = JsonCodec::default_codec());

/// The status-based (DONE/DEAD) purger for `conn`'s dialect. Throws like detect_store.
std::shared_ptr<EventPurger> detect_purger(sql::Connection& conn,
                                           const std::string& table = "outbox_event");

/// Creates the outbox table and indexes for `conn`'s dialect (idempotent). Throws like
/// detect_store, and outbox::StoreError.
void create_schema_for(sql::Connection& conn, const std::string& table = "outbox_event");

}  // namespace outbox
