// The `outbox` command as a separate process against real parts: SQLite files and PostgreSQL,
// librdkafka's mock cluster, a real HTTP server, the admin API and promtool.

#include <gtest/gtest.h>
#include <signal.h>

#include <condition_variable>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>

#include "outbox/detect/detect.hpp"
#include "outbox/kafka/publisher.hpp"
#include "outbox/metrics.hpp"
#include "outbox/outbox.hpp"
#include "outbox/trace_context.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/kafka_mock.hpp"
#include "tests/support/process.hpp"
#include "tests/support/relay_cli.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::CommandResult;
using testing::MigratedSqlite;
using testing::read_file;
using testing::RelayProcess;
using testing::run_cli;
using testing::wait_until;

// A valid W3C traceparent whose trace id ends with `seq`.
std::string traceparent(int seq) {
  const std::string n = std::to_string(seq);
  return "00-4bf92f3577b34da6a3ce9" + std::string(11 - n.size(), '0') + n + "-00f067aa0ba902b7-01";
}

EventEnvelope event(const std::string& type, const std::string& aggregate_type,
                    const std::string& aggregate_id, int seq) {
  return EventEnvelope::builder(EventType::of(type))
      .aggregate_type(AggregateType::of(aggregate_type))
      .aggregate_id(aggregate_id)
      .header("traceparent", traceparent(seq))
      .payload_json("{\"seq\":" + std::to_string(seq) + "}")
      .build();
}

// One database (SQLite file or PostgreSQL table) migrated by the CLI.
class RelayE2E : public testing::RelayDatabaseTest {
 protected:
  void SetUp() override {
    RelayDatabaseTest::SetUp();
    if (skipped_or_failed()) {
      return;
    }
    testing::CommandResult migrated;
    table_ = migrate_table("relay", "outbox_event", &migrated);
    ASSERT_NE(migrated.out.find("schema version 0 -> " + std::to_string(kSchemaVersion)),
              std::string::npos)
        << migrated.out;
    pool_ = open_pool(url_, 2);
    store_ = detect_store(*pool_->acquire(), table_);
  }
  std::string database_toml() const {
    return "[database]\nurl = \"" + url_ + "\"\ntable = \"" + table_ + "\"\n";
  }
  std::vector<std::int64_t> counts() { return store_->count_by_status(*pool_->acquire()); }
  void insert(const std::vector<EventEnvelope>& events) {
    store_->insert_batch(*pool_->acquire(), events);
  }

  std::string table_;
  std::shared_ptr<sql::ConnectionPool> pool_;
  std::shared_ptr<OutboxStore> store_;
};

TEST_P(RelayE2E, DeliversToKafkaAndWebhooksDeadLettersAndDrainsOnSigterm) {
  testing::KafkaMockCluster kafka;
  kafka.create_topic("OrderPlaced-out-0", 3);
  kafka.create_topic("OrderShipped-out-0", 3);
  testing::HttpTestServer http;
  http.respond([](const testing::ReceivedRequest& r, httplib::Response& res) {
    if (r.path == "/hooks/reject") {
      res.status = 400;
      res.set_content("amount must be positive", "text/plain");
    }
  });
  std::vector<EventEnvelope> orders, payments, unroutable;
  for (int i = 0; i < 300; ++i) {
    orders.push_back(
        event(i % 2 ? "OrderShipped" : "OrderPlaced", "Order", "o-" + std::to_string(i % 10), i));
  }
  for (int i = 0; i < 100; ++i) {
    payments.push_back(event("PaymentCaptured", "Payment", "p-" + std::to_string(i), i));
  }
  payments.push_back(event("PaymentCaptured", "Payment", "reject", 1000));
  for (int i = 0; i < 5; ++i) {
    unroutable.push_back(event("UserCreated", "User", "u", i));
  }
  insert(orders);
  insert(payments);
  insert(unroutable);

  RelayProcess relay(dir_, database_toml() + R"(
[poller]
interval = "100ms"
[admin]
port = 0
[publishers.kafka]
type = "kafka"
brokers = ")" + kafka.bootstraps() +
                               R"("
[publishers.hooks]
type = "http"
[[routes]]
event_type = "Order*"
publisher = "kafka"
target = "{event_type}-out-0"
[[routes]]
aggregate_type = "Payment"
publisher = "hooks"
target = ")" + http.url("/hooks/{aggregate_id}") +
                               "\"\n");

  ASSERT_TRUE(wait_until(
      [&] {
        auto c = counts();
        return c[1] == 400 && c[3] == 6;
      },
      60s))
      << relay.log();

  // Kafka: every order once, keyed by aggregate id, with the outbox headers.
  auto messages = testing::consume(kafka.bootstraps(), {"OrderPlaced-out-0", "OrderShipped-out-0"},
                                   orders.size());
  ASSERT_EQ(messages.size(), orders.size());
  std::set<std::string> kafka_ids;
  for (const auto& m : messages) {
    const auto& id = m.headers.at(kafka::kHeaderEventId);
    kafka_ids.insert(id);
    EXPECT_EQ(m.topic, m.headers.at(kafka::kHeaderEventType) + "-out-0");
    EXPECT_EQ(m.key, m.headers.at(kafka::kHeaderAggregateId));
    EXPECT_EQ(m.headers.at("traceparent").rfind("00-4bf92f3577b34da6a3ce9", 0), 0u);
  }
  for (const auto& e : orders) {
    EXPECT_TRUE(kafka_ids.contains(e.event_id()));
  }

  // HTTP: one POST per payment, on the templated path; the 400 went DEAD at once.
  std::set<std::string> http_ids;
  for (const auto& r : http.received()) {
    http_ids.insert(r.header("X-Outbox-Event-Id"));
    EXPECT_EQ(r.path, "/hooks/" + r.header("X-Outbox-Aggregate-Id"));
    EXPECT_EQ(r.header("traceparent").rfind("00-4bf92f3577b34da6a3ce9", 0), 0u);
  }
  for (const auto& e : payments) {
    EXPECT_TRUE(http_ids.contains(e.event_id()));
  }
  auto rejected = store_->find(*pool_->acquire(), payments.back().event_id());
  EXPECT_EQ(rejected->status, EventStatus::Dead);
  EXPECT_EQ(rejected->attempts, 1);
  EXPECT_EQ(rejected->last_error, "HTTP 400: amount must be positive");
  auto user = store_->find(*pool_->acquire(), unroutable[0].event_id());
  EXPECT_EQ(user->status, EventStatus::Dead);
  EXPECT_NE(user->last_error->find("no listener"), std::string::npos);

  EXPECT_EQ(relay.terminate(), 0);
}

// W3C trace context end to end: the writer stamps each event with the writing thread's trace
// (an invalid one is dropped at write time), the relay forwards it as the `traceparent` and
// `tracestate` headers of the Kafka message and of the webhook's request.
TEST_P(RelayE2E, TheWritersTraceContextReachesKafkaAndWebhooks) {
  testing::KafkaMockCluster kafka;
  kafka.create_topic("orders", 1);
  testing::HttpTestServer http;
  auto tx_context = std::make_shared<ThreadLocalTxContext>();
  auto metrics = std::make_shared<InMemoryMetrics>();
  auto writer = Outbox::writer_only({.tx_context = tx_context,
                                     .store = store_,
                                     .metrics = metrics,
                                     .trace_context = thread_trace_context()});
  TransactionManager tx(pool_, tx_context);
  std::map<std::string, std::string> parent_of;  // event id → the traceparent it must arrive with
  {
    auto t = tx.begin();
    for (int i = 0; i < 4; ++i) {
      ScopedTraceContext span({traceparent(i), "vendor=span" + std::to_string(i)});
      const bool order = i % 2 == 0;
      parent_of[*writer.writer().write(
          EventEnvelope::builder(EventType::of(order ? "OrderPlaced" : "PaymentCaptured"))
              .aggregate_type(AggregateType::of(order ? "Order" : "Payment"))
              .aggregate_id("a-" + std::to_string(i))
              .payload_json("{}")
              .build())] = traceparent(i);
    }
    // A value the tracing library got wrong: written without it, the transaction commits.
    parent_of[*writer.writer().write(EventEnvelope::builder(EventType::of("PaymentCaptured"))
                                         .aggregate_type(AggregateType::of("Payment"))
                                         .aggregate_id("bad")
                                         .header("traceparent", "00-not-a-trace")
                                         .payload_json("{}")
                                         .build())] = "";
    t.commit();
  }
  EXPECT_EQ(metrics->snapshot().trace_context_dropped, 1);
  RelayProcess relay(dir_, database_toml() + R"(
[poller]
interval = "50ms"
[admin]
enabled = false
[publishers.kafka]
type = "kafka"
brokers = ")" + kafka.bootstraps() +
                               R"("
[publishers.hooks]
type = "http"
[[routes]]
event_type = "Order*"
publisher = "kafka"
target = "orders"
[[routes]]
publisher = "hooks"
target = ")" + http.url("/hooks") +
                               "\"\n");
  ASSERT_TRUE(wait_until([&] { return counts()[1] == 5; })) << relay.log();
  const auto messages = testing::consume(kafka.bootstraps(), {"orders"}, 2);
  ASSERT_EQ(messages.size(), 2U);
  for (const auto& m : messages) {
    const auto& id = m.headers.at(kafka::kHeaderEventId);
    EXPECT_EQ(m.headers.at("traceparent"), parent_of.at(id));
    EXPECT_EQ(m.headers.at("tracestate").rfind("vendor=span", 0), 0u);
  }
  ASSERT_EQ(http.received().size(), 3U);
  for (const auto& r : http.received()) {
    const auto id = r.header("X-Outbox-Event-Id");
    EXPECT_EQ(r.header("traceparent"), parent_of.at(id)) << id;
    EXPECT_EQ(r.headers.count("tracestate") > 0, !parent_of.at(id).empty()) << id;
  }
  EXPECT_EQ(relay.terminate(), 0);
}

TEST_P(RelayE2E, HttpOutageIsRetriedAndTheBacklogDrainsInBatchesWhenItRecovers) {
  testing::HttpTestServer http;
  std::atomic<bool> down{true};
  http.respond([&](const testing::ReceivedRequest&, httplib::Response& res) {
    if (down) {
      res.status = 503;
      res.set_content("maintenance", "text/plain");
    }
  });
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 200; ++i) {
    events.push_back(event("PaymentCaptured", "Payment", "p-" + std::to_string(i), i));
  }
  insert(events);
  RelayProcess relay(dir_, database_toml() + R"(
[poller]
interval = "100ms"
[dispatcher]
workers = 8
backoff_base = "100ms"
backoff_max = "400ms"
max_attempts = 1000
[admin]
port = 0
[publishers.batch]
type = "http"
mode = "batch"
batch_size = 8
[[routes]]
publisher = "batch"
target = ")" + http.url("/api/events/batch") +
                               "\"\n");

  // While the endpoint is down: attempts pile up as RETRY, nothing is DONE or DEAD.
  ASSERT_TRUE(wait_until([&] { return counts()[2] >= 50; }, 60s)) << relay.log();
  auto during = counts();
  EXPECT_EQ(during[1], 0);
  EXPECT_EQ(during[3], 0);
  down = false;
  ASSERT_TRUE(wait_until([&] { return counts()[1] == 200; }, 60s)) << relay.log();

  std::set<std::string> delivered;
  std::size_t largest = 0;
  for (const auto& r : http.received()) {
    auto array = nlohmann::json::parse(r.body);
    largest = std::max(largest, array.size());
    for (const auto& item : array) {
      delivered.insert(item.at("event_id").get<std::string>());
    }
  }
  EXPECT_EQ(delivered.size(), 200u);
  EXPECT_LE(largest, 8u);

  // The outage is visible in the metrics as retriable results of this publisher.
  httplib::Client admin("127.0.0.1", relay.admin_port());
  auto metrics = admin.Get("/metrics");
  ASSERT_TRUE(metrics);
  EXPECT_NE(metrics->body.find("outbox_publish_total{publisher=\"batch\",result=\"retriable\"}"),
            std::string::npos);
  EXPECT_EQ(relay.terminate(), 0);
}

TEST_P(RelayE2E, SigtermFinishesInFlightWorkReleasesClaimsAndARestartDeliversTheRest) {
  testing::HttpTestServer http;
  std::mutex gate_mutex;
  std::condition_variable gate;
  bool open = false;
  http.respond([&](const testing::ReceivedRequest&, httplib::Response&) {
    std::unique_lock lock(gate_mutex);
    gate.wait(lock, [&] { return open; });
  });
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 200; ++i) {
    events.push_back(event("PaymentCaptured", "Payment", "p-" + std::to_string(i), i));
  }
  insert(events);
  // A 10-minute lock expiry: the restart below can only deliver quickly if claims were released.
  const std::string config = database_toml() + R"(
[poller]
interval = "100ms"
batch = 50
lock_expiry = "10m"
[dispatcher]
workers = 4
queue = 8
drain_timeout = "30s"
[admin]
enabled = false
[publishers.hooks]
type = "http"
[[routes]]
publisher = "hooks"
target = ")" + http.url("/hooks") +
                             "\"\n";
  {
    RelayProcess relay(dir_, config);
    ASSERT_TRUE(wait_until([&] { return http.count() >= 4; })) << relay.log();
    ASSERT_TRUE(wait_until([&] { return relay.log().find("relay started") != std::string::npos; }));
    kill(relay.pid(), SIGTERM);
    ASSERT_TRUE(wait_until([&] { return relay.log().find("draining") != std::string::npos; }));
    {
      std::lock_guard lock(gate_mutex);
      open = true;
    }
    gate.notify_all();
    EXPECT_EQ(relay.wait(), 0) << relay.log();
  }
  auto c = counts();
  EXPECT_EQ(c[0] + c[1], 200) << "no RETRY or DEAD from shutting down";
  EXPECT_GE(c[1], 4) << "in-flight deliveries finished";
  EXPECT_LT(c[1], 200) << "stopped before the end";
  std::set<std::string> received;
  for (const auto& r : http.received()) {
    received.insert(r.header("X-Outbox-Event-Id"));
  }
  for (const auto& e : events) {
    auto row = store_->find(*pool_->acquire(), e.event_id());
    if (row->status == EventStatus::Done) {
      EXPECT_TRUE(received.contains(e.event_id()));
    } else {
      EXPECT_EQ(row->locked_by, std::nullopt) << "claim released for " << e.event_id();
    }
  }
  RelayProcess restarted(dir_, config);
  ASSERT_TRUE(wait_until([&] { return counts()[1] == 200; }, 60s)) << restarted.log();
  for (const auto& r : http.received()) {
    received.insert(r.header("X-Outbox-Event-Id"));
  }
  EXPECT_EQ(received.size(), 200u);
  EXPECT_EQ(restarted.terminate(), 0);
}

// Issue 9 item 5: the publisher kept the first 200 BYTES of a response body, which may end inside
// a character (or hold bytes that are not UTF-8 at all); PostgreSQL and strict MariaDB refused the
// DEAD update, the row stayed NEW and a permanent 400 was posted again and again. Now it goes DEAD
// after one POST with a readable reason.
TEST_P(RelayE2E, ARejectionWhoseBodyIsNotUtf8GoesDeadAfterOnePost) {
  testing::HttpTestServer http;
  http.respond([](const testing::ReceivedRequest&, httplib::Response& res) {
    res.status = 400;
    std::string body = "x";
    for (int i = 0; i < 150; ++i) {
      body += "\xC3\xA9";  // é: byte 200 falls inside one
    }
    body += std::string("\xFF\xFE") + std::string(1, '\0') + "tail";
    res.set_content(body, "text/plain; charset=utf-8");
  });
  auto e = event("PaymentCaptured", "Payment", "p-9", 9);
  insert({e});
  RelayProcess relay(dir_, database_toml() + R"(
[poller]
interval = "100ms"
[dispatcher]
max_attempts = 3
[admin]
enabled = false
[publishers.hooks]
type = "http"
[[routes]]
publisher = "hooks"
target = ")" + http.url("/hooks") +
                               "\"\n");
  ASSERT_TRUE(wait_until([&] { return counts()[3] == 1; })) << relay.log();
  EXPECT_EQ(relay.terminate(), 0);
  EXPECT_EQ(http.count(), 1u);
  auto row = store_->find(*pool_->acquire(), e.event_id());
  ASSERT_TRUE(row->last_error);
  EXPECT_EQ(*row->last_error, sanitize_utf8(*row->last_error));
  EXPECT_EQ(row->last_error->rfind("HTTP 400: x\xC3\xA9", 0), 0u) << *row->last_error;
}

INSTANTIATE_TEST_SUITE_P(Engines, RelayE2E, ::testing::Values("sqlite", "postgres", "mysql"),
                         [](const auto& info) { return info.param; });

using RelayE2EAdmin = MigratedSqlite;
using RelayE2EOrdered = MigratedSqlite;
using RelayE2EThrottle = MigratedSqlite;
using RelayE2ECli = MigratedSqlite;

TEST_F(RelayE2EAdmin, EndpointsAuthorisationMethodsAndPrometheusText) {
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 3; ++i) {
    events.push_back(event("Nobody", "Thing", "t", i));
  }
  store->insert_batch(*pool->acquire(), events);
  RelayProcess relay(dir, "[database]\nurl = \"" + url + R"("
[poller]
interval = "100ms"
[admin]
port = 0
token = "admin-secret"
[publishers.dev]
type = "log"
path = ")" + dir.file("events.jsonl") +
                              R"("
[[routes]]
event_type = "Known*"
publisher = "dev"
)");
  ASSERT_TRUE(wait_until([&] { return store->count_by_status(*pool->acquire())[3] == 3; }));
  httplib::Client admin("127.0.0.1", relay.admin_port());
  const httplib::Headers auth = {{"Authorization", "Bearer admin-secret"}};

  EXPECT_EQ(admin.Get("/healthz")->status, 200);
  EXPECT_EQ(admin.Get("/readyz")->status, 200);
  auto metrics = admin.Get("/metrics");
  ASSERT_EQ(metrics->status, 200);
  EXPECT_NE(metrics->body.find("outbox_dispatch_dead_total 3"), std::string::npos) << metrics->body;
  const auto metrics_file = dir.file("metrics.txt");
  std::ofstream(metrics_file) << metrics->body;
  EXPECT_EQ(std::system(("promtool check metrics < " + metrics_file).c_str()), 0);

  EXPECT_EQ(admin.Get("/api/status")->status, 401);
  auto status = admin.Get("/api/status", auth);
  ASSERT_EQ(status->status, 200);
  auto s = nlohmann::json::parse(status->body);
  EXPECT_EQ(s.at("dead"), 3);
  EXPECT_EQ(s.at("dead_by_type").at("Nobody"), 3);

  auto dead = admin.Get("/api/dead?type=Nobody&limit=2", auth);
  ASSERT_EQ(dead->status, 200);
  auto rows = nlohmann::json::parse(dead->body);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_NE(rows[0].at("last_error").get<std::string>().find("no listener"), std::string::npos);
  EXPECT_EQ(admin.Get("/api/dead?limit=0", auth)->status, 400);

  const std::string replay = "/api/dead/" + events[0].event_id() + "/replay";
  EXPECT_EQ(admin.Get(replay, auth)->status, 405);
  EXPECT_EQ(admin.Put(replay, auth, "", "text/plain")->status, 405);
  EXPECT_EQ(admin.Post("/api/status", auth, "", "text/plain")->status, 405);
  EXPECT_EQ(admin.Post(replay, "", "text/plain")->status, 401);
  auto replayed = admin.Post(replay, auth, "", "text/plain");
  ASSERT_EQ(replayed->status, 200);
  EXPECT_EQ(admin.Post("/api/dead/nope/replay", auth, "", "text/plain")->status, 404);
  // Replayed, delivered again, still unroutable: DEAD again, counted twice in total.
  ASSERT_TRUE(wait_until([&] {
    auto m = admin.Get("/metrics");
    return m && m->body.find("outbox_dispatch_dead_total 4") != std::string::npos;
  }));
  EXPECT_EQ(relay.terminate(), 0);
}

// Dead-letter triage: a webhook refuses two kinds of events with bodies that name each event; the
// DEAD events form one group per kind (ids aside), and each group is replayed or discarded whole,
// through the admin API (token required) and the CLI.
TEST_F(RelayE2EAdmin, DeadEventsGroupByFingerprintAndAGroupIsReplayedOrDiscardedWhole) {
  testing::HttpTestServer http;
  std::atomic<bool> refusing{true};
  http.respond([&](const testing::ReceivedRequest& r, httplib::Response& res) {
    if (!refusing) {
      return;  // 200
    }
    const auto id = r.header("X-Outbox-Aggregate-Id");
    if (r.header("X-Outbox-Event-Type") == "OrderPlaced") {
      res.status = 422;
      res.set_content("{\"error\":\"order " + id + " has no customer\"}", "application/json");
    } else {
      res.status = 400;
      res.set_content("shipment " + id + " refused at 10:42:07", "text/plain");
    }
  });
  std::vector<EventEnvelope> orders, shipments;
  for (int i = 0; i < 5; ++i) {
    orders.push_back(event("OrderPlaced", "Order", "ord-" + std::to_string(10000 + i * 37), i));
  }
  for (int i = 0; i < 3; ++i) {
    shipments.push_back(event("Shipped", "Order", "shp-" + std::to_string(900 + i), i));
  }
  store->insert_batch(*pool->acquire(), orders);
  store->insert_batch(*pool->acquire(), shipments);
  RelayProcess relay(dir, "[database]\nurl = \"" + url + R"("
[poller]
interval = "50ms"
[admin]
port = 0
token = "admin-secret"
[publishers.hook]
type = "http"
[[routes]]
publisher = "hook"
target = ")" + http.url("/in") +
                              "\"\n");
  ASSERT_TRUE(wait_until([&] { return store->count_by_status(*pool->acquire())[3] == 8; }));
  httplib::Client admin("127.0.0.1", relay.admin_port());
  const httplib::Headers auth = {{"Authorization", "Bearer admin-secret"}};
  EXPECT_EQ(admin.Get("/api/dead/groups")->status, 401);
  EXPECT_EQ(admin.Get("/api/dead/groups?limit=0", auth)->status, 400);
  EXPECT_EQ(admin.Get("/api/dead/groups?limit=5abc", auth)->status, 400);
  EXPECT_EQ(admin.Get("/api/dead/groups?top=1e3", auth)->status, 400);
  auto top = admin.Get("/api/dead/groups?top=1", auth);
  ASSERT_EQ(top->status, 200);
  EXPECT_EQ(nlohmann::json::parse(top->body).at("groups").size(), 1U);
  EXPECT_EQ(nlohmann::json::parse(top->body).at("total_groups"), 2);
  auto listed = admin.Get("/api/dead/groups", auth);
  ASSERT_EQ(listed->status, 200);
  const auto body = nlohmann::json::parse(listed->body);
  EXPECT_FALSE(body.at("more").get<bool>());
  const auto& groups = body.at("groups");
  ASSERT_EQ(groups.size(), 2U) << listed->body;
  EXPECT_EQ(groups[0].at("count"), 5);
  EXPECT_EQ(groups[0].at("event_type"), "OrderPlaced");
  EXPECT_EQ(groups[0].at("pattern"), R"(HTTP 422: {"error":"order <id> has no customer"})");
  // The sample is the one that went DEAD last, with its payload.
  const auto sample = std::find_if(orders.begin(), orders.end(), [&](const EventEnvelope& e) {
    return e.event_id() == groups[0].at("sample_event_id");
  });
  ASSERT_NE(sample, orders.end());
  EXPECT_EQ(groups[0].at("sample_payload"), sample->payload_json());
  EXPECT_EQ(groups[1].at("count"), 3);
  EXPECT_EQ(groups[1].at("pattern"), "HTTP 400: shipment <id> refused at N");
  const std::string order_fp = groups[0].at("fingerprint");
  const std::string ship_fp = groups[1].at("fingerprint");

  // Actions: POST with the token only; an unknown fingerprint is 404.
  const std::string replay = "/api/dead/groups/" + order_fp + "/replay";
  EXPECT_EQ(admin.Get(replay, auth)->status, 405);
  EXPECT_EQ(admin.Post(replay, "", "text/plain")->status, 401);
  EXPECT_EQ(admin.Post("/api/dead/groups/0000000000000000/replay", auth, "", "text/plain")->status,
            404);
  refusing = false;
  auto replayed = admin.Post(replay, auth, "", "text/plain");
  ASSERT_EQ(replayed->status, 200);
  EXPECT_EQ(nlohmann::json::parse(replayed->body).at("changed"), 5);
  ASSERT_TRUE(wait_until([&] { return store->count_by_status(*pool->acquire())[1] == 5; }));
  for (const auto& e : orders) {
    EXPECT_EQ(store->find(*pool->acquire(), e.event_id())->status, EventStatus::Done);
  }
  // The CLI sees the one group left, and discards it.
  auto cli = run_cli(dir, "dead groups --db " + url);
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_NE(cli.out.find("3  " + ship_fp + "  Shipped"), std::string::npos) << cli.out;
  EXPECT_EQ(run_cli(dir, "dead discard --fingerprint " + order_fp + " --db " + url).exit_code, 1);
  EXPECT_EQ(run_cli(dir, "dead replay --db " + url).exit_code, 2);  // neither ids nor fingerprint
  cli = run_cli(dir, "dead discard --fingerprint " + ship_fp + " --db " + url);
  ASSERT_EQ(cli.exit_code, 0) << cli.err;
  EXPECT_EQ(cli.out, "discarded 3\n");
  for (const auto& e : shipments) {
    EXPECT_FALSE(store->find(*pool->acquire(), e.event_id()));
  }
  cli = run_cli(dir, "dead groups --json --db " + url);
  EXPECT_EQ(nlohmann::json::parse(cli.out).at("groups").size(), 0U);
  EXPECT_EQ(nlohmann::json::parse(cli.out).at("total_groups"), 0);
  EXPECT_EQ(relay.terminate(), 0);
}

TEST_F(RelayE2EOrdered, OrderedModeKeepsPerAggregateOrderInKafka) {
  testing::KafkaMockCluster kafka;
  kafka.create_topic("wallet-events", 4);
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 200; ++i) {
    events.push_back(event("WalletCredited", "Wallet", "w-" + std::to_string(i % 7), i));
  }
  for (std::size_t i = 0; i < events.size(); i += 20) {  // several commits, as producers would
    store->insert_batch(*pool->acquire(),
                        std::vector<EventEnvelope>(events.begin() + static_cast<long>(i),
                                                   events.begin() + static_cast<long>(i + 20)));
  }
  RelayProcess relay(dir, "[database]\nurl = \"" + url + R"("
[poller]
interval = "100ms"
[dispatcher]
ordered = true
[admin]
enabled = false
[publishers.kafka]
type = "kafka"
brokers = ")" + kafka.bootstraps() +
                              R"("
[[routes]]
publisher = "kafka"
target = "wallet-events"
)");
  ASSERT_TRUE(wait_until([&] { return store->count_by_status(*pool->acquire())[1] == 200; }, 60s))
      << relay.log();
  auto messages = testing::consume(kafka.bootstraps(), {"wallet-events"}, events.size());
  ASSERT_EQ(messages.size(), events.size());
  std::sort(messages.begin(), messages.end(), [](const auto& a, const auto& b) {
    return std::tie(a.partition, a.offset) < std::tie(b.partition, b.offset);
  });
  std::map<std::string, int> last;
  for (const auto& m : messages) {
    const int seq = nlohmann::json::parse(m.value).at("seq");
    auto it = last.find(m.key);
    if (it != last.end()) {
      EXPECT_GT(seq, it->second) << m.key;
    }
    last[m.key] = seq;
  }
  EXPECT_EQ(last.size(), 7u);
  EXPECT_EQ(relay.terminate(), 0);
}

// Issue 9 item 9, as a receiver sees it: in ordered mode the first event of an aggregate is
// answered 429 with Retry-After: 1; the receiver used to get A1, A2, A3, A1. The relay now holds
// A1 and sends nothing behind it until A1 went through.
TEST_F(RelayE2EThrottle, OrderedModeRetryAfterKeepsTheAggregatesOrder) {
  testing::HttpTestServer http;
  std::atomic<int> calls{0};
  http.respond([&](const testing::ReceivedRequest&, httplib::Response& res) {
    if (calls++ == 0) {
      res.status = 429;
      res.set_header("Retry-After", "1");
      res.set_content("slow down", "text/plain");
      return;
    }
    res.status = 200;
  });
  std::vector<EventEnvelope> events;
  for (int i = 1; i <= 3; ++i) {
    events.push_back(event("PaymentCaptured", "Payment", "p-1", i));
  }
  store->insert_batch(*pool->acquire(), events);
  RelayProcess relay(dir, "[database]\nurl = \"" + url + R"("
[poller]
interval = "100ms"
[dispatcher]
ordered = true
batch = 10
[admin]
enabled = false
[publishers.hooks]
type = "http"
[[routes]]
publisher = "hooks"
target = ")" + http.url("/hooks") +
                              "\"\n");
  ASSERT_TRUE(wait_until([&] { return store->count_by_status(*pool->acquire())[1] == 3; }, 60s))
      << relay.log();
  std::vector<std::string> order;
  for (const auto& r : http.received()) {
    order.push_back(r.header("X-Outbox-Event-Id"));
  }
  EXPECT_EQ(order, (std::vector<std::string>{events[0].event_id(), events[0].event_id(),
                                             events[1].event_id(), events[2].event_id()}));
  EXPECT_EQ(relay.terminate(), 0);
}

TEST_F(RelayE2EThrottle, RetryAfterDefersWithoutCountingAnAttempt) {
  testing::HttpTestServer http;
  http.respond([](const testing::ReceivedRequest&, httplib::Response& res) {
    res.status = 429;
    res.set_header("Retry-After", "120");
    res.set_content("slow down", "text/plain");
  });
  auto e = event("PaymentCaptured", "Payment", "p-1", 1);
  store->insert_new(*pool->acquire(), e);
  const auto before = std::chrono::system_clock::now();
  RelayProcess relay(dir, "[database]\nurl = \"" + url + R"("
[poller]
interval = "100ms"
[admin]
enabled = false
[publishers.hooks]
type = "http"
[[routes]]
publisher = "hooks"
target = ")" + http.url("/hooks") +
                              "\"\n");
  ASSERT_TRUE(wait_until([&] {
    return store->find(*pool->acquire(), e.event_id())->status == EventStatus::Retry;
  })) << relay.log();
  auto row = store->find(*pool->acquire(), e.event_id());
  EXPECT_EQ(row->attempts, 0);  // a deferral asked for by the receiver, not a failed attempt
  EXPECT_GE(row->available_at, before + std::chrono::seconds(119));
  EXPECT_EQ(row->last_error, "HTTP 429: slow down");
  EXPECT_EQ(http.count(), 1u);
  EXPECT_EQ(relay.terminate(), 0);
}

TEST_F(RelayE2ECli, StatusDeadReplayPurgeAndConfigErrors) {
  auto again = run_cli(dir, "migrate --db " + url);
  EXPECT_EQ(again.exit_code, 0);
  EXPECT_NE(again.out.find("already at schema version " + std::to_string(kSchemaVersion)),
            std::string::npos);

  std::vector<EventEnvelope> events;
  for (int i = 0; i < 4; ++i) {
    events.push_back(event(i < 3 ? "A" : "B", "Agg", "x", i));
  }
  store->insert_batch(*pool->acquire(), events);
  for (const auto& e : events) {
    store->mark_dead(*pool->acquire(), e.event_id(), std::chrono::system_clock::now(), "broken");
  }
  auto status = run_cli(dir, "status --json --db " + url);
  ASSERT_EQ(status.exit_code, 0) << status.err;
  auto s = nlohmann::json::parse(status.out);
  EXPECT_EQ(s.at("dead"), 4);
  EXPECT_EQ(s.at("dead_by_type").at("A"), 3);
  EXPECT_TRUE(s.at("oldest_pending_age_seconds").is_null());

  auto list = run_cli(dir, "dead list --json --type A --db " + url);
  ASSERT_EQ(list.exit_code, 0) << list.err;
  EXPECT_EQ(nlohmann::json::parse(list.out).size(), 3u);
  EXPECT_EQ(run_cli(dir, "dead replay --db " + url + " " + events[3].event_id()).exit_code, 0);
  EXPECT_EQ(run_cli(dir, "dead replay --db " + url + " missing-id").exit_code, 1);
  auto all = run_cli(dir, "dead replay-all --type A --db " + url);
  EXPECT_EQ(all.out, "replayed 3\n");
  auto text = run_cli(dir, "status --db " + url);
  EXPECT_NE(text.out.find("new    4"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("oldest pending: "), std::string::npos);

  store->mark_done_batch(*pool->acquire(), {events[0].event_id(), events[1].event_id()},
                         Clock::system()->now() - std::chrono::hours(24 * 8));
  auto purged = run_cli(dir, "purge --older-than 7d --db " + url);
  EXPECT_EQ(purged.out, "purged 2\n") << purged.err;
  EXPECT_EQ(run_cli(dir, "purge --older-than 7 --db " + url).exit_code, 2);

  // Bad input: one line on stderr, non-zero exit; configuration errors name the line.
  std::ofstream(dir.file("bad.toml")) << "[database]\nurl = \"" << url
                                      << "\"\n[publishers.p]\ntype = \"log\"\n"
                                         "[[routes]]\npublisher = \"p\"\ntarget = \"{oops}\"\n";
  auto bad = run_cli(dir, "relay -c " + dir.file("bad.toml"));
  EXPECT_EQ(bad.exit_code, 2);
  EXPECT_NE(bad.err.find("bad.toml:5:"), std::string::npos) << bad.err;
  EXPECT_NE(bad.err.find("unknown placeholder {oops}"), std::string::npos) << bad.err;
  EXPECT_EQ(run_cli(dir, "status --db oracle://x").exit_code, 2);
  EXPECT_NE(run_cli(dir, "frobnicate").exit_code, 0);
  auto help = run_cli(dir, "dead replay-all --help");
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.out.find("--aggregate"), std::string::npos);
  auto missing_table = run_cli(dir, "status --table nope --db " + url);
  EXPECT_EQ(missing_table.exit_code, 1);
  EXPECT_FALSE(missing_table.err.empty());
}

}  // namespace
}  // namespace outbox
