// What message groups cost and give on one engine, in one run (one multi-node Outbox, 16
// workers, a listener that counts):
// - plain: a backlog of N events without a group, drained: events/s;
// - grouped: the same backlog spread over G groups, drained with groups on: events/s, the ratio
//   to plain, and the most groups running at once;
// - blocked: the grouped backlog again with one group whose head always fails (policy block, one
//   attempt): events/s of the other groups, and the ratio to grouped;
// - memory: the process's resident set before the grouped drain and its peak during it.
// Usage: outbox-groups-bench DB_URL [EVENTS] [GROUPS]. Prints one line per figure.

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "outbox/dispatcher.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/listener.hpp"
#include "outbox/outbox.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/tables.hpp"

namespace {

using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Resident set size in MiB (Linux).
double rss_mib() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE)) /
         (1024.0 * 1024.0);
}

struct Result {
  double events_per_second = 0;
  std::size_t most_groups = 0;
  double peak_rss = 0;
};

struct Bench {
  std::string url;
  std::string table;
  std::shared_ptr<outbox::sql::ConnectionPool> pool;
  int tables = 0;

  void fresh_table() {
    table = "groups_bench_" + std::to_string(::getpid()) + "_" + std::to_string(++tables);
    outbox::create_schema_for(*pool->acquire(), table);
  }
  void drop_table() {
    if (url.starts_with("sqlite")) {
      return;
    }
    outbox::testing::drop_outbox_tables(*pool->acquire(), table);
  }
  // `groups` 0: no group. Events are spread round-robin, so every group's events interleave.
  void write_backlog(int events, int groups) {
    auto conn = pool->acquire();
    auto store = outbox::detect_store(*conn, table);
    std::vector<outbox::EventEnvelope> batch;
    for (int i = 0; i < events; ++i) {
      auto b = outbox::EventEnvelope::builder(outbox::EventType::of("B"))
                   .aggregate_id("a" + std::to_string(i % 1000))
                   .payload_json("{\"n\":" + std::to_string(i) + ",\"pad\":\"" +
                                 std::string(100, 'x') + "\"}");
      if (groups > 0) {
        b.message_group("g" + std::to_string(i % groups));
      }
      batch.push_back(b.build());
      if (batch.size() == 500 || i + 1 == events) {
        conn->begin();
        store->insert_batch(*conn, batch);
        conn->commit();
        batch.clear();
      }
    }
    // As a table that has been in use would be: without statistics PostgreSQL reads the whole
    // table for a DONE mark by ids.
    if (conn->dialect() == "postgres") {
      conn->execute("ANALYZE " + table);
    } else if (conn->dialect() == "mysql") {
      conn->execute("ANALYZE TABLE " + table);
    }
  }
  // Drains the table until `expected` events were delivered; with `groups`, message groups on
  // and, with `blocked`, group "g0" failing for good at its head.
  Result drain(long expected, bool groups, bool blocked) {
    std::shared_ptr<outbox::LeaseStore> lease_store;
    std::shared_ptr<outbox::OutboxStore> store;
    std::shared_ptr<outbox::GroupStore> group_store;
    {
      auto conn = pool->acquire();
      lease_store = outbox::detect_lease_store(*conn, table);
      store = outbox::detect_store(*conn, table);
      group_store = outbox::detect_group_store(*conn, table);
    }
    auto registry = std::make_shared<outbox::DefaultListenerRegistry>();
    std::atomic<long> delivered{0};
    registry->register_listener(outbox::EventType::of("B"), [&](const outbox::EventEnvelope& e) {
      if (blocked && e.message_group() == "g0") {
        throw std::runtime_error("endpoint down for g0");
      }
      delivered.fetch_add(1, std::memory_order_relaxed);
    });
    auto leases = std::make_shared<outbox::LeaseManager>(
        outbox::LeaseManager::Options{.connection_provider = pool,
                                      .store = lease_store,
                                      .owner = "bench",
                                      .ttl = 5s,
                                      .renew_interval = 1s});
    outbox::Outbox::Options o{
        .connection_provider = pool,
        .tx_context = std::make_shared<outbox::ThreadLocalTxContext>(),
        .store = store,
        .listeners = registry,
        .claim_locking = outbox::ClaimLocking{.owner = "bench", .lock_timeout = 60s},
        .dispatcher = {.retry_policy =
                           std::make_shared<outbox::ExponentialBackoffRetryPolicy>(1s, 1s, false),
                       .max_attempts = 1,
                       .worker_count = 16,
                       .cold_queue_capacity = 2000},
        .poller = {.batch_size = 500, .interval = 10ms}};
    if (groups) {
      o.groups = outbox::Outbox::Groups{
          .leases = leases, .store = group_store, .max_concurrent_groups = 64};
    }
    Result r;
    const double rss_before = rss_mib();
    auto outbox = outbox::Outbox::multi_node(std::move(o));
    const auto t0 = SteadyClock::now();
    outbox.start();
    while (delivered.load() < expected) {
      r.peak_rss = std::max(r.peak_rss, rss_mib());
      std::this_thread::sleep_for(20ms);
    }
    r.events_per_second = static_cast<double>(expected) / since(t0);
    r.most_groups = outbox.dispatcher()->max_active_groups_seen();
    outbox.close();
    leases->close();
    r.peak_rss = std::max(r.peak_rss, rss_mib()) - rss_before;
    return r;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s DB_URL [EVENTS] [GROUPS]\n", argv[0]);
    return 2;
  }
  Bench b;
  b.url = argv[1];
  const int events = argc > 2 ? std::atoi(argv[2]) : 100000;
  const int groups = argc > 3 ? std::atoi(argv[3]) : 1000;
  b.pool = outbox::open_pool(b.url, 24);
  const std::string engine = std::string(b.pool->acquire()->dialect());
  const std::string where = engine + " " + std::to_string(events) + " events";

  b.fresh_table();
  b.write_backlog(events, 0);
  const auto plain = b.drain(events, false, false);
  b.drop_table();
  std::printf("groups %s: plain (no group) drain %.0f events/s\n", where.c_str(),
              plain.events_per_second);

  b.fresh_table();
  b.write_backlog(events, groups);
  const double rss_start = rss_mib();
  const auto grouped = b.drain(events, true, false);
  b.drop_table();
  std::printf(
      "groups %s: %d groups drain %.0f events/s = %.2f of plain; at most %zu groups running at "
      "once (cap 64)\n",
      where.c_str(), groups, grouped.events_per_second,
      grouped.events_per_second / plain.events_per_second, grouped.most_groups);
  std::printf(
      "groups %s: memory %.0f MiB resident before the grouped drain, +%.0f MiB at its peak\n",
      where.c_str(), rss_start, grouped.peak_rss);

  b.fresh_table();
  b.write_backlog(events, groups);
  const long per_group = events / groups;
  const auto blocked = b.drain(events - per_group, true, true);
  b.drop_table();
  std::printf(
      "groups %s: one group blocked, the other %d drain %.0f events/s = %.2f of all groups "
      "flowing\n",
      where.c_str(), groups - 1, blocked.events_per_second,
      blocked.events_per_second / grouped.events_per_second);
  return 0;
}
