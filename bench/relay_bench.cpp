// outbox-relay-bench: how fast the relay drains a backlog into each publisher.
//
//   outbox-relay-bench --db=URL [--publisher=kafka|http|http-batch|log] [--events=N]
//                      [--workers=W] [--batch=B] [--payload=BYTES] [--groups=G] [--per-group=K]
//                      [--latency-ms=D] [--queue=Q]
//
// N events are inserted first; then a Relay (the library behind `outbox relay`, in this process)
// claims and publishes them to librdkafka's mock cluster, a loopback HTTP server (cpp-httplib), or
// the log publisher writing to /dev/null. With G > 0 the events are spread over G message groups
// (delivered per group in order, docs/groups.md). Prints one line: events/s from start to the last
// DONE, when the first was delivered and the rate from then on (steady), peak RSS. Progress goes to
// stderr once a second. With D > 0 the HTTP receiver takes D ms per request (an endpoint that does
// some work) and the Kafka brokers answer D ms late (a network between): the drain then waits on
// the far side rather than on the relay's CPU. Q sets dispatcher.queue (default B × W). Exits
// non-zero if an event is not delivered.

#include <sys/resource.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

#include "outbox/detect/detect.hpp"
#include "outbox/log.hpp"
#include "outbox/prometheus/metrics.hpp"
#include "outbox/relay/relay.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/kafka_mock.hpp"
#include "tests/support/tables.hpp"

namespace {

using Clock = std::chrono::steady_clock;

struct Args {
  std::string db, publisher = "kafka";
  int events = 50000, workers = 16, batch = 500, payload = 200, groups = 0, per_group = 10,
      latency_ms = 0, queue = 0;  // queue 0: batch × workers
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (auto v = value("db"))
      a.db = v;
    else if (auto v = value("publisher"))
      a.publisher = v;
    else if (auto v = value("events"))
      a.events = std::atoi(v);
    else if (auto v = value("workers"))
      a.workers = std::atoi(v);
    else if (auto v = value("batch"))
      a.batch = std::atoi(v);
    else if (auto v = value("payload"))
      a.payload = std::atoi(v);
    else if (auto v = value("groups"))
      a.groups = std::atoi(v);
    else if (auto v = value("per-group"))
      a.per_group = std::atoi(v);
    else if (auto v = value("latency-ms"))
      a.latency_ms = std::atoi(v);
    else if (auto v = value("queue"))
      a.queue = std::atoi(v);
    else
      throw std::invalid_argument("unknown argument " + arg);
  }
  if (a.db.empty() || a.events <= 0 || a.workers <= 0 || a.batch <= 0 || a.groups < 0 ||
      a.per_group <= 0 || a.latency_ms < 0 || a.queue < 0) {
    throw std::invalid_argument(
        "usage: outbox-relay-bench --db=URL [--publisher=kafka|http|"
        "http-batch|log] [--events=N] [--workers=W] [--batch=B] [--payload=BYTES] [--groups=G] "
        "[--per-group=K] [--latency-ms=D] [--queue=Q]");
  }
  return a;
}

long peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  outbox::set_log_level(outbox::LogLevel::Warning);
  const std::string table = "relay_bench_" + std::to_string(getpid());
  auto pool = outbox::open_pool(args.db, 2);
  std::shared_ptr<outbox::OutboxStore> store;
  {
    auto conn = pool->acquire();
    outbox::migrate(*conn, table);
    store = outbox::detect_store(*conn, table);
    const std::string payload = "{\"data\":\"" + std::string(args.payload, 'x') + "\"}";
    std::vector<outbox::EventEnvelope> chunk;
    for (int i = 0; i < args.events; ++i) {
      auto b = outbox::EventEnvelope::builder(outbox::EventType::of("OrderPlaced"))
                   .aggregate_type(outbox::AggregateType::of("Order"))
                   .aggregate_id("o-" + std::to_string(i % 1000))
                   .payload_json(payload);
      if (args.groups > 0) {
        b.message_group("g-" + std::to_string(i % args.groups));
      }
      chunk.push_back(b.build());
      if (chunk.size() == 500 || i + 1 == args.events) {
        store->insert_batch(*conn, chunk);
        chunk.clear();
      }
    }
    if (conn->dialect() == "postgres") {
      conn->execute("ANALYZE " + table);
    }
  }

  std::unique_ptr<outbox::testing::KafkaMockCluster> kafka;
  std::unique_ptr<outbox::testing::HttpTestServer> http;
  outbox::relay::RelayConfig config;
  config.database = {.url = args.db, .table = table, .pool_size = 8};
  config.poller.interval = std::chrono::milliseconds(100);
  config.poller.batch = args.batch;
  config.dispatcher.workers = args.workers;
  config.dispatcher.batch = args.batch;
  config.dispatcher.queue =
      static_cast<std::size_t>(args.queue > 0 ? args.queue : args.batch * args.workers);
  config.admin.enabled = false;
  config.groups.per_group = args.per_group;
  outbox::relay::PublisherConfig publisher{.name = "p"};
  std::string target;
  if (args.publisher == "kafka") {
    kafka = std::make_unique<outbox::testing::KafkaMockCluster>(3);
    kafka->create_topic("orders", 6);
    kafka->set_all_brokers_rtt(std::chrono::milliseconds(args.latency_ms));
    publisher.type = outbox::relay::PublisherConfig::Type::Kafka;
    publisher.brokers = kafka->bootstraps();
    target = "orders";
  } else if (args.publisher == "http" || args.publisher == "http-batch") {
    http = std::make_unique<outbox::testing::HttpTestServer>(false);
    if (args.latency_ms > 0) {
      // The endpoint's own work, simulated: this is what the bench measures against.
      http->respond([work = std::chrono::milliseconds(args.latency_ms)](
                        const outbox::testing::ReceivedRequest&, httplib::Response& res) {
        std::this_thread::sleep_for(work);
        res.set_content("ok", "text/plain");
      });
    }
    publisher.type = outbox::relay::PublisherConfig::Type::Http;
    publisher.batch = args.publisher == "http-batch";
    target = http->url("/events");
  } else if (args.publisher == "log") {
    publisher.type = outbox::relay::PublisherConfig::Type::Log;
    publisher.path = "/dev/null";
  } else {
    throw std::invalid_argument("--publisher must be kafka, http, http-batch or log");
  }
  config.publishers.push_back(publisher);
  config.routes.push_back({.publisher = "p", .target = target});

  const auto start = Clock::now();
  outbox::relay::Relay relay(config);
  relay.start();
  auto last_report = start;
  // Completion is read from the relay's own counters, so the bench adds no queries of its own.
  auto finished = [&relay] {
    const std::string text = relay.metrics().serialize();
    long long total = 0;
    for (const char* name : {"outbox_dispatch_success_total ", "outbox_dispatch_dead_total "}) {
      const auto at = text.find(std::string("\n") + name);
      if (at != std::string::npos) {
        total += std::atoll(text.c_str() + at + 1 + std::strlen(name));
      }
    }
    return total;
  };
  // Where the first events were delivered: the rate from there on leaves out the start (leases,
  // the publisher's first connections), which is the same with groups and without.
  Clock::time_point first_at{};
  long long first_done = 0;
  for (long long done = 0; (done = finished()) < args.events;) {
    if (first_done == 0 && done > 0) {
      first_at = Clock::now();
      first_done = done;
    }
    if (Clock::now() - start > std::chrono::minutes(30)) {
      std::fprintf(stderr, "relay-bench: not drained after 30 minutes\n");
      return 1;
    }
    if (Clock::now() - last_report > std::chrono::seconds(1)) {
      last_report = Clock::now();
      std::fprintf(stderr, "relay-bench: %.0f s, %lld done\n",
                   std::chrono::duration<double>(last_report - start).count(), done);
    }
    // The bench's own poll interval: a bound on how late the end is noticed, not a measurement.
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const auto end = Clock::now();
  const double secs = std::chrono::duration<double>(end - start).count();
  if (first_done == 0) {
    first_at = end;
  }
  const double first_secs = std::chrono::duration<double>(first_at - start).count();
  const double steady_secs = std::chrono::duration<double>(end - first_at).count();
  relay.stop();
  auto conn = pool->acquire();
  const auto counts = store->count_by_status(*conn);
  outbox::testing::drop_outbox_tables(*conn, table);
  std::printf(
      "relay-bench db=%s publisher=%s events=%d groups=%d workers=%d batch=%d latency_ms=%d "
      "done=%lld "
      "dead=%lld events/s=%.0f seconds=%.2f first_done_s=%.2f steady_events/s=%.0f "
      "peak_rss_mb=%ld\n",
      conn->dialect().data(), args.publisher.c_str(), args.events, args.groups, args.workers,
      args.batch, args.latency_ms, static_cast<long long>(counts[1]),
      static_cast<long long>(counts[3]), args.events / secs, secs, first_secs,
      steady_secs > 0 ? static_cast<double>(args.events - first_done) / steady_secs : 0.0,
      peak_rss_mb());
  return counts[1] == args.events ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "outbox-relay-bench: %s\n", e.what());
  return 2;
}
