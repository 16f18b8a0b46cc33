// What a lease costs on one engine: renewals per second on one connection (each one conditional
// statement on the database's clock), acquire + release pairs per second, and a status write with
// and without the fence. Usage: outbox-lease-bench DB_URL [SECONDS]. Prints one line.

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <stdexcept>
#include <string>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/sql/lease_store.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Runs `step` for `seconds`; returns calls per second.
template <typename Step>
double rate(double seconds, Step&& step) {
  const auto start = Clock::now();
  const auto end = start + std::chrono::duration<double>(seconds);
  long calls = 0;
  while (Clock::now() < end) {
    step();
    ++calls;
  }
  return static_cast<double>(calls) / std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: outbox-lease-bench DB_URL [SECONDS]\n");
    return 2;
  }
  const std::string url = argv[1];
  const double seconds = argc > 2 ? std::atof(argv[2]) : 2.0;
  try {
    auto pool = outbox::open_pool(url, 2);
    const std::string table = "lease_bench_" + std::to_string(::getpid());
    auto conn = pool->acquire();
    outbox::create_schema_for(*conn, table);
    auto leases = outbox::detect_lease_store(*conn, table);

    auto token = leases->acquire(*conn, "bench", "bench-owner", 60s);
    const double renew = rate(seconds, [&] {
      if (!leases->renew(*conn, *token, 60s)) {
        throw std::runtime_error("renewal refused");
      }
    });
    leases->release(*conn, *token);
    const double cycle = rate(seconds, [&] {
      auto t = leases->acquire(*conn, "cycle", "bench-owner", 60s);
      leases->release(*conn, *t);
    });

    // One status write per event, plain and fenced, on rows written for it.
    outbox::LeaseManager manager(
        {.connection_provider = pool, .store = leases, .ttl = 60s, .renew_interval = 20s});
    manager.try_acquire("leader");
    const auto& engine = outbox::engine_for(conn->dialect());
    auto plain = engine.make_store({.table = table});
    auto fenced = engine.make_store({.table = table, .fence = manager.fence("leader")});
    auto status_rate = [&](outbox::OutboxStore& store) {
      std::vector<outbox::EventEnvelope> events;
      for (int i = 0; i < 20000; ++i) {
        events.push_back(outbox::EventEnvelope::of_json(outbox::EventType::of("B"), "{}"));
      }
      store.insert_batch(*conn, events);
      std::size_t next = 0;
      return rate(seconds, [&] {
        store.mark_done(*conn, events.at(next++ % events.size()).event_id(),
                        std::chrono::system_clock::now());
      });
    };
    const double plain_writes = status_rate(*plain);
    const double fenced_writes = status_rate(*fenced);
    manager.close();
    conn->execute("DROP TABLE " + outbox::sql::lease_table_name(table));
    conn->execute("DROP TABLE " + table);
    std::printf(
        "engine=%s renew/s=%.0f acquire+release/s=%.0f mark_done/s plain=%.0f fenced=%.0f "
        "(fence cost %.1f %%)\n",
        std::string(conn->dialect()).c_str(), renew, cycle, plain_writes, fenced_writes,
        100.0 * (plain_writes - fenced_writes) / plain_writes);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-lease-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
