// Subscriptions in `outbox relay` processes on every engine: managed over the admin API, the CLI
// and plain SQL (pause, resume, rewind, FAILED and reset, the token), and spread over two relays
// where one is SIGKILLed (its subscriptions move; every event still reaches every subscription).

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <fstream>
#include <map>
#include <set>
#include <thread>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/sql/stream_store.hpp"
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

class RelayStream : public ::testing::TestWithParam<testing::Engine> {
 protected:
  void SetUp() override {
    const auto url = GetParam().url();
    OUTBOX_REQUIRE_SERVER(url, GetParam().name);
    url_ = GetParam().name == "sqlite" ? "sqlite://" + dir_.file("stream.db") : *url;
    table_ = GetParam().name == "sqlite" ? "outbox_event" : testing::unique_table("relaystream");
    const auto migrated = run_cli(dir_, "migrate --db '" + url_ + "' --table " + table_);
    ASSERT_EQ(migrated.exit_code, 0) << migrated.err;
    pool_ = open_pool(url_, 2);
    auto conn = pool_->acquire();
    store_ = detect_store(*conn, table_);
    stream_ = detect_stream_store(*conn, table_);
    leases_ = detect_lease_store(*conn, table_);
  }
  void TearDown() override {
    relays_.clear();
    if (pool_ && GetParam().name != "sqlite") {
      testing::drop_outbox_tables(*pool_->acquire(), table_);
    }
  }
  std::string cli(const std::string& args) {
    return args + " --db '" + url_ + "' --table " + table_;
  }
  std::string base_config(const std::string& owner) {
    return "[database]\nurl = \"" + url_ + "\"\ntable = \"" + table_ + "\"\n[poller]\nowner = \"" +
           owner +
           "\"\n[relay]\nlease_ttl = \"2s\"\nlease_renew = \"400ms\"\n"
           "[admin]\nport = 0\ntoken = \"t0k\"\n"
           "[publishers.hooks]\ntype = \"http\"\n";
  }
  static std::string subscription(const std::string& name, const std::string& target,
                                  const std::string& extra = "") {
    return "[[subscriptions]]\nname = \"" + name + "\"\npublisher = \"hooks\"\ntarget = \"" +
           target + "\"\ninterval = \"50ms\"\nretry_base = \"20ms\"\nretry_max = \"100ms\"\n" +
           extra;
  }
  void write(int from, int n) {
    auto conn = pool_->acquire();
    std::vector<EventEnvelope> batch;
    for (int i = from; i < from + n; ++i) {
      batch.push_back(EventEnvelope::builder(EventType::of("Thing"))
                          .event_id("ev-" + std::to_string(i))
                          .tag("n", std::to_string(i))
                          .payload_json("{\"n\":" + std::to_string(i) + "}")
                          .build());
    }
    conn->begin();
    store_->insert_batch(*conn, batch);
    conn->commit();
  }
  bool caught_up(const std::string& name) {
    auto conn = pool_->acquire();
    const auto st = stream_->find(*conn, name);
    return st && stream_->lag(*conn, st->cursor).events == 0 &&
           stream_->head(*conn) != StreamPosition{};
  }
  // Event ids received on `path`, in arrival order.
  std::vector<std::string> received(const std::string& path) {
    std::vector<std::string> out;
    for (const auto& r : http_.received()) {
      if (r.path == path) {
        out.push_back(r.header("X-Outbox-Event-Id"));
      }
    }
    return out;
  }
  httplib::Result api(int port, const std::string& method, const std::string& path,
                      bool token = true) {
    httplib::Client c("127.0.0.1", port);
    httplib::Headers h;
    if (token) {
      h.emplace("Authorization", "Bearer t0k");
    }
    return method == "GET" ? c.Get(path, h) : c.Post(path, h, "", "text/plain");
  }

  testing::TempDir dir_;
  testing::HttpTestServer http_;
  std::string url_, table_;
  std::shared_ptr<sql::ConnectionPool> pool_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<StreamStore> stream_;
  std::shared_ptr<LeaseStore> leases_;
  std::map<std::string, std::unique_ptr<RelayProcess>> relays_;
};

TEST_P(RelayStream, ManagedOverTheAdminApiTheCliAndPlainSql) {
  const std::string config =
      base_config("r1") + subscription("hooks", http_.url("/s/{event_type}"), "max_errors = 2\n") +
      subscription("mirror", http_.url("/mirror"));
  relays_["r1"] = std::make_unique<RelayProcess>(dir_, config, "r1");
  const int port = relays_["r1"]->admin_port();
  write(0, 3);
  ASSERT_TRUE(wait_until([&] { return received("/s/Thing").size() == 3; }));
  EXPECT_EQ(received("/s/Thing"), (std::vector<std::string>{"ev-0", "ev-1", "ev-2"}));

  // Reading needs the token when one is set; so does every action.
  EXPECT_EQ(api(port, "GET", "/api/subscriptions", false)->status, 401);
  auto list = api(port, "GET", "/api/subscriptions");
  ASSERT_EQ(list->status, 200);
  EXPECT_NE(list->body.find("\"name\":\"hooks\""), std::string::npos) << list->body;
  EXPECT_NE(list->body.find("\"holder\":\"r1\""), std::string::npos) << list->body;
  EXPECT_EQ(api(port, "POST", "/api/subscriptions/hooks/pause", false)->status, 401);
  auto paused = api(port, "POST", "/api/subscriptions/hooks/pause");
  ASSERT_EQ(paused->status, 200) << paused->body;
  EXPECT_NE(paused->body.find("\"status\":\"PAUSED\""), std::string::npos);

  // Paused: the other subscription goes on, this one waits.
  write(3, 1);
  ASSERT_TRUE(wait_until([&] { return received("/mirror").size() == 4; }));
  ASSERT_TRUE(wait_until([&] { return caught_up("mirror"); }));
  EXPECT_EQ(received("/s/Thing").size(), 3u);
  const auto resumed = run_cli(dir_, cli("subscriptions resume hooks"));
  ASSERT_EQ(resumed.exit_code, 0) << resumed.err;
  ASSERT_TRUE(wait_until([&] { return received("/s/Thing").size() == 4; }));

  // Rewound to the start, it delivers everything again, in order.
  ASSERT_EQ(api(port, "POST", "/api/subscriptions/hooks/rewind?to=start")->status, 200);
  ASSERT_TRUE(wait_until([&] { return received("/s/Thing").size() == 8; }));
  const auto again = received("/s/Thing");
  EXPECT_EQ(std::vector<std::string>(again.begin() + 4, again.end()),
            (std::vector<std::string>{"ev-0", "ev-1", "ev-2", "ev-3"}));

  // A failing endpoint: FAILED after max_errors, the error kept; reset by SQL once it is back.
  http_.respond([](const testing::ReceivedRequest& r, httplib::Response& res) {
    if (r.path != "/mirror") {
      res.status = 500;
      res.set_content("endpoint broken", "text/plain");
    }
  });
  write(4, 1);
  ASSERT_TRUE(wait_until([&] {
    return stream_->find(*pool_->acquire(), "hooks")->status == SubscriptionStatus::Failed;
  }));
  const auto failed = api(port, "GET", "/api/subscriptions/hooks");
  ASSERT_EQ(failed->status, 200);
  EXPECT_NE(failed->body.find("\"status\":\"FAILED\""), std::string::npos) << failed->body;
  EXPECT_NE(failed->body.find("500"), std::string::npos) << failed->body;
  EXPECT_EQ(api(port, "POST", "/api/subscriptions/hooks/resume")->status, 409);
  EXPECT_EQ(api(port, "POST", "/api/subscriptions/hooks/rewind?to=yesterday")->status, 400);
  EXPECT_EQ(api(port, "POST", "/api/subscriptions/nobody/pause")->status, 404);
  EXPECT_EQ(api(port, "GET", "/api/subscriptions/hooks/pause")->status, 405);
  EXPECT_EQ(api(port, "POST", "/api/subscriptions/hooks/rewind?to=1000000")->status, 400);
  EXPECT_EQ(api(port, "GET", "/api/subscriptions/a%20b")->status, 400);
  EXPECT_EQ(api(port, "GET", "/api/subscriptions/a%00b")->status, 400);
  http_.respond(nullptr);
  pool_->acquire()->execute("UPDATE " + sql::subscription_table_name(table_) +
                            " SET status = 'ACTIVE', error_count = 0 WHERE name = 'hooks'");
  ASSERT_TRUE(wait_until([&] {
    const auto got = received("/s/Thing");
    return !got.empty() && got.back() == "ev-4";
  }));
  const auto listed = run_cli(dir_, cli("subscriptions list"));
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("hooks"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("ACTIVE"), std::string::npos) << listed.out;
  EXPECT_EQ(relays_["r1"]->terminate(), 0);
}

TEST_P(RelayStream, SubscriptionsSpreadOverTwoRelaysAndMoveWhenOneIsKilled) {
  std::string subs;
  for (int i = 0; i < 4; ++i) {
    subs +=
        subscription("s" + std::to_string(i), http_.url("/s" + std::to_string(i)), "batch = 50\n");
  }
  relays_["r1"] = std::make_unique<RelayProcess>(dir_, base_config("r1") + subs, "r1");
  relays_["r2"] = std::make_unique<RelayProcess>(dir_, base_config("r2") + subs, "r2");
  auto holders = [&] {
    std::map<std::string, int> count;
    for (int i = 0; i < 4; ++i) {
      const auto info = leases_->find(*pool_->acquire(), "sub:s" + std::to_string(i));
      if (info && info->live && info->owner) {
        ++count[*info->owner];
      }
    }
    return count;
  };
  ASSERT_TRUE(wait_until([&] {
    const auto h = holders();
    return h.size() == 2 && h.begin()->second == 2;
  })) << "the subscriptions were not shared out";
  // A slow endpoint, so the kill lands while batches are in flight.
  http_.respond([](const testing::ReceivedRequest&, httplib::Response& res) {
    std::this_thread::sleep_for(2ms);
    res.set_content("ok", "text/plain");
  });
  write(0, 300);
  ASSERT_TRUE(wait_until([&] { return received("/s0").size() + received("/s1").size() > 100; }));
  relays_["r1"]->signal_when_started(SIGKILL);
  relays_["r1"]->wait();
  write(300, 300);
  ASSERT_TRUE(wait_until(
      [&] {
        return holders() == std::map<std::string, int>{{"r2", 4}};
      },
      60s))
      << "r2 did not take over";
  // Every row is readable first: on MariaDB rows join the stream when a sequencer numbers them,
  // and the sequencer's lease moves from the killed relay on its own (it may come after the
  // subscriptions', which are then caught up with a shorter stream).
  ASSERT_TRUE(wait_until(
      [&] { return stream_->lag(*pool_->acquire(), StreamPosition{}).events == 600; }, 60s));
  for (int i = 0; i < 4; ++i) {
    ASSERT_TRUE(wait_until([&] { return caught_up("s" + std::to_string(i)); }, 60s));
  }
  // Every event reached every subscription; repeats are bounded by a batch in flight at the kill.
  for (int i = 0; i < 4; ++i) {
    const auto got = received("/s" + std::to_string(i));
    std::set<std::string> distinct(got.begin(), got.end());
    EXPECT_EQ(distinct.size(), 600u) << "s" << i;
    EXPECT_LE(got.size() - distinct.size(), 50u) << "s" << i;
    std::printf("s%d: %zu deliveries of 600 events (%zu repeated)\n", i, got.size(),
                got.size() - distinct.size());
  }
  EXPECT_EQ(relays_["r2"]->terminate(), 0);
  // Stopped, the relay handed its subscriptions back at once.
  EXPECT_TRUE(holders().empty());
}

TEST_P(RelayStream, ClaimModeAndStreamModeShareATableAndAHeldBackStreamShowsInMetrics) {
  const std::string config = base_config("r1") + "[[routes]]\npublisher = \"hooks\"\ntarget = \"" +
                             http_.url("/route") + "\"\n" + subscription("sub", http_.url("/sub"));
  relays_["r1"] = std::make_unique<RelayProcess>(dir_, config, "r1");
  const int port = relays_["r1"]->admin_port();
  write(0, 5);
  ASSERT_TRUE(wait_until([&] { return received("/route").size() == 5; }));
  ASSERT_TRUE(wait_until([&] { return received("/sub").size() == 5; }));
  // The route marks its rows DONE (in batches); the subscription's cursor is apart from that.
  EXPECT_TRUE(wait_until([&] { return store_->count_by_status(*pool_->acquire())[1] == 5; }));
  if (GetParam().name == "postgres") {
    // An open transaction that wrote holds the stream (not the claims) back, and says so.
    auto open = open_pool(url_, 1);
    auto held = open->acquire();
    held->begin();
    store_->insert_new(*held, EventEnvelope::of_json(EventType::of("Held"), "{}"));
    write(5, 1);
    ASSERT_TRUE(wait_until([&] { return received("/route").size() == 6; }));
    std::string metrics;
    ASSERT_TRUE(wait_until(
        [&] {
          metrics = api(port, "GET", "/metrics")->body;
          return metrics.find("outbox_stream_holdback_seconds 0\n") == std::string::npos &&
                 metrics.find("outbox_stream_holdback_seconds") != std::string::npos;
        },
        30s))
        << metrics;
    EXPECT_EQ(received("/sub").size(), 5u);
    const auto file = dir_.file("metrics.txt");
    std::ofstream(file) << metrics;
    EXPECT_EQ(std::system(("promtool check metrics < " + file).c_str()), 0);
    held->rollback();
  } else {
    write(5, 1);
  }
  ASSERT_TRUE(wait_until([&] { return received("/sub").size() == 6; }));
  EXPECT_EQ(received("/sub").back(), "ev-5");
  const auto status = run_cli(dir_, cli("stream status --json"));
  ASSERT_EQ(status.exit_code, 0) << status.err;
  EXPECT_NE(status.out.find("\"name\":\"sub\""), std::string::npos) << status.out;
  EXPECT_EQ(relays_["r1"]->terminate(), 0);
}

TEST_P(RelayStream, APurgeWithoutRoutesKeepsWhatANewSubscriptionWillRead) {
  // Old rows, past the retention, before the relay (and its subscription) ever started.
  {
    auto conn = pool_->acquire();
    for (int i = 0; i < 5; ++i) {
      store_->insert_new(*conn, EventEnvelope::builder(EventType::of("Old"))
                                    .event_id("old-" + std::to_string(i))
                                    .occurred_at(std::chrono::system_clock::now() - 2h)
                                    .payload_json("{}")
                                    .build());
    }
  }
  const std::string config = base_config("r1") +
                             "[purge]\nenabled = true\ninclude_pending = true\nretention = \"1h\"\n"
                             "interval = \"1s\"\n" +
                             subscription("late-comer", http_.url("/late"));
  relays_["r1"] = std::make_unique<RelayProcess>(dir_, config, "r1");
  ASSERT_TRUE(wait_until([&] { return received("/late").size() == 5; }));
  // Read by every subscription, they go at the next purge.
  ASSERT_TRUE(wait_until([&] { return store_->count_by_status(*pool_->acquire())[0] == 0; }));
  EXPECT_EQ(relays_["r1"]->terminate(), 0);
}

TEST_P(RelayStream, RowsWrittenWithSqlThatCannotRunAreListedWithTheReasonNotHidden) {
  ASSERT_EQ(run_cli(dir_, cli("subscriptions add good --publisher hooks")).exit_code, 0);
  const auto table = sql::subscription_table_name(table_);
  auto conn = pool_->acquire();
  conn->execute("INSERT INTO " + table +
                " (name, filter, publisher, target) VALUES ('bad name', '{}', 'hooks', '')");
  conn->execute("INSERT INTO " + table +
                " (name, filter, publisher, target) VALUES ('bad-filter', '[1]', 'hooks', '')");
  const auto listed = run_cli(dir_, cli("subscriptions list"));
  ASSERT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("good"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("not run: name"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find("not run: filter column"), std::string::npos) << listed.out;
  const auto json = run_cli(dir_, cli("status --json"));
  ASSERT_EQ(json.exit_code, 0) << json.err;
  EXPECT_NE(json.out.find("\"problem\":\"filter column"), std::string::npos) << json.out;
}

INSTANTIATE_TEST_SUITE_P(Engines, RelayStream, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
