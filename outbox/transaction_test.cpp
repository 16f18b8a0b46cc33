// TransactionManager and ThreadLocalTxContext on the in-memory outbox: callbacks after commit and
// rollback, misuse, and a failed COMMIT. Each engine's own transactions: tests/
// transaction_safety_test.cpp.

#include "outbox/transaction.hpp"

#include <gtest/gtest.h>

#include <thread>

#include "outbox/errors.hpp"
#include "outbox/testing/in_memory.hpp"

namespace {

class TransactionTest : public ::testing::Test {
 protected:
  // One row written in the current transaction, as business code would write its own.
  void write_row(outbox::sql::Connection& conn, const std::string& id = outbox::new_ulid()) {
    store_.insert_new(conn, outbox::EventEnvelope::builder(outbox::EventType::of("E"))
                                .event_id(id)
                                .payload_json("{}")
                                .build());
  }
  std::size_t count() const { return database_->rows().size(); }

  std::shared_ptr<outbox::testing::InMemoryDatabase> database_ =
      std::make_shared<outbox::testing::InMemoryDatabase>();
  std::shared_ptr<outbox::sql::ConnectionPool> pool_ =
      outbox::testing::make_in_memory_pool(database_, 2);
  outbox::testing::InMemoryOutboxStore store_;
  std::shared_ptr<outbox::ThreadLocalTxContext> context_ =
      std::make_shared<outbox::ThreadLocalTxContext>();
  std::unique_ptr<outbox::TransactionManager> tm_ =
      std::make_unique<outbox::TransactionManager>(pool_, context_);
};

TEST_F(TransactionTest, CommitRunsAfterCommitCallbacksOnly) {
  int committed = 0;
  int rolled_back = 0;
  {
    auto tx = tm_->begin();
    EXPECT_TRUE(context_->is_transaction_active());
    EXPECT_EQ(&context_->current_connection(), &tx.connection());
    write_row(tx.connection());
    context_->after_commit([&] { ++committed; });
    context_->after_rollback([&] { ++rolled_back; });
    EXPECT_EQ(committed, 0);
    tx.commit();
    EXPECT_FALSE(context_->is_transaction_active());
  }
  EXPECT_EQ(committed, 1);
  EXPECT_EQ(rolled_back, 0);
  EXPECT_EQ(count(), 1u);
}

TEST_F(TransactionTest, DestructorRollsBack) {
  int committed = 0;
  int rolled_back = 0;
  {
    auto tx = tm_->begin();
    write_row(tx.connection());
    context_->after_commit([&] { ++committed; });
    context_->after_rollback([&] { ++rolled_back; });
  }
  EXPECT_EQ(committed, 0);
  EXPECT_EQ(rolled_back, 1);
  EXPECT_EQ(count(), 0u);
  EXPECT_FALSE(context_->is_transaction_active());
}

TEST_F(TransactionTest, CallbackExceptionsDoNotEscapeAndOthersStillRun) {
  int ran = 0;
  auto tx = tm_->begin();
  context_->after_commit([] { throw std::runtime_error("boom"); });
  context_->after_commit([&] { ++ran; });
  EXPECT_NO_THROW(tx.commit());
  EXPECT_EQ(ran, 1);
}

TEST_F(TransactionTest, MisuseThrowsLogicError) {
  EXPECT_THROW(context_->current_connection(), std::logic_error);
  EXPECT_THROW(context_->after_commit([] {}), std::logic_error);
  auto tx = tm_->begin();
  EXPECT_THROW(tm_->begin(), std::logic_error);
  tx.rollback();
  EXPECT_THROW(tx.commit(), std::logic_error);
  EXPECT_THROW(tx.rollback(), std::logic_error);
}

TEST_F(TransactionTest, FailedCommitRunsRollbackCallbacksAndThrows) {
  int committed = 0;
  int rolled_back = 0;
  auto tx = tm_->begin();
  context_->after_commit([&] { ++committed; });
  context_->after_rollback([&] { ++rolled_back; });
  write_row(tx.connection(), "same-id");
  // Another transaction commits the same id first: this COMMIT is refused.
  {
    auto conn = pool_->acquire();
    conn->begin();
    write_row(*conn, "same-id");
    conn->commit();
  }
  EXPECT_THROW(tx.commit(), outbox::StoreError);
  EXPECT_EQ(committed, 0);
  EXPECT_EQ(rolled_back, 1);
  EXPECT_FALSE(tx.active());
  EXPECT_FALSE(context_->is_transaction_active());
}

TEST_F(TransactionTest, EachThreadSeesItsOwnTransaction) {
  auto tx = tm_->begin();
  bool other_thread_active = true;
  std::thread([&] { other_thread_active = context_->is_transaction_active(); }).join();
  EXPECT_FALSE(other_thread_active);
  EXPECT_TRUE(context_->is_transaction_active());
}

}  // namespace
