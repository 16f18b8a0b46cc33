#pragma once
// A real SQLite file with the outbox schema, a pool, a transaction manager and a listener registry.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <mutex>

#include "outbox/clock.hpp"
#include "outbox/listener.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/test_support.hpp"

namespace outbox::testing {

class SqliteFixture : public ::testing::Test, public RowQueries<SqliteFixture> {
 protected:
  void SetUp() override {
    pool = sqlite::make_pool(dir.file("outbox.db"), 8);
    sqlite::create_schema(*pool->acquire());
    store = std::make_shared<sqlite::SqliteOutboxStore>();
    tx_context = std::make_shared<ThreadLocalTxContext>();
    tx = std::make_unique<TransactionManager>(pool, tx_context);
    listeners = std::make_shared<DefaultListenerRegistry>();
  }

  friend class RowQueries<SqliteFixture>;

  TempDir dir;
  std::shared_ptr<sql::ConnectionPool> pool;
  std::shared_ptr<sqlite::SqliteOutboxStore> store;
  std::shared_ptr<ThreadLocalTxContext> tx_context;
  std::unique_ptr<TransactionManager> tx;
  std::shared_ptr<DefaultListenerRegistry> listeners;
};

}  // namespace outbox::testing
