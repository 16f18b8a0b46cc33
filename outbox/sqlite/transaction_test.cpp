#include "outbox/transaction.hpp"

#include <gtest/gtest.h>

#include "outbox/errors.hpp"
#include "outbox/sqlite/driver.hpp"
#include "tests/support/test_support.hpp"

namespace {

class TransactionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    pool_ = outbox::sqlite::make_pool(dir_.file("tx.db"), 2);
    pool_->acquire()->execute("CREATE TABLE t (a INTEGER)");
    context_ = std::make_shared<outbox::ThreadLocalTxContext>();
    tm_ = std::make_unique<outbox::TransactionManager>(pool_, context_);
  }
  std::int64_t count() {
    return pool_->acquire()->query("SELECT COUNT(*) FROM t").at(0).get_int(0);
  }

  outbox::testing::TempDir dir_;
  std::shared_ptr<outbox::sql::ConnectionPool> pool_;
  std::shared_ptr<outbox::ThreadLocalTxContext> context_;
  std::unique_ptr<outbox::TransactionManager> tm_;
};

TEST_F(TransactionTest, CommitRunsAfterCommitCallbacksOnly) {
  int committed = 0;
  int rolled_back = 0;
  {
    auto tx = tm_->begin();
    EXPECT_TRUE(context_->is_transaction_active());
    EXPECT_EQ(&context_->current_connection(), &tx.connection());
    tx.connection().execute("INSERT INTO t VALUES (1)");
    context_->after_commit([&] { ++committed; });
    context_->after_rollback([&] { ++rolled_back; });
    EXPECT_EQ(committed, 0);
    tx.commit();
    EXPECT_FALSE(context_->is_transaction_active());
  }
  EXPECT_EQ(committed, 1);
  EXPECT_EQ(rolled_back, 0);
  EXPECT_EQ(count(), 1);
}

TEST_F(TransactionTest, DestructorRollsBack) {
  int committed = 0;
  int rolled_back = 0;
  {
    auto tx = tm_->begin();
    tx.connection().execute("INSERT INTO t VALUES (1)");
    context_->after_commit([&] { ++committed; });
    context_->after_rollback([&] { ++rolled_back; });
  }
  EXPECT_EQ(committed, 0);
  EXPECT_EQ(rolled_back, 1);
  EXPECT_EQ(count(), 0);
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
  tx.connection().execute("INSERT INTO t VALUES (1)");
  context_->after_commit([&] { ++committed; });
  context_->after_rollback([&] { ++rolled_back; });
  // Ending the transaction behind the manager's back makes its COMMIT fail deterministically.
  tx.connection().rollback();
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
