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

/// A clock the test moves by hand. Thread-safe.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(Timestamp start = std::chrono::system_clock::now()) : now_(start) {}
  Timestamp now() const override {
    std::lock_guard lock(mutex_);
    return now_;
  }
  void advance(std::chrono::microseconds d) {
    std::lock_guard lock(mutex_);
    now_ += d;
  }

 private:
  mutable std::mutex mutex_;
  Timestamp now_;
};

class SqliteFixture : public ::testing::Test {
 protected:
  void SetUp() override {
    pool = sqlite::make_pool(dir.file("outbox.db"), 8);
    sqlite::create_schema(*pool->acquire());
    store = std::make_shared<sqlite::SqliteOutboxStore>();
    tx_context = std::make_shared<ThreadLocalTxContext>();
    tx = std::make_unique<TransactionManager>(pool, tx_context);
    listeners = std::make_shared<DefaultListenerRegistry>();
  }

  std::optional<OutboxEvent> row(const std::string& id) {
    return store->find(*pool->acquire(), id);
  }
  EventStatus status(const std::string& id) { return row(id).value().status; }
  std::int64_t count(EventStatus s) {
    return store->count_by_status(*pool->acquire())[static_cast<std::size_t>(s)];
  }
  /// Waits (bounded) until the row has status `s`.
  bool wait_status(const std::string& id, EventStatus s) {
    return wait_until([&] {
      auto r = row(id);
      return r && r->status == s;
    });
  }

  TempDir dir;
  std::shared_ptr<sql::ConnectionPool> pool;
  std::shared_ptr<sqlite::SqliteOutboxStore> store;
  std::shared_ptr<ThreadLocalTxContext> tx_context;
  std::unique_ptr<TransactionManager> tx;
  std::shared_ptr<DefaultListenerRegistry> listeners;
};

/// A one-shot gate listeners can block on until the test opens it.
class Gate {
 public:
  void open() {
    {
      std::lock_guard lock(mutex_);
      open_ = true;
    }
    cv_.notify_all();
  }
  void wait() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool open_ = false;
};

}  // namespace outbox::testing
