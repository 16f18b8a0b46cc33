// outbox-wakeup-bench: commit → publish latency through the relay, with and without wake-ups.
//
//   outbox-wakeup-bench --db=URL [--wakeup=auto|listen|data_version|adaptive|off] [--rate=N]
//                       [--seconds=S] [--interval=MS]
//
// A writer commits one event per 1/N s for S seconds through its own connections and an Outbox
// in writer_only mode (on PostgreSQL with a CommitNotifier unless --wakeup=off), as a service
// beside the relay would; a Relay (the library behind `outbox relay`, poller.interval = MS,
// poller.wakeup as given) publishes them to a loopback HTTP server. Latency is from the return of
// the writer's COMMIT to the request reaching the server. Prints one line: p50, p90, p99, max in
// ms and the number of poll wake-ups. Exits non-zero if an event is not delivered.

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <thread>

#include "outbox/detect/detect.hpp"
#include "outbox/log.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/notifications.hpp"
#include "outbox/prometheus/metrics.hpp"
#include "outbox/relay/relay.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/tables.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using outbox::relay::RelayConfig;

struct Args {
  std::string db, wakeup = "auto";
  int rate = 20, seconds = 10, interval_ms = 500;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return arg.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (auto v = value("db"))
      a.db = v;
    else if (auto v = value("wakeup"))
      a.wakeup = v;
    else if (auto v = value("rate"))
      a.rate = std::atoi(v);
    else if (auto v = value("seconds"))
      a.seconds = std::atoi(v);
    else if (auto v = value("interval"))
      a.interval_ms = std::atoi(v);
    else
      throw std::invalid_argument("unknown argument " + arg);
  }
  if (a.db.empty() || a.rate <= 0 || a.seconds <= 0 || a.interval_ms <= 0) {
    throw std::invalid_argument(
        "usage: outbox-wakeup-bench --db=URL [--wakeup=auto|listen|data_version|adaptive|off] "
        "[--rate=N] [--seconds=S] [--interval=MS]");
  }
  return a;
}

RelayConfig::Poller::Wakeup wakeup_of(const std::string& name) {
  using W = RelayConfig::Poller::Wakeup;
  const std::map<std::string, W> names{{"auto", W::Auto},
                                       {"listen", W::Listen},
                                       {"data_version", W::DataVersion},
                                       {"adaptive", W::Adaptive},
                                       {"off", W::Off}};
  const auto it = names.find(name);
  if (it == names.end()) {
    throw std::invalid_argument("--wakeup must be auto, listen, data_version, adaptive or off");
  }
  return it->second;
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

long long counter(outbox::relay::Relay& relay, const char* name) {
  const std::string text = relay.metrics().serialize();
  const auto at = text.find(std::string("\n") + name + " ");
  return at == std::string::npos ? 0 : std::atoll(text.c_str() + at + 2 + std::strlen(name));
}

}  // namespace

int main(int argc, char** argv) try {
  const Args args = parse(argc, argv);
  outbox::set_log_level(outbox::LogLevel::Warning);
  const std::string table = "wakeup_bench_" + std::to_string(getpid());
  auto pool = outbox::open_pool(args.db, 2);
  std::shared_ptr<outbox::OutboxStore> store;
  std::string dialect;
  {
    auto conn = pool->acquire();
    outbox::migrate(*conn, table);
    store = outbox::detect_store(*conn, table);
    dialect = std::string(conn->dialect());
  }

  std::mutex mutex;  // guards committed, latencies
  std::map<std::string, Clock::time_point> committed;
  std::vector<double> latencies;
  outbox::testing::HttpTestServer http(false);
  http.respond([&](const outbox::testing::ReceivedRequest& r, httplib::Response& res) {
    const auto now = Clock::now();
    std::lock_guard lock(mutex);
    const auto it = committed.find(r.header("X-Outbox-Event-Id"));
    if (it != committed.end()) {
      latencies.push_back(std::chrono::duration<double, std::milli>(now - it->second).count());
    }
    res.set_content("ok", "text/plain");
  });

  RelayConfig config;
  config.database = {.url = args.db, .table = table, .pool_size = 4};
  config.poller.interval = std::chrono::milliseconds(args.interval_ms);
  config.poller.wakeup = wakeup_of(args.wakeup);
  config.admin.enabled = false;
  config.publishers.push_back({.name = "p", .type = outbox::relay::PublisherConfig::Type::Http});
  config.routes.push_back({.publisher = "p", .target = http.url("/events")});
  outbox::relay::Relay relay(config);
  relay.start();

  // The writer: connections of its own, no hot path (writer_only), as another process would.
  auto writer_pool = outbox::open_pool(args.db, 2);
  auto context = std::make_shared<outbox::ThreadLocalTxContext>();
  outbox::Outbox::Options options{.tx_context = context, .store = store};
  std::shared_ptr<outbox::postgres::CommitNotifier> notifier;
  if (dialect == "postgres" && args.wakeup != "off") {
    notifier = std::make_shared<outbox::postgres::CommitNotifier>(
        outbox::postgres::CommitNotifier::Options{.connection_provider = writer_pool,
                                                  .table = table});
    options.writer_hooks.push_back(notifier);
  }
  auto writer = outbox::Outbox::writer_only(std::move(options));
  outbox::TransactionManager transactions(writer_pool, context);
  const int events = args.rate * args.seconds;
  const auto period = std::chrono::microseconds(1000000 / args.rate);
  auto next = Clock::now();
  for (int i = 0; i < events; ++i) {
    std::this_thread::sleep_until(next);
    next += period;
    auto tx = transactions.begin();
    const auto id = writer.writer().write(outbox::EventType::of("Pinged"), "{}");
    tx.commit();
    std::lock_guard lock(mutex);
    committed[*id] = Clock::now();
  }
  const auto deadline = Clock::now() + std::chrono::seconds(60);
  for (;;) {
    {
      std::lock_guard lock(mutex);
      if (static_cast<int>(latencies.size()) >= events || Clock::now() > deadline) {
        break;
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  const long long wakeups = counter(relay, "outbox_wakeups_total");
  const long long empty = counter(relay, "outbox_wakeups_empty_total");
  relay.stop();
  if (notifier) {
    notifier->close();
  }
  const auto notifies = notifier ? notifier->sent() : 0;
  outbox::testing::drop_outbox_tables(*pool->acquire(), table);
  std::lock_guard lock(mutex);
  std::printf(
      "wakeup-bench db=%s wakeup=%s interval_ms=%d rate=%d events=%d delivered=%zu p50_ms=%.1f "
      "p90_ms=%.1f p99_ms=%.1f max_ms=%.1f wakeups=%lld wakeups_empty=%lld notifies=%llu\n",
      dialect.c_str(), args.wakeup.c_str(), args.interval_ms, args.rate, events, latencies.size(),
      percentile(latencies, 0.5), percentile(latencies, 0.9), percentile(latencies, 0.99),
      percentile(latencies, 1.0), wakeups, empty, static_cast<unsigned long long>(notifies));
  return static_cast<int>(latencies.size()) == events ? 0 : 1;
} catch (const std::exception& e) {
  std::fprintf(stderr, "outbox-wakeup-bench: %s\n", e.what());
  return 2;
}
