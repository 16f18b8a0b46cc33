// Several processes in multi_node mode on one PostgreSQL or MariaDB database, and a writer killed
// with SIGKILL in the middle of a stream of transactions.

#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iostream>
#include <set>

#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/sql/connection.hpp"
#include "tests/support/process.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;

struct Engine {
  std::string name;
  const char* url_variable;
};

class MultiNode : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    auto url = testing::env(GetParam().url_variable);
    OUTBOX_REQUIRE_SERVER(url, GetParam().name);
    url_ = *url;
    mysql_ = GetParam().name == "mysql";
    conn_ = mysql_ ? mysql::connect(url_) : postgres::connect(url_);
    table_ = testing::unique_table("nodes");
    ledger_ = table_ + "_ledger";
    if (mysql_) {
      mysql::create_schema(*conn_, table_);
    } else {
      postgres::create_schema(*conn_, table_);
    }
    conn_->execute("CREATE TABLE " + ledger_ +
                   " (event_id VARCHAR(64) NOT NULL, node VARCHAR(64) NOT NULL)");
  }
  void TearDown() override {
    if (conn_) {
      conn_->execute("DROP TABLE IF EXISTS " + table_);
      conn_->execute("DROP TABLE IF EXISTS " + ledger_);
    }
  }

  std::int64_t scalar(const std::string& sql) { return conn_->query(sql, {}).at(0).get_int(0); }
  std::vector<std::string> node_args(const std::string& node, int events, int lock_ms,
                                     const std::string& rollback_file = {}) {
    std::vector<std::string> args{
        OUTBOX_TEST_NODE_PATH,  url_, table_, ledger_, node, std::to_string(events), "5",
        std::to_string(lock_ms)};
    if (!rollback_file.empty()) {
      args.push_back(rollback_file);
    }
    return args;
  }

  std::string url_;
  bool mysql_ = false;
  std::unique_ptr<sql::Connection> conn_;
  std::string table_;
  std::string ledger_;
};

TEST_P(MultiNode, ThreeProcessesDeliverEveryEventExactlyOnce) {
  constexpr int kPerNode = 16667;
  constexpr int kTotal = 3 * kPerNode;  // 50,001
  const auto start = std::chrono::steady_clock::now();
  std::vector<pid_t> nodes;
  for (int n = 0; n < 3; ++n) {
    nodes.push_back(testing::spawn(node_args("node-" + std::to_string(n), kPerNode, 30000)));
  }
  for (pid_t pid : nodes) {
    EXPECT_EQ(testing::wait_exit(pid, 900s), std::optional<int>(0));
  }
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto done = scalar("SELECT COUNT(*) FROM " + table_ + " WHERE status = 1");
  const auto deliveries = scalar("SELECT COUNT(*) FROM " + ledger_);
  const auto distinct = scalar("SELECT COUNT(DISTINCT event_id) FROM " + ledger_);
  std::cout << "[ figures  ] " << GetParam().name << ": " << kTotal << " events, 3 processes, "
            << deliveries - distinct << " duplicates, " << secs << " s\n";
  EXPECT_EQ(done, kTotal);
  EXPECT_EQ(distinct, kTotal);
  EXPECT_EQ(deliveries, kTotal) << "some events were delivered more than once";
}

TEST_P(MultiNode, KilledWriterLosesNothingCommittedAndDeliversNothingRolledBack) {
  testing::TempDir dir;
  const auto rolled_back_file = dir.file("rolled-back");
  const int lock_ms = 2000;
  const pid_t victim = testing::spawn(node_args("victim", 1000000, lock_ms, rolled_back_file));
  // Let it commit a good number of transactions, then kill it mid-stream.
  ASSERT_TRUE(
      testing::wait_until([&] { return scalar("SELECT COUNT(*) FROM " + table_) >= 3000; }, 120s));
  testing::kill_hard(victim);
  const auto committed = scalar("SELECT COUNT(*) FROM " + table_);
  const auto held_by_victim =
      scalar("SELECT COUNT(*) FROM " + table_ + " WHERE locked_by = 'victim' AND status IN (0, 2)");

  const auto start = std::chrono::steady_clock::now();
  const pid_t rescuer = testing::spawn(node_args("rescuer", 0, lock_ms));
  EXPECT_EQ(testing::wait_exit(rescuer, 600s), std::optional<int>(0));
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();

  EXPECT_EQ(scalar("SELECT COUNT(*) FROM " + table_ + " WHERE status <> 1"), 0);
  EXPECT_EQ(scalar("SELECT COUNT(*) FROM " + table_ + " t WHERE NOT EXISTS (SELECT 1 FROM " +
                   ledger_ + " l WHERE l.event_id = t.event_id)"),
            0)
      << "a committed event was never delivered";
  std::set<std::string> rolled_back;
  std::ifstream in(rolled_back_file);
  for (std::string id; std::getline(in, id);) {
    rolled_back.insert(id);
  }
  ASSERT_FALSE(rolled_back.empty());
  int leaked = 0;
  for (const auto& id : rolled_back) {
    const std::string p = mysql_ ? "?" : "$1";
    leaked +=
        static_cast<int>(conn_
                             ->query("SELECT COUNT(*) FROM " + ledger_ + " WHERE event_id = " + p,
                                     {sql::TextRef{id}})
                             .at(0)
                             .get_int(0));
  }
  EXPECT_EQ(leaked, 0) << "a rolled-back event was delivered";
  const auto by_rescuer = scalar("SELECT COUNT(*) FROM " + ledger_ + " WHERE node = 'rescuer'");
  if (held_by_victim > 0) {
    EXPECT_GT(by_rescuer, 0) << "the victim's claims were not taken over after lock expiry";
  }
  const auto deliveries = scalar("SELECT COUNT(*) FROM " + ledger_);
  const auto distinct = scalar("SELECT COUNT(DISTINCT event_id) FROM " + ledger_);
  std::cout << "[ figures  ] " << GetParam().name << ": " << committed
            << " committed before SIGKILL, " << rolled_back.size() << " rolled back (0 delivered), "
            << held_by_victim << " pending rows claimed by the dead writer, " << by_rescuer
            << " delivered by the fresh process in " << secs << " s, " << deliveries - distinct
            << " redeliveries\n";
}

INSTANTIATE_TEST_SUITE_P(Engines, MultiNode,
                         ::testing::Values(Engine{"postgres", "OUTBOX_TEST_PG_URL"},
                                           Engine{"mysql", "OUTBOX_TEST_MYSQL_URL"}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace outbox
