// LeaseManager on the in-memory lease store: holdings, listeners, the background thread, the
// deadline after which a holding is not trusted, and the fence's verify().

#include "outbox/lease_manager.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>

#include "outbox/errors.hpp"
#include "outbox/metrics.hpp"
#include "outbox/testing/in_memory.hpp"
#include "outbox/testing/in_memory_lease.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;

// A lease store the test can make fail, as a database that cannot be reached.
class FlakyLeaseStore final : public LeaseStore {
 public:
  explicit FlakyLeaseStore(std::shared_ptr<LeaseStore> inner) : inner_(std::move(inner)) {}
  std::optional<LeaseToken> acquire(sql::Connection& c, std::string_view n, std::string_view o,
                                    std::chrono::milliseconds ttl) override {
    fail_if_down();
    if (hold_acquire) {
      acquiring = true;
      hold_acquire->wait();
    }
    return inner_->acquire(c, n, o, ttl);
  }
  bool renew(sql::Connection& c, const LeaseToken& t, std::chrono::milliseconds ttl) override {
    fail_if_down();
    return inner_->renew(c, t, ttl);
  }
  bool release(sql::Connection& c, const LeaseToken& t) override {
    fail_if_down();
    return inner_->release(c, t);
  }
  bool holds(sql::Connection& c, const LeaseToken& t) override {
    fail_if_down();
    return inner_->holds(c, t);
  }
  std::optional<LeaseInfo> find(sql::Connection& c, std::string_view n) override {
    fail_if_down();
    return inner_->find(c, n);
  }
  std::vector<LeaseInfo> list(sql::Connection& c) override {
    fail_if_down();
    return inner_->list(c);
  }
  std::atomic<bool> down{false};
  testing::Gate* hold_acquire = nullptr;  // set before start(): acquisitions wait for it
  std::atomic<bool> acquiring{false};

 private:
  void fail_if_down() {
    if (down) {
      throw ConnectionLostError("database unreachable");
    }
  }
  std::shared_ptr<LeaseStore> inner_;
};

class LeaseManagerTest : public ::testing::Test {
 protected:
  LeaseManager::Options options(const std::string& owner) {
    return {.connection_provider = pool,
            .store = store,
            .owner = owner,
            .ttl = 1000ms,
            .renew_interval = 100ms,
            .metrics = metrics};
  }
  // Records every change a manager reports.
  struct Changes {
    void operator()(const LeaseToken& token, bool held) {
      std::lock_guard lock(mutex);
      seen.emplace_back(token, held);
    }
    std::vector<std::pair<LeaseToken, bool>> snapshot() {
      std::lock_guard lock(mutex);
      return seen;
    }
    std::mutex mutex;
    std::vector<std::pair<LeaseToken, bool>> seen;
  };

  std::shared_ptr<testing::ManualClock> db_clock = std::make_shared<testing::ManualClock>();
  std::shared_ptr<testing::InMemoryLeaseStore> table =
      std::make_shared<testing::InMemoryLeaseStore>(db_clock);
  std::shared_ptr<FlakyLeaseStore> store = std::make_shared<FlakyLeaseStore>(table);
  std::shared_ptr<sql::ConnectionPool> pool =
      testing::make_in_memory_pool(std::make_shared<testing::InMemoryDatabase>());
  std::shared_ptr<InMemoryMetrics> metrics = std::make_shared<InMemoryMetrics>();
};

TEST_F(LeaseManagerTest, AcquireRenewReleaseAndListeners) {
  LeaseManager a(options("node-a"));
  LeaseManager b(options("node-b"));
  auto changes = std::make_shared<Changes>();
  a.add_listener([changes](const LeaseToken& t, bool held) { (*changes)(t, held); });
  const auto token = a.try_acquire("leader");
  ASSERT_TRUE(token);
  EXPECT_EQ(token->epoch, 1);
  EXPECT_EQ(a.token("leader"), token);
  EXPECT_FALSE(b.try_acquire("leader"));
  EXPECT_FALSE(b.token("leader"));
  EXPECT_EQ(a.try_acquire("leader"), token);  // held: renewed, same holding
  EXPECT_TRUE(a.renew("leader"));
  EXPECT_FALSE(b.renew("leader"));
  EXPECT_EQ(b.holder("leader")->owner, "node-a");
  ASSERT_TRUE(b.try_acquire("part:1"));
  const auto all = a.leases();
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].name, "leader");
  EXPECT_EQ(all[0].owner, "node-a");
  EXPECT_EQ(all[1].name, "part:1");
  EXPECT_EQ(all[1].owner, "node-b");
  a.release("leader");
  EXPECT_FALSE(a.token("leader"));
  const auto taken = b.try_acquire("leader");
  ASSERT_TRUE(taken);
  EXPECT_EQ(taken->epoch, 2);
  EXPECT_EQ(changes->snapshot(),
            (std::vector<std::pair<LeaseToken, bool>>{{*token, true}, {*token, false}}));
  const auto m = metrics->snapshot();
  EXPECT_EQ(m.lease_acquired, 3);   // node-a, part:1, then node-b
  EXPECT_EQ(m.lease_takeovers, 0);  // released, not taken over
  EXPECT_EQ(m.lease_lost, 0);
}

// A standby keeps trying; when the leader closes (releasing) it takes over at its next attempt.
TEST_F(LeaseManagerTest, AStandbyTakesOverAReleasedLease) {
  auto leader = std::make_unique<LeaseManager>(options("node-a"));
  LeaseManager standby(options("node-b"));
  leader->keep("leader");
  standby.keep("leader");
  leader->start();
  ASSERT_TRUE(wait_until([&] { return leader->token("leader").has_value(); }));
  standby.start();
  EXPECT_FALSE(standby.token("leader"));
  leader.reset();  // close(): releases
  ASSERT_TRUE(wait_until([&] { return standby.token("leader").has_value(); }));
  EXPECT_EQ(standby.token("leader")->epoch, 2);
}

// A leader that stopped renewing (its holding expired in the database) loses it at its next
// renewal and the standby takes over, counted as a takeover.
TEST_F(LeaseManagerTest, AnExpiredHoldingIsLostAndTakenOver) {
  LeaseManager a(options("node-a"));
  LeaseManager b(options("node-b"));
  auto changes = std::make_shared<Changes>();
  a.add_listener([changes](const LeaseToken& t, bool held) { (*changes)(t, held); });
  const auto first = a.try_acquire("leader");
  ASSERT_TRUE(first);
  db_clock->advance(2s);  // the database's clock passes the ttl: as if a's renewals were lost
  const auto second = b.try_acquire("leader");
  ASSERT_TRUE(second);
  EXPECT_EQ(second->epoch, 2);
  EXPECT_FALSE(a.renew("leader"));
  EXPECT_FALSE(a.token("leader"));
  EXPECT_EQ(changes->snapshot().back(), std::make_pair(*first, false));
  const auto m = metrics->snapshot();
  EXPECT_EQ(m.lease_takeovers, 1);
  EXPECT_EQ(m.lease_lost, 1);
}

// A holder that cannot reach the database stops trusting its holding at (last renewal sent) +
// ttl − margin, before the database may hand it to anyone, and says so.
TEST_F(LeaseManagerTest, UnreachableDatabaseEndsTrustBeforeTheTtl) {
  LeaseManager a(options("node-a"));
  auto changes = std::make_shared<Changes>();
  a.add_listener([changes](const LeaseToken& t, bool held) { (*changes)(t, held); });
  a.keep("leader");
  a.start();
  ASSERT_TRUE(wait_until([&] { return a.token("leader").has_value(); }));
  const auto token = *a.token("leader");
  store->down = true;
  // The database's clock stands still, so its holding never expires there: only the manager's
  // own deadline can end the trust.
  ASSERT_TRUE(wait_until([&] { return !a.token("leader"); }));
  ASSERT_TRUE(wait_until(
      [&] { return !changes->snapshot().empty() && !changes->snapshot().back().second; }));
  EXPECT_EQ(changes->snapshot().back().first, token);
  EXPECT_TRUE(table->holds(token));  // the database still has it: trust ended first
  store->down = false;
  db_clock->advance(2s);
  // Reachable again: the kept lease is acquired again, under a new epoch.
  ASSERT_TRUE(wait_until([&] { return a.token("leader").has_value(); }));
  EXPECT_EQ(a.token("leader")->epoch, token.epoch + 1);
}

TEST_F(LeaseManagerTest, AFenceVerifiesAndGivesUpALostHolding) {
  LeaseManager a(options("node-a"));
  auto fence = a.fence("leader");
  EXPECT_FALSE(fence->token());
  const auto token = a.try_acquire("leader");
  ASSERT_TRUE(token);
  EXPECT_EQ(fence->token(), token);
  fence->verify();  // still held: nothing changes
  EXPECT_EQ(fence->token(), token);
  db_clock->advance(2s);
  LeaseManager b(options("node-b"));
  ASSERT_TRUE(b.try_acquire("leader"));
  fence->verify();  // a fenced write changed nothing: the holding is checked and given up
  EXPECT_FALSE(fence->token());
  EXPECT_EQ(metrics->snapshot().lease_lost, 1);
}

// Found breaking leases: release() while the thread's acquisition was in flight found nothing
// held, and the thread then kept (and renewed) what it took, so no standby ever got the lease.
TEST_F(LeaseManagerTest, ReleaseWhileAnAcquisitionIsInFlightEndsHeldNothing) {
  testing::Gate gate;
  store->hold_acquire = &gate;
  LeaseManager a(options("node-a"));
  a.keep("leader");
  a.start();
  ASSERT_TRUE(wait_until([&] { return store->acquiring.load(); }));
  std::thread releaser([&] { a.release("leader"); });
  gate.open();
  releaser.join();
  EXPECT_FALSE(a.token("leader"));
  sql::PooledConnection conn = pool->acquire();
  const auto row = table->find(conn.get(), "leader");
  ASSERT_TRUE(row);
  EXPECT_FALSE(row->live);  // released in the database too: a standby may take it at once
  store->hold_acquire = nullptr;
  LeaseManager b(options("node-b"));
  EXPECT_TRUE(b.try_acquire("leader"));
}

TEST_F(LeaseManagerTest, OptionsAreValidated) {
  auto bad = [&](auto mutate) {
    auto o = options("node-a");
    mutate(o);
    EXPECT_THROW(LeaseManager{o}, std::invalid_argument);
  };
  bad([](auto& o) { o.connection_provider = nullptr; });
  bad([](auto& o) { o.store = nullptr; });
  bad([](auto& o) { o.owner = "has space"; });
  bad([](auto& o) { o.ttl = 0ms; });
  bad([](auto& o) { o.renew_interval = 0ms; });
  bad([](auto& o) { o.renew_interval = 500ms; });  // > (ttl − margin) / 2: one miss would lose it
  bad([](auto& o) { o.margin = 600ms; });
  LeaseManager defaults({.connection_provider = pool, .store = store});
  EXPECT_FALSE(defaults.owner().empty());
  EXPECT_EQ(defaults.ttl(), 15s);
  LeaseManager other({.connection_provider = pool, .store = store});
  EXPECT_NE(defaults.owner(), other.owner());
  defaults.close();
  EXPECT_THROW(defaults.start(), std::logic_error);
}

}  // namespace
}  // namespace outbox
