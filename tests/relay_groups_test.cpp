// Message groups through relay processes (three; two on SQLite) on one database: writers in
// parallel write 1,000 groups × 50 events, half routed to Kafka (librdkafka's mock cluster, read
// back by a real consumer) and half to an HTTP endpoint; one relay is SIGKILLed midway. For every
// key each receiver sees the events in write order (a repeat only re-sends an event it already
// had), nothing is lost, and groups were in flight at once at the endpoint. Then a failing group:
// blocked, shown by `outbox groups list` and the admin API, unblocked by `outbox groups retry`.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <atomic>
#include <map>
#include <mutex>
#include <regex>
#include <set>
#include <thread>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/sql/group_store.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/sql/stream_store.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/kafka_mock.hpp"
#include "tests/support/relay_cli.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/tables.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::RelayProcess;
using testing::run_cli;
using testing::wait_until;

constexpr int kGroups = 1000;
constexpr int kPerGroup = 50;

// {"g":"key-12","n":7} (PostgreSQL's jsonb adds spaces) → ("key-12", 7).
std::pair<std::string, int> parse(const std::string& body) {
  static const std::regex kFields("\"g\":\\s*\"([^\"]*)\",\\s*\"n\":\\s*([0-9]+)");
  std::smatch m;
  if (!std::regex_search(body, m, kFields)) {
    ADD_FAILURE() << "not an event of this test: " << body.substr(0, 200);
    return {"", -1};
  }
  return {m[1], std::stoi(m[2])};
}

// Per key, in arrival order: a new event must be the next one (all before it seen); an event seen
// before is a repeat.
struct OrderCheck {
  std::map<std::string, std::set<int>> seen;
  std::vector<std::string> violations;
  int repeats = 0;
  void add(const std::string& group, int n) {
    auto& s = seen[group];
    if (s.contains(n)) {
      ++repeats;
      return;
    }
    if (n != static_cast<int>(s.size())) {
      violations.push_back(group + ": " + std::to_string(n) + " after " + std::to_string(s.size()) +
                           " events");
    }
    s.insert(n);
  }
  std::size_t complete() const {
    std::size_t done = 0;
    for (const auto& [g, s] : seen) {
      done += s.size() == kPerGroup ? 1 : 0;
    }
    return done;
  }
};

class RelayGroups : public testing::RelayDatabaseTest {
 protected:
  void SetUp() override {
    RelayDatabaseTest::SetUp();
    if (skipped_or_failed()) {
      return;
    }
    table_ = migrate_table("groups");
    pool_ = open_pool(url_, 8);
    auto conn = pool_->acquire();
    store_ = detect_store(*conn, table_);
    kafka_.create_topic("orders", 8);
    // The endpoint: records each body and how many requests are in flight at once.
    http_.respond([this](const testing::ReceivedRequest& r, httplib::Response& res) {
      const int now = ++in_flight_;
      int most = most_in_flight_.load();
      while (now > most && !most_in_flight_.compare_exchange_weak(most, now)) {
      }
      std::this_thread::sleep_for(200us);  // the endpoint's own work, so requests can overlap
      {
        std::lock_guard lock(mutex_);
        if (fail_group_.empty() || r.body.find("\"" + fail_group_ + "\"") == std::string::npos) {
          const auto [g, n] = parse(r.body);
          http_order_.add(g, n);
          res.set_content("ok", "text/plain");
        } else {
          res.status = 503;
        }
      }
      --in_flight_;
    });
  }
  void TearDown() override {
    relays_.clear();
    RelayDatabaseTest::TearDown();
  }

  void start_relay(const std::string& name) {
    std::string config = "[database]\nurl = \"" + url_ + "\"\ntable = \"" + table_ + "\"\n";
    config += "[poller]\ninterval = \"50ms\"\nbatch = 500\nowner = \"" + name + "\"\n";
    config += "[dispatcher]\nworkers = 16\nbatch = 50\nqueue = 4000\nmax_attempts = 3\n";
    config += "backoff_base = \"20ms\"\nbackoff_max = \"100ms\"\ndrain_timeout = \"5s\"\n";
    config += "[relay]\nlease_ttl = \"2s\"\nlease_renew = \"400ms\"\n";
    config += "[groups]\nmax_concurrent_groups = 32\n";
    config += "[admin]\nport = 0\n";
    config += "[publishers.kafka]\ntype = \"kafka\"\nbrokers = \"" + kafka_.bootstraps() + "\"\n";
    config += "[publishers.hooks]\ntype = \"http\"\n";
    config += "[[routes]]\nevent_type = \"K\"\npublisher = \"kafka\"\ntarget = \"orders\"\n";
    config += "[[routes]]\nevent_type = \"H\"\npublisher = \"hooks\"\ntarget = \"" +
              http_.url("/hooks") + "\"\n";
    relays_[name] = std::make_unique<RelayProcess>(dir_, config, name);
  }

  // Writers in parallel, each group from one writer in order (one transaction per event).
  void write_groups() {
    std::vector<std::thread> writers;
    for (int w = 0; w < 4; ++w) {
      writers.emplace_back([this, w] {
        auto pool = open_pool(url_, 1);
        for (int g = w; g < kGroups; g += 4) {
          const std::string key = "key-" + std::to_string(g);
          for (int n = 0; n < kPerGroup; ++n) {
            auto e = EventEnvelope::builder(EventType::of(g % 2 == 0 ? "K" : "H"))
                         .message_group(key)
                         .payload_json("{\"g\":\"" + key + "\",\"n\":" + std::to_string(n) + "}")
                         .build();
            store_->insert_new(*pool->acquire(), e);
          }
        }
      });
    }
    for (auto& t : writers) {
      t.join();
    }
  }
  std::size_t http_complete() {
    std::lock_guard lock(mutex_);
    return http_order_.complete();
  }

  std::string table_;
  std::shared_ptr<sql::ConnectionPool> pool_;
  std::shared_ptr<OutboxStore> store_;
  testing::KafkaMockCluster kafka_;
  testing::HttpTestServer http_;
  std::map<std::string, std::unique_ptr<RelayProcess>> relays_;
  std::mutex mutex_;  // guards http_order_, fail_group_
  OrderCheck http_order_;
  std::string fail_group_;
  std::atomic<int> in_flight_{0};
  std::atomic<int> most_in_flight_{0};
};

TEST_P(RelayGroups, EveryKeyInOrderThroughKafkaAndHttpWhileARelayIsKilled) {
  const int relays = GetParam() == "sqlite" ? 2 : 3;
  for (int i = 0; i < relays; ++i) {
    start_relay("relay-" + std::to_string(i));
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::thread writer([this] { write_groups(); });
  // Killed once it has delivered some: its partitions move after the lease ttl.
  ASSERT_TRUE(wait_until([&] { return http_.count() > 2000; }, 120s));
  relays_["relay-0"]->signal_when_started(SIGKILL);
  writer.join();
  ASSERT_TRUE(wait_until([&] { return http_complete() == kGroups / 2; }, 300s))
      << http_complete() << " of " << kGroups / 2 << " HTTP groups complete";
  const auto elapsed = std::chrono::steady_clock::now() - t0;
  // Until every event arrived once (repeats come on top).
  const auto messages = testing::consume_until(
      kafka_.bootstraps(), {"orders"},
      [](const std::vector<testing::ConsumedMessage>& got) {
        if (got.size() < static_cast<std::size_t>(kGroups / 2 * kPerGroup)) {
          return false;
        }
        std::set<std::string> unique;
        for (const auto& m : got) {
          unique.insert(m.value);
        }
        return unique.size() == static_cast<std::size_t>(kGroups / 2 * kPerGroup);
      },
      120s);
  OrderCheck kafka_order;
  std::map<std::string, int> partition_of;
  for (const auto& m : messages) {
    const auto [g, n] = parse(m.value);
    kafka_order.add(g, n);
    EXPECT_EQ(m.key, g);  // the group is the message key: one Kafka partition per group
    auto [it, fresh] = partition_of.emplace(g, m.partition);
    EXPECT_EQ(it->second, m.partition) << g;
  }
  EXPECT_EQ(kafka_order.complete(), static_cast<std::size_t>(kGroups / 2));
  EXPECT_EQ(kafka_order.violations, std::vector<std::string>{});
  {
    std::lock_guard lock(mutex_);
    EXPECT_EQ(http_order_.violations, std::vector<std::string>{});
    std::printf(
        "[ figures ] %s: %d events in %d groups through %d relays (one SIGKILLed) in %.1f s; "
        "repeats: http %d, kafka %d; most HTTP requests in flight at once: %d\n",
        GetParam().c_str(), kGroups * kPerGroup, kGroups, relays,
        std::chrono::duration<double>(elapsed).count(), http_order_.repeats, kafka_order.repeats,
        most_in_flight_.load());
  }
  EXPECT_GT(most_in_flight_.load(), 1) << "groups never ran in parallel";
}

TEST_P(RelayGroups, AFailingGroupIsBlockedShownAndRetriedByAnOperator) {
  {
    std::lock_guard lock(mutex_);
    fail_group_ = "key-1";
  }
  start_relay("relay-a");
  auto pool = open_pool(url_, 1);
  for (int g = 1; g <= 5; g += 2) {  // HTTP groups key-1, key-3, key-5
    for (int n = 0; n < kPerGroup; ++n) {
      const std::string key = "key-" + std::to_string(g);
      store_->insert_new(*pool->acquire(), EventEnvelope::builder(EventType::of("H"))
                                               .message_group(key)
                                               .payload_json("{\"g\":\"" + key +
                                                             "\",\"n\":" + std::to_string(n) + "}")
                                               .build());
    }
  }
  ASSERT_TRUE(wait_until([&] { return http_complete() == 2; }, 60s)) << relays_["relay-a"]->log();
  const std::string db = "--db '" + url_ + "' --table " + table_;
  ASSERT_TRUE(wait_until([&] {
    return run_cli(dir_, "groups list " + db).out.find("key-1  BLOCKED") != std::string::npos;
  }));
  const auto shown = run_cli(dir_, "groups show key-1 " + db);
  EXPECT_NE(shown.out.find("\"pending\":50"), std::string::npos) << shown.out;
  EXPECT_NE(shown.out.find("\"attempts\":3"), std::string::npos) << shown.out;
  httplib::Client admin("127.0.0.1", relays_["relay-a"]->admin_port());
  auto listed = admin.Get("/api/groups");
  ASSERT_TRUE(listed);
  EXPECT_EQ(listed->status, 200);
  EXPECT_NE(listed->body.find("\"blocked\":1"), std::string::npos) << listed->body;
  EXPECT_EQ(admin.Post("/api/groups/key-1/retry")->status, 403);  // no token configured
  // `outbox status` names the blocked group count and sums the 64 partition leases per holder.
  const auto status = run_cli(dir_, "status " + db);
  EXPECT_NE(status.out.find("blocked message groups: 1"), std::string::npos) << status.out;
  EXPECT_NE(status.out.find("message-group partitions  64 held by relay-a"), std::string::npos)
      << status.out;
  auto metrics = admin.Get("/metrics");
  EXPECT_NE(metrics->body.find("outbox_groups_blocked 1"), std::string::npos);
  {
    std::lock_guard lock(mutex_);
    fail_group_.clear();
  }
  const auto retried = run_cli(dir_, "groups retry key-1 " + db);
  EXPECT_EQ(retried.exit_code, 0) << retried.err;
  ASSERT_TRUE(wait_until([&] { return http_complete() == 3; }, 60s));
  std::lock_guard lock(mutex_);
  EXPECT_EQ(http_order_.violations, std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(Engines, RelayGroups, ::testing::Values("sqlite", "postgres", "mysql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace outbox
