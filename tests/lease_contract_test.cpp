// The LeaseStore contract, one parameterized suite for every engine and the in-memory store:
// acquire, renew, steal after expiry, release, the epoch, racing acquirers, the fence, and a
// session whose clock settings differ.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <functional>
#include <thread>

#include "outbox/detect/detect.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/testing/in_memory.hpp"
#include "outbox/testing/in_memory_lease.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;

class LeaseContract : public ::testing::TestWithParam<testing::Engine> {
 protected:
  void SetUp() override {
    const auto& engine = GetParam();
    const auto url = engine.url();
    OUTBOX_REQUIRE_SERVER(url, engine.name);
    if (engine.name == "memory") {
      clock_ = std::make_shared<testing::ManualClock>();
      store_ = std::make_shared<testing::InMemoryLeaseStore>(clock_);
      connect_ = [] {
        return std::make_unique<testing::InMemoryConnection>(
            std::make_shared<testing::InMemoryDatabase>());
      };
    } else {
      if (engine.name == "sqlite") {
        connect_ = [path = dir_.file("lease.db")] { return sqlite::open(path); };
      } else if (engine.name == "postgres") {
        connect_ = [u = *url] { return postgres::connect(u); };
      } else {
        connect_ = [u = *url] { return mysql::connect(u); };
      }
      table_ = testing::unique_table("lease");
      auto conn = connect_();
      create_schema_for(*conn, table_);
      store_ = detect_lease_store(*conn, table_);
    }
    conn_ = connect_();
  }
  void TearDown() override {
    if (conn_ && !table_.empty() && GetParam().name != "sqlite") {
      conn_->execute("DROP TABLE IF EXISTS " + sql::lease_table_name(table_));
      conn_->execute("DROP TABLE IF EXISTS " + table_);
    }
  }
  bool sql() const { return GetParam().name != "memory"; }
  // Waits (bounded) until the database says `name` is no longer live; on the in-memory store the
  // test's clock moves instead.
  bool wait_expired(const std::string& name, std::chrono::milliseconds ttl) {
    if (clock_) {
      clock_->advance(ttl + 1ms);
    }
    return testing::wait_until([&] { return !store_->find(*conn_, name)->live; });
  }

  testing::TempDir dir_;
  std::shared_ptr<testing::ManualClock> clock_;
  std::shared_ptr<LeaseStore> store_;
  std::function<std::unique_ptr<sql::Connection>()> connect_;
  std::unique_ptr<sql::Connection> conn_;
  std::string table_;
};

TEST_P(LeaseContract, OneHolderAtATimeAndTheEpochCountsHoldings) {
  EXPECT_FALSE(store_->find(*conn_, "leader"));
  const auto a = store_->acquire(*conn_, "leader", "node-a", 30s);
  ASSERT_TRUE(a);
  EXPECT_EQ(a->epoch, 1);
  EXPECT_EQ(a->owner, "node-a");
  EXPECT_FALSE(store_->acquire(*conn_, "leader", "node-b", 30s));
  EXPECT_FALSE(store_->acquire(*conn_, "leader", "node-a", 30s));  // held: renew it instead
  EXPECT_TRUE(store_->holds(*conn_, *a));
  const auto info = store_->find(*conn_, "leader");
  ASSERT_TRUE(info);
  EXPECT_EQ(info->owner, "node-a");
  EXPECT_EQ(info->epoch, 1);
  EXPECT_TRUE(info->live);
  ASSERT_TRUE(info->acquired_at && info->renewed_at && info->expires_at);
  EXPECT_GE(*info->expires_at - *info->acquired_at, 29s);
  EXPECT_LE(*info->expires_at - *info->acquired_at, 31s);
  // Other names are other leases.
  const auto part = store_->acquire(*conn_, "part:7", "node-b", 30s);
  ASSERT_TRUE(part);
  EXPECT_EQ(part->epoch, 1);
  const auto all = store_->list(*conn_);
  ASSERT_EQ(all.size(), 2u);
  EXPECT_EQ(all[0].name, "leader");
  EXPECT_EQ(all[1].name, "part:7");
}

TEST_P(LeaseContract, RenewExtendsOnlyTheLiveHolding) {
  const auto a = store_->acquire(*conn_, "leader", "node-a", 30s);
  ASSERT_TRUE(a);
  const auto before = store_->find(*conn_, "leader")->expires_at;
  if (clock_) {
    clock_->advance(1s);
  }
  EXPECT_TRUE(store_->renew(*conn_, *a, 60s));
  const auto after = store_->find(*conn_, "leader")->expires_at;
  EXPECT_GE(*after - *before, 29s);
  auto stale = *a;
  stale.epoch += 1;
  EXPECT_FALSE(store_->renew(*conn_, stale, 30s));
  auto other = *a;
  other.owner = "node-b";
  EXPECT_FALSE(store_->renew(*conn_, other, 30s));
  EXPECT_FALSE(store_->holds(*conn_, other));
  EXPECT_FALSE(store_->release(*conn_, other));
  EXPECT_TRUE(store_->holds(*conn_, *a));
}

TEST_P(LeaseContract, ReleaseHandsOverAtOnceUnderAHigherEpoch) {
  const auto a = store_->acquire(*conn_, "leader", "node-a", 30s);
  ASSERT_TRUE(a);
  EXPECT_TRUE(store_->release(*conn_, *a));
  const auto info = store_->find(*conn_, "leader");
  EXPECT_FALSE(info->owner);
  EXPECT_FALSE(info->live);
  EXPECT_FALSE(store_->holds(*conn_, *a));
  EXPECT_FALSE(store_->renew(*conn_, *a, 30s));
  const auto b = store_->acquire(*conn_, "leader", "node-b", 30s);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->epoch, a->epoch + 1);
  EXPECT_FALSE(store_->release(*conn_, *a));  // a's holding ended: b's stays
  EXPECT_TRUE(store_->holds(*conn_, *b));
}

// The old holder of an expired lease can neither renew nor release it once another took it, and
// the same owner coming back gets a new epoch.
TEST_P(LeaseContract, AnExpiredLeaseIsTakenOverAndTheOldHoldingIsDead) {
  const auto a = store_->acquire(*conn_, "leader", "node-a", 300ms);
  ASSERT_TRUE(a);
  ASSERT_TRUE(wait_expired("leader", 300ms));
  EXPECT_FALSE(store_->holds(*conn_, *a));
  EXPECT_FALSE(store_->renew(*conn_, *a, 30s));  // expired: acquire again instead
  const auto b = store_->acquire(*conn_, "leader", "node-b", 300ms);
  ASSERT_TRUE(b);
  EXPECT_EQ(b->epoch, 2);
  EXPECT_FALSE(store_->renew(*conn_, *a, 30s));
  EXPECT_FALSE(store_->release(*conn_, *a));
  EXPECT_TRUE(store_->holds(*conn_, *b));
  ASSERT_TRUE(wait_expired("leader", 300ms));
  const auto a_again = store_->acquire(*conn_, "leader", "node-a", 30s);
  ASSERT_TRUE(a_again);
  EXPECT_EQ(a_again->epoch, 3);
}

TEST_P(LeaseContract, RacingAcquirersExactlyOneWins) {
  constexpr int kRacers = 6;
  std::vector<std::unique_ptr<sql::Connection>> conns;
  for (int i = 0; i < kRacers; ++i) {
    conns.push_back(sql() ? connect_() : nullptr);
  }
  // A first acquisition creates the row; the race is then over an expired holding too.
  for (int round = 0; round < 2; ++round) {
    std::atomic<int> ready{0};
    std::atomic<int> winners{0};
    std::vector<std::thread> racers;
    for (int i = 0; i < kRacers; ++i) {
      racers.emplace_back([&, i] {
        ++ready;
        while (ready.load() < kRacers) {
          std::this_thread::yield();
        }
        sql::Connection& conn = conns[i] ? *conns[i] : *conn_;
        if (store_->acquire(conn, "race", "racer-" + std::to_string(i), 400ms)) {
          ++winners;
        }
      });
    }
    for (auto& t : racers) {
      t.join();
    }
    EXPECT_EQ(winners.load(), 1) << "round " << round;
    EXPECT_EQ(store_->find(*conn_, "race")->epoch, round + 1);
    ASSERT_TRUE(wait_expired("race", 400ms));
  }
}

// The fence makes another statement depend on the holding, in that same statement.
TEST_P(LeaseContract, AFencedStatementChangesNothingUnderALostHolding) {
  if (!sql()) {
    GTEST_SKIP() << "not on the in-memory store: the fence is SQL (it checks holds() instead)";
  }
  conn_->execute("INSERT INTO " + table_ +
                 " (event_id, event_type, payload, status, attempts, available_at, created_at) "
                 "VALUES ('e1', 'T', '{}', 0, 0, " +
                 (GetParam().name == "sqlite" ? std::string("0, 0)")
                  : GetParam().name == "postgres"
                      ? std::string("now(), now())")
                      : std::string("UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))")));
  const auto& dialect = engine_for(conn_->dialect()).dialect();
  auto bump = [&](const LeaseToken& token) {
    sql::Statement s(dialect, true);
    s.sql("UPDATE " + table_ + " SET attempts = attempts + 1 WHERE event_id = 'e1'");
    sql::append_fence(s, dialect, sql::lease_table_name(table_), token);
    return s.execute(*conn_);
  };
  const auto a = store_->acquire(*conn_, "leader", "node-a", 300ms);
  ASSERT_TRUE(a);
  EXPECT_EQ(bump(*a), 1);
  ASSERT_TRUE(wait_expired("leader", 300ms));
  EXPECT_EQ(bump(*a), 0);  // expired, nobody took it yet: still refused
  const auto b = store_->acquire(*conn_, "leader", "node-b", 30s);
  ASSERT_TRUE(b);
  EXPECT_EQ(bump(*a), 0);
  EXPECT_EQ(bump(*b), 1);
  EXPECT_EQ(conn_->query("SELECT attempts FROM " + table_).at(0).get_int(0), 2);
}

// Node-side settings cannot move the lease clock: a session in another time zone neither steals
// a live lease nor sees a different expiry.
TEST_P(LeaseContract, ASessionInAnotherTimeZoneCannotStealALiveLease) {
  if (GetParam().name == "memory" || GetParam().name == "sqlite") {
    GTEST_SKIP() << "not on " << GetParam().name
                 << ": no session time zone (the test's clock, or the host's)";
  }
  const auto a = store_->acquire(*conn_, "leader", "node-a", 30s);
  ASSERT_TRUE(a);
  auto expires = store_->find(*conn_, "leader")->expires_at;
  for (const char* zone : {"+10:00", "-10:00"}) {
    auto skewed = connect_();
    if (GetParam().name == "postgres") {
      skewed->execute(std::string("SET TIME ZONE '") + (zone[0] == '+' ? "-10" : "+10") + "'");
    } else {
      skewed->execute(std::string("SET time_zone = '") + zone + "'");
    }
    EXPECT_FALSE(store_->acquire(*skewed, "leader", "node-b", 30s)) << zone;
    EXPECT_EQ(store_->find(*skewed, "leader")->expires_at, expires) << zone;
    EXPECT_TRUE(store_->find(*skewed, "leader")->live) << zone;
    EXPECT_TRUE(store_->renew(*skewed, *a, 30s)) << zone;
    expires = store_->find(*conn_, "leader")->expires_at;
    EXPECT_EQ(store_->find(*skewed, "leader")->expires_at, expires) << zone;
  }
}

// Found breaking leases: a table name past the 57 characters that fit with "_lease" was hashed as
// written, so `Orders_…` and `orders_…` (one table to PostgreSQL and SQLite) had two lease
// tables, two leaders and two fences.
TEST_P(LeaseContract, ATableNamedInAnotherCaseSharesItsLeaseTable) {
  if (GetParam().name != "sqlite" && GetParam().name != "postgres") {
    GTEST_SKIP() << "not on " << GetParam().name
                 << ": table names differ by case there (MariaDB on Linux), or none at all";
  }
  const std::string tail = "_" + std::string(52, 'x');
  auto lower_case = [](std::string s) {
    std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
    return s;
  };
  ASSERT_EQ(lower_case(sql::lease_table_name("Orders" + tail)),
            lower_case(sql::lease_table_name("orders" + tail)));
  const auto& dialect = engine_for(conn_->dialect()).dialect();
  create_schema_for(*conn_, "orders" + tail);
  sql::SqlLeaseStore lower(dialect, "orders" + tail);
  sql::SqlLeaseStore upper(dialect, "Orders" + tail);
  ASSERT_TRUE(lower.acquire(*conn_, "leader", "node-a", 30s));
  EXPECT_FALSE(upper.acquire(*conn_, "leader", "node-b", 30s));
  if (GetParam().name == "postgres") {
    conn_->execute("DROP TABLE " + sql::lease_table_name("orders" + tail));
    conn_->execute("DROP TABLE orders" + tail);
  }
}

TEST_P(LeaseContract, BadNamesAndTtlsAreRefused) {
  const std::vector<std::string> bad_names = {"", "has space", "trailing ", std::string(201, 'x'),
                                              "tab\t"};
  for (const auto& bad : bad_names) {
    EXPECT_THROW(store_->acquire(*conn_, bad, "node-a", 30s), std::invalid_argument) << bad;
    EXPECT_THROW(store_->acquire(*conn_, "leader", bad, 30s), std::invalid_argument) << bad;
  }
  EXPECT_THROW(store_->acquire(*conn_, "leader", "node-a", 0ms), std::invalid_argument);
  EXPECT_TRUE(store_->acquire(*conn_, std::string(200, 'n'), "node-a", 30s));
}

INSTANTIATE_TEST_SUITE_P(
    Engines, LeaseContract,
    ::testing::Values(
        testing::Engine{"memory", [] { return std::optional<std::string>(""); }},
        testing::Engine{"sqlite", [] { return std::optional<std::string>(""); }},
        testing::Engine{"postgres", [] { return testing::env("OUTBOX_TEST_PG_URL"); }},
        testing::Engine{"mysql", [] { return testing::env("OUTBOX_TEST_MYSQL_URL"); }}),
    testing::engine_name);

}  // namespace
}  // namespace outbox
