// One relay process draining two outbox tables, FlowCatalyst's shape: `outbox_events` and
// `outbox_dispatch_jobs`, each routed to its own HTTP endpoint, both with message groups under
// the same keys. Each endpoint gets only its table's events, in order per key; a group failing in
// one table blocks only that table's group; the admin API and the CLI act on the table named by
// ?table= / --table; the status and the metrics show both tables.

#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <map>
#include <mutex>
#include <regex>
#include <set>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/sql/lease_store.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/relay_cli.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/tables.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::RelayProcess;
using testing::run_cli;
using testing::wait_until;

constexpr int kGroups = 20;
constexpr int kPerGroup = 10;
const std::string kToken = "t0ken";

// What one endpoint received: per key, in arrival order; repeats of an event already seen are
// allowed (a re-send after a failure), a new event out of turn is a violation.
struct Received {
  std::mutex mutex;
  std::map<std::string, std::set<int>> seen;
  std::vector<std::string> violations;
  std::vector<std::string> foreign;  // bodies of the other table's events
  int poison = 0;

  void add(const std::string& body, const std::string& table) {
    // Field by field: PostgreSQL's jsonb reorders keys and adds spaces.
    static const std::regex kTable("\"t\":\\s*\"([a-z]+)\""), kGroup("\"g\":\\s*\"([^\"]*)\""),
        kNumber("\"n\":\\s*([0-9]+)");
    std::smatch t, g, n;
    std::lock_guard lock(mutex);
    if (body.find("poison") != std::string::npos) {
      ++poison;
      return;
    }
    if (!std::regex_search(body, t, kTable) || !std::regex_search(body, g, kGroup) ||
        !std::regex_search(body, n, kNumber)) {
      violations.push_back("not an event of this test: " + body.substr(0, 200));
      return;
    }
    if (t[1] != table) {
      foreign.push_back(body.substr(0, 200));
    }
    auto& s = seen[g[1]];
    const int number = std::stoi(n[1]);
    if (!s.contains(number)) {
      if (number != static_cast<int>(s.size())) {
        violations.push_back(std::string(g[1]) + ": " + std::to_string(number) + " after " +
                             std::to_string(s.size()));
      }
      s.insert(number);
    }
  }
  int complete() {
    std::lock_guard lock(mutex);
    int done = 0;
    for (const auto& [g, s] : seen) {
      done += s.size() == kPerGroup ? 1 : 0;
    }
    return done;
  }
  std::size_t keys() {
    std::lock_guard lock(mutex);
    return seen.size();
  }
  int poisoned() {
    std::lock_guard lock(mutex);
    return poison;
  }
};

class RelayTables : public testing::RelayDatabaseTest {
 protected:
  void SetUp() override {
    RelayDatabaseTest::SetUp();
    if (skipped_or_failed()) {
      return;
    }
    events_ = migrate_table("outbox_events", "outbox_events");
    jobs_ = migrate_table("outbox_dispatch_jobs", "outbox_dispatch_jobs");
    pool_ = open_pool(url_, 2);
    auto conn = pool_->acquire();
    stores_[events_] = detect_store(*conn, events_);
    stores_[jobs_] = detect_store(*conn, jobs_);
    events_http_.respond([this](const testing::ReceivedRequest& r, httplib::Response& res) {
      events_received_.add(r.body, "events");
      res.set_content("ok", "text/plain");
    });
    jobs_http_.respond([this](const testing::ReceivedRequest& r, httplib::Response& res) {
      if (r.body.find("poison") != std::string::npos) {
        jobs_received_.add(r.body, "jobs");
        res.status = 422;  // permanent: the event goes DEAD at once
        return;
      }
      if (failing_ && r.body.find("\"order-3\"") != std::string::npos) {
        res.status = 503;
        return;
      }
      jobs_received_.add(r.body, "jobs");
      res.set_content("ok", "text/plain");
    });
  }
  void TearDown() override {
    relay_.reset();
    RelayDatabaseTest::TearDown();
  }

  // database.table is the events table; the second route names the jobs table. `extra`: more
  // TOML tables.
  std::unique_ptr<RelayProcess> make_relay(const std::string& name, const std::string& extra = "") {
    std::string config = "[database]\nurl = \"" + url_ + "\"\ntable = \"" + events_ + "\"\n";
    config += "[poller]\ninterval = \"50ms\"\nowner = \"" + name + "\"\n" + extra;
    config += "[dispatcher]\nworkers = 8\nmax_attempts = 2\nbackoff_base = \"20ms\"\n";
    config += "backoff_max = \"50ms\"\n";
    config += "[admin]\nport = 0\ntoken = \"" + kToken + "\"\n";
    config += "[publishers.events]\ntype = \"http\"\n[publishers.jobs]\ntype = \"http\"\n";
    config +=
        "[[routes]]\npublisher = \"events\"\ntarget = \"" + events_http_.url("/events") + "\"\n";
    config += "[[routes]]\ntable = \"" + jobs_ + "\"\npublisher = \"jobs\"\ntarget = \"" +
              jobs_http_.url("/jobs") + "\"\n";
    return std::make_unique<RelayProcess>(dir_, config, name);
  }
  void start_relay() { relay_ = make_relay("relay-t"); }

  // Events without a group, one key each: {"t":…,"g":"<prefix><i>","n":0}.
  void write_plain(const std::string& prefix, int count) {
    auto conn = pool_->acquire();
    for (int i = 0; i < count; ++i) {
      for (const auto& [table, tag] : {std::pair{events_, "events"}, std::pair{jobs_, "jobs"}}) {
        stores_[table]->insert_new(
            *conn, EventEnvelope::builder(EventType::of("Plain"))
                       .payload_json("{\"t\":\"" + std::string(tag) + "\",\"g\":\"" + prefix +
                                     std::to_string(i) + "\",\"n\":0}")
                       .build());
      }
    }
  }

  // kGroups keys × kPerGroup events in each table, the same keys in both.
  void write_groups() {
    auto conn = pool_->acquire();
    for (int n = 0; n < kPerGroup; ++n) {
      for (int g = 0; g < kGroups; ++g) {
        const std::string key = "order-" + std::to_string(g);
        for (const auto& [table, tag] : {std::pair{events_, "events"}, std::pair{jobs_, "jobs"}}) {
          stores_[table]->insert_new(
              *conn, EventEnvelope::builder(EventType::of("OrderEvent"))
                         .message_group(key)
                         .payload_json("{\"t\":\"" + std::string(tag) + "\",\"g\":\"" + key +
                                       "\",\"n\":" + std::to_string(n) + "}")
                         .build());
        }
      }
    }
  }

  httplib::Result get(const std::string& path) {
    httplib::Client admin("127.0.0.1", admin_port_);
    return admin.Get(path, {{"Authorization", "Bearer " + kToken}});
  }
  httplib::Result post(const std::string& path) {
    httplib::Client admin("127.0.0.1", admin_port_);
    return admin.Post(path, httplib::Headers{{"Authorization", "Bearer " + kToken}}, "",
                      "text/plain");
  }

  std::string events_, jobs_;
  std::shared_ptr<sql::ConnectionPool> pool_;
  std::map<std::string, std::shared_ptr<OutboxStore>> stores_;
  testing::HttpTestServer events_http_, jobs_http_;
  Received events_received_, jobs_received_;
  std::atomic<bool> failing_{false};
  std::unique_ptr<RelayProcess> relay_;
  int admin_port_ = 0;
};

TEST_P(RelayTables, EachTableGoesToItsOwnEndpointInOrderPerKey) {
  write_groups();
  start_relay();
  admin_port_ = relay_->admin_port();
  ASSERT_TRUE(wait_until(
      [&] {
        return events_received_.complete() == kGroups && jobs_received_.complete() == kGroups;
      },
      120s))
      << relay_->log();
  EXPECT_NE(relay_->log().find("over 2 tables"), std::string::npos) << relay_->log();
  for (auto* r : {&events_received_, &jobs_received_}) {
    std::lock_guard lock(r->mutex);
    EXPECT_EQ(r->violations, std::vector<std::string>{});
    EXPECT_EQ(r->foreign, std::vector<std::string>{});
  }
  // The status names both tables with their own counts once the DONE marks are written.
  const std::string done = "\"done\":" + std::to_string(kGroups * kPerGroup);
  std::string status;
  EXPECT_TRUE(wait_until([&] {
    auto res = get("/api/status");
    status = res ? res->body : "";
    const auto tables = status.find("\"tables\":[");
    return tables != std::string::npos &&
           status.find("{\"table\":\"" + events_ + "\"," + "\"new\":0," + done, tables) !=
               std::string::npos &&
           status.find("{\"table\":\"" + jobs_ + "\"," + "\"new\":0," + done, tables) !=
               std::string::npos;
  })) << status;
  // Each table's partitions are leased in its own lease table; the metrics keep them apart.
  auto metrics = get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("outbox_lease_held{name=\"part:0\"} 1"), std::string::npos);
  EXPECT_NE(metrics->body.find("outbox_lease_held{name=\"" + jobs_ + "/part:0\"} 1"),
            std::string::npos);
  EXPECT_EQ(relay_->terminate(), 0);
}

TEST_P(RelayTables, AFailureInOneTableBlocksOnlyThatTablesGroup) {
  failing_ = true;
  write_groups();
  const auto poison = EventEnvelope::builder(EventType::of("Poison"))
                          .payload_json("{\"t\":\"jobs\",\"poison\":true}")
                          .build();
  stores_[jobs_]->insert_new(*pool_->acquire(), poison);
  start_relay();
  admin_port_ = relay_->admin_port();
  // order-3 of the events table is delivered; order-3 of the jobs table waits behind its head.
  ASSERT_TRUE(wait_until([&] {
    return events_received_.complete() == kGroups && jobs_received_.complete() == kGroups - 1 &&
           jobs_received_.poisoned() == 1;
  })) << relay_->log();
  std::string listed;
  ASSERT_TRUE(wait_until([&] {
    auto res = get("/api/groups?table=" + jobs_);
    listed = res ? res->body : "";
    return listed.find("\"blocked\":1") != std::string::npos;
  })) << listed;
  EXPECT_NE(listed.find("\"order-3\""), std::string::npos) << listed;
  auto events_groups = get("/api/groups");  // database.table: the events table
  ASSERT_TRUE(events_groups);
  EXPECT_NE(events_groups->body.find("\"blocked\":0"), std::string::npos) << events_groups->body;
  auto unknown = get("/api/groups?table=nope");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 400);
  EXPECT_NE(unknown->body.find("nope"), std::string::npos) << unknown->body;
  const std::string jobs_db = "--db '" + url_ + "' --table " + jobs_;
  EXPECT_NE(run_cli(dir_, "groups list " + jobs_db).out.find("order-3  BLOCKED"),
            std::string::npos);
  EXPECT_EQ(run_cli(dir_, "groups list --db '" + url_ + "' --table " + events_).out.find("BLOCKED"),
            std::string::npos);

  // The DEAD event is listed under its table, and replayed without naming it.
  std::string dead;
  ASSERT_TRUE(wait_until([&] {
    auto res = get("/api/dead?table=" + jobs_);
    dead = res ? res->body : "";
    return dead.find(poison.event_id()) != std::string::npos;
  })) << dead;
  auto events_dead = get("/api/dead");
  ASSERT_TRUE(events_dead);
  EXPECT_EQ(events_dead->body, "[]");
  auto replayed = post("/api/dead/" + poison.event_id() + "/replay");
  ASSERT_TRUE(replayed);
  EXPECT_EQ(replayed->status, 200) << replayed->body;
  EXPECT_TRUE(wait_until([&] { return jobs_received_.poisoned() == 2; }));

  // Retried through the API once the endpoint recovers: the jobs group finishes in order.
  failing_ = false;
  auto retried = post("/api/groups/order-3/retry?table=" + jobs_);
  ASSERT_TRUE(retried);
  EXPECT_EQ(retried->status, 200) << retried->body;
  EXPECT_NE(retried->body.find("\"table\":\"" + jobs_ + "\""), std::string::npos);
  ASSERT_TRUE(wait_until([&] { return jobs_received_.complete() == kGroups; }));
  std::lock_guard lock(jobs_received_.mutex);
  EXPECT_EQ(jobs_received_.violations, std::vector<std::string>{});
  EXPECT_EQ(jobs_received_.foreign, std::vector<std::string>{});
}

// A second table the relay cannot use is refused at start (its lease table gone: its groups would
// never move) and, when it goes away later, fails the readiness probe and shows as an error in the
// status, beside the other table's counts.
TEST_P(RelayTables, AnUnusableSecondTableIsRefusedAtStartAndReportedWhileRunning) {
  pool_->acquire()->execute("ALTER TABLE " + sql::lease_table_name(jobs_) + " RENAME TO " + jobs_ +
                            "_l_gone");
  auto refused = make_relay("relay-r");
  EXPECT_NE(refused->wait(), 0);
  EXPECT_NE(refused->log().find("lease or group-block table of '" + jobs_ + "'"), std::string::npos)
      << refused->log();
  pool_->acquire()->execute("ALTER TABLE " + jobs_ + "_l_gone RENAME TO " +
                            sql::lease_table_name(jobs_));

  start_relay();
  admin_port_ = relay_->admin_port();
  ASSERT_EQ(get("/readyz")->status, 200);
  pool_->acquire()->execute("ALTER TABLE " + jobs_ + " RENAME TO " + jobs_ + "_gone");
  EXPECT_EQ(get("/readyz")->status, 503);
  auto status = get("/api/status");
  ASSERT_TRUE(status);
  EXPECT_EQ(status->status, 200);
  EXPECT_NE(status->body.find("{\"table\":\"" + events_ + "\",\"new\":"), std::string::npos)
      << status->body;
  EXPECT_NE(status->body.find("{\"table\":\"" + jobs_ + "\",\"error\":"), std::string::npos)
      << status->body;
  pool_->acquire()->execute("ALTER TABLE " + jobs_ + "_gone RENAME TO " + jobs_);
  EXPECT_EQ(get("/readyz")->status, 200);
}

// Routes only on the second table: database.table (which subscriptions may still read) is
// purged of its old DONE rows all the same, and so is the second table.
TEST_P(RelayTables, PurgeReachesDatabaseTableWhenNoRouteTakesIt) {
  auto conn = pool_->acquire();
  const auto long_ago = Clock::system()->now() - std::chrono::hours(1);
  for (const auto& table : {events_, jobs_}) {
    for (int i = 0; i < 10; ++i) {
      const auto e = EventEnvelope::builder(EventType::of("Old")).payload_json("{}").build();
      stores_[table]->insert_new(*conn, e);
      stores_[table]->mark_done(*conn, e.event_id(), long_ago);
    }
  }
  std::string config = "[database]\nurl = \"" + url_ + "\"\ntable = \"" + events_ + "\"\n";
  config += "[purge]\nenabled = true\nretention = \"1s\"\ninterval = \"1s\"\n";
  config += "[admin]\nport = 0\n[publishers.jobs]\ntype = \"log\"\npath = \"/dev/null\"\n";
  config += "[[routes]]\ntable = \"" + jobs_ + "\"\npublisher = \"jobs\"\n";
  relay_ = std::make_unique<RelayProcess>(dir_, config, "relay-p");
  EXPECT_TRUE(wait_until([&] {
    return stores_[events_]->count_by_status(*conn)[1] == 0 &&
           stores_[jobs_]->count_by_status(*conn)[1] == 0;
  })) << relay_->log();
}

// Replay without a table replays the id in every table where it is DEAD.
TEST_P(RelayTables, AReplayWithoutATableReplaysTheIdInEveryTable) {
  const auto poison = EventEnvelope::builder(EventType::of("Poison"))
                          .payload_json("{\"t\":\"jobs\",\"poison\":true}")
                          .build();
  for (const auto& table : {events_, jobs_}) {
    stores_[table]->insert_new(*pool_->acquire(), poison);
  }
  auto conn = pool_->acquire();
  for (const auto& table : {events_, jobs_}) {
    stores_[table]->mark_dead(*conn, poison.event_id(), Clock::system()->now(), "test", false);
  }
  start_relay();
  admin_port_ = relay_->admin_port();
  auto replayed = post("/api/dead/" + poison.event_id() + "/replay");
  ASSERT_TRUE(replayed);
  EXPECT_EQ(replayed->body, "{\"replayed\":2}");
  // The jobs endpoint refuses it again (422): DEAD again in the jobs table.
  EXPECT_TRUE(wait_until([&] { return jobs_received_.poisoned() >= 1; }));
}

// Standby mode: the leader delivers both tables under its one lease, and a stop hands the lease
// over only after both have drained (the other relay takes over at once, long before the ttl,
// and delivers nothing twice).
TEST_P(RelayTables, AStandbyPairDeliversBothTablesAndHandsOverOnStop) {
  const std::string standby =
      "[relay]\nmode = \"standby\"\nlease_ttl = \"120s\"\nlease_renew = \"5s\"\n";
  auto first = make_relay("relay-a", standby);
  ASSERT_TRUE(wait_until([&] {
    return first->log().find("'leader' acquired by relay-a") != std::string::npos;
  })) << first->log();
  auto second = make_relay("relay-b", standby);
  second->admin_port();  // started, waiting for the lease
  write_plain("before-", 50);
  ASSERT_TRUE(wait_until([&] {
    return events_received_.keys() == 50 && jobs_received_.keys() == 50;
  })) << first->log();
  EXPECT_EQ(first->terminate(), 0);
  write_plain("after-", 50);
  ASSERT_TRUE(wait_until([&] {
    return events_received_.keys() == 100 && jobs_received_.keys() == 100;
  })) << second->log();
  EXPECT_EQ(events_http_.count(), 100u);  // nothing delivered twice
  EXPECT_EQ(jobs_http_.count(), 100u);
  EXPECT_EQ(second->terminate(), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, RelayTables, ::testing::Values("sqlite", "postgres", "mysql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace outbox
