#pragma once
// An in-memory outbox (outbox::testing) with a pool, a transaction manager and a listener
// registry: the fixture of the core's unit tests, which need no database.

#include <gtest/gtest.h>

#include <memory>

#include "outbox/listener.hpp"
#include "outbox/testing/in_memory.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/test_support.hpp"

namespace outbox::testing {

class MemoryFixture : public ::testing::Test, public RowQueries<MemoryFixture> {
 protected:
  friend class RowQueries<MemoryFixture>;

  std::shared_ptr<InMemoryDatabase> database = std::make_shared<InMemoryDatabase>();
  std::shared_ptr<sql::ConnectionPool> pool = make_in_memory_pool(database);
  std::shared_ptr<InMemoryOutboxStore> store = std::make_shared<InMemoryOutboxStore>();
  std::shared_ptr<ThreadLocalTxContext> tx_context = std::make_shared<ThreadLocalTxContext>();
  std::unique_ptr<TransactionManager> tx = std::make_unique<TransactionManager>(pool, tx_context);
  std::shared_ptr<DefaultListenerRegistry> listeners = std::make_shared<DefaultListenerRegistry>();
};

}  // namespace outbox::testing
