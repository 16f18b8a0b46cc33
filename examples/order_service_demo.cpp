// outbox-demo: an order service on an embedded SQLite file. Each business transaction inserts an
// order row and writes its event through the outbox; the demo then shows the hot path, a rollback,
// a hot-queue overflow recovered by the poller, and a failing listener going RETRY -> DEAD and
// being replayed. Usage: outbox-demo PATH.db   (PATH must not exist yet)

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "outbox/dead_event_manager.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/outbox.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/transaction.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Commit instants per event id (recorded by an after-commit callback registered before the
// writer's, so it runs first) and the commit -> listener latencies measured from them.
class LatencyBook {
 public:
  void committed(const std::string& id) {
    std::lock_guard lock(mutex_);
    commit_at_[id] = Clock::now();
  }
  void delivered(const std::string& id) {
    const auto now = Clock::now();
    std::lock_guard lock(mutex_);
    auto it = commit_at_.find(id);
    if (it != commit_at_.end()) {
      latencies_us_.push_back(std::chrono::duration<double, std::micro>(now - it->second).count());
      commit_at_.erase(it);
    }
  }
  double percentile(double p) {
    std::lock_guard lock(mutex_);
    if (latencies_us_.empty()) {
      return 0;
    }
    auto v = latencies_us_;
    std::sort(v.begin(), v.end());
    const auto idx = static_cast<std::size_t>(p * static_cast<double>(v.size() - 1));
    return v[idx];
  }
  std::size_t samples() {
    std::lock_guard lock(mutex_);
    return latencies_us_.size();
  }

 private:
  std::mutex mutex_;
  std::unordered_map<std::string, Clock::time_point> commit_at_;
  std::vector<double> latencies_us_;
};

// Bounded wait for a condition, polling every few milliseconds.
bool wait_for(const std::function<bool()>& cond, std::chrono::seconds timeout = 30s) {
  const auto deadline = Clock::now() + timeout;
  while (!cond()) {
    if (Clock::now() > deadline) {
      return false;
    }
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// Restores the default log sink when the demo's counters go out of scope.
struct LogSinkGuard {
  ~LogSinkGuard() { outbox::set_log_sink({}); }
};

int run(const std::string& path) {
  std::atomic<int> warnings{0};
  LogSinkGuard sink_guard;
  outbox::set_log_sink([&](outbox::LogLevel level, std::string_view msg) {
    if (level == outbox::LogLevel::Warning) {
      ++warnings;  // hot-queue drops and retries are expected here; counted in the summary
    } else if (level == outbox::LogLevel::Error) {
      std::printf("    log: %.*s\n", static_cast<int>(msg.size()), msg.data());
    }
  });

  auto pool = outbox::sqlite::make_pool(path, 4);
  {
    auto conn = pool->acquire();
    outbox::sqlite::create_schema(*conn);
    conn->execute(
        "CREATE TABLE orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, amount_cents "
        "INTEGER NOT NULL)");
  }
  auto store = std::make_shared<outbox::sqlite::SqliteOutboxStore>();
  auto tx_context = std::make_shared<outbox::ThreadLocalTxContext>();
  outbox::TransactionManager tx(pool, tx_context);
  auto listeners = std::make_shared<outbox::DefaultListenerRegistry>();
  auto metrics = std::make_shared<outbox::InMemoryMetrics>();
  LatencyBook latency;
  std::atomic<int> delivered{0};
  std::atomic<bool> gateway_up{false};
  std::atomic<int> payment_attempts{0};

  const auto order = outbox::AggregateType::of("Order");
  listeners->register_listener(order, outbox::EventType::of("OrderPlaced"),
                               [&](const outbox::EventEnvelope& e) {
                                 latency.delivered(e.event_id());
                                 ++delivered;
                               });
  listeners->register_listener(order, outbox::EventType::of("PaymentRequested"),
                               [&](const outbox::EventEnvelope&) {
                                 ++payment_attempts;
                                 if (!gateway_up) {
                                   throw std::runtime_error("payment gateway unavailable");
                                 }
                                 ++delivered;
                               });

  auto ob = outbox::Outbox::single_node({
      .connection_provider = pool,
      .tx_context = tx_context,
      .store = store,
      .listeners = listeners,
      .metrics = metrics,
      .dispatcher = {.retry_policy =
                         std::make_shared<outbox::ExponentialBackoffRetryPolicy>(50ms, 200ms),
                     .max_attempts = 3,
                     .worker_count = 2,
                     .hot_queue_capacity = 64},
      .poller = {.batch_size = 200, .interval = 100ms},
  });
  ob.start();
  int written = 0;
  auto place_order = [&](int n, const std::string& type) {
    auto t = tx.begin();
    const std::string order_id = "order-" + std::to_string(n);
    t.connection().execute(
        "INSERT INTO orders VALUES (?, ?, ?)",
        {order_id, std::string("customer-") + std::to_string(n % 17), std::int64_t{1000 + n}});
    auto event = outbox::EventEnvelope::builder(outbox::EventType::of(type))
                     .aggregate_type(outbox::AggregateType::of("Order"))
                     .aggregate_id(order_id)
                     .header("source", "outbox-demo")
                     .payload_json(R"({"orderId":")" + order_id + R"(","amountCents":)" +
                                   std::to_string(1000 + n) + "}")
                     .build();
    tx_context->after_commit([&latency, id = event.event_id()] { latency.committed(id); });
    ob.writer().write(event);
    t.commit();
    ++written;
  };
  auto done_count = [&] { return store->count_by_status(*pool->acquire())[1]; };
  auto dead_count = [&] { return store->count_by_status(*pool->acquire())[3]; };

  std::printf("outbox-demo on %s\n\n", path.c_str());

  std::printf("1. hot path: 2000 orders, one business transaction each\n");
  const auto t1 = Clock::now();
  for (int i = 0; i < 2000; ++i) {
    place_order(i, "OrderPlaced");
  }
  if (!wait_for([&] { return done_count() == 2000; })) {
    std::printf("   FAILED: not all events reached DONE\n");
    return 1;
  }
  const double secs = std::chrono::duration<double>(Clock::now() - t1).count();
  std::printf("   2000 committed and DONE in %.2f s; commit->listener p50 %.0f us, p99 %.0f us\n\n",
              secs, latency.percentile(0.50), latency.percentile(0.99));

  std::printf("2. rollback: an order and its event written, then the transaction rolls back\n");
  const int before = delivered.load();
  std::string rolled_back_id;
  {
    auto t = tx.begin();
    t.connection().execute("INSERT INTO orders VALUES ('order-rolled-back', 'c', 1)");
    rolled_back_id =
        *ob.writer().write(outbox::EventEnvelope::builder(outbox::EventType::of("OrderPlaced"))
                               .aggregate_type(order)
                               .payload_json("{}")
                               .build());
    t.rollback();
  }
  ob.poller()->poll();
  const bool no_row = !store->find(*pool->acquire(), rolled_back_id);
  const bool no_order = pool->acquire()
                            ->query("SELECT COUNT(*) FROM orders WHERE id = 'order-rolled-back'")
                            .at(0)
                            .get_int(0) == 0;
  std::printf("   outbox row: %s, order row: %s, deliveries: %d\n\n", no_row ? "absent" : "PRESENT",
              no_order ? "absent" : "PRESENT", delivered.load() - before);
  if (!no_row || !no_order || delivered.load() != before) {
    return 1;
  }

  std::printf("3. overflow: 3000 events in one transaction, hot queue holds 64\n");
  const auto dropped_before = metrics->snapshot().hot_dropped;
  const auto cold_before = metrics->snapshot().cold_enqueued;
  const auto t3 = Clock::now();
  {
    auto t = tx.begin();
    std::vector<outbox::EventEnvelope> burst;
    for (int i = 0; i < 3000; ++i) {
      burst.push_back(outbox::EventEnvelope::builder(outbox::EventType::of("OrderPlaced"))
                          .aggregate_type(outbox::AggregateType::of("Order"))
                          .aggregate_id("bulk-" + std::to_string(i))
                          .payload_json("{}")
                          .build());
    }
    ob.writer().write_all(std::move(burst));
    t.commit();
    written += 3000;
  }
  if (!wait_for([&] { return done_count() == 5000; })) {
    std::printf("   FAILED: the poller did not recover the dropped events\n");
    return 1;
  }
  const auto m3 = metrics->snapshot();
  std::printf(
      "   %lld dropped from the hot queue, %lld recovered by the poller, all DONE in %.2f s\n\n",
      static_cast<long long>(m3.hot_dropped - dropped_before),
      static_cast<long long>(m3.cold_enqueued - cold_before),
      std::chrono::duration<double>(Clock::now() - t3).count());

  std::printf("4. failing listener: 5 payments while the gateway is down (max 3 attempts)\n");
  for (int i = 0; i < 5; ++i) {
    place_order(10000 + i, "PaymentRequested");
  }
  if (!wait_for([&] { return dead_count() == 5; })) {
    std::printf("   FAILED: payments did not reach DEAD\n");
    return 1;
  }
  outbox::DeadEventManager dead(pool, store);
  auto dead_rows = dead.query(std::string_view("PaymentRequested"), std::nullopt, 10);
  std::printf("   %zu DEAD after %d attempts in all; last_error: \"%s\"\n", dead_rows.size(),
              payment_attempts.load(), dead_rows.empty() ? "" : dead_rows[0].last_error->c_str());
  gateway_up = true;
  const int replayed = dead.replay_all(std::string_view("PaymentRequested"), std::nullopt).replayed;
  if (!wait_for([&] { return done_count() == 5005; })) {
    std::printf("   FAILED: replayed payments were not delivered\n");
    return 1;
  }
  std::printf("   gateway back: %d replayed, all DONE\n\n", replayed);

  ob.close();
  const auto counts = store->count_by_status(*pool->acquire());
  const auto m = metrics->snapshot();
  std::printf("summary\n");
  std::printf("  %-34s %10d\n", "events written (committed)", written);
  std::printf("  %-34s %10d\n", "listener deliveries", delivered.load());
  std::printf("  %-34s %10lld\n", "rows DONE", static_cast<long long>(counts[1]));
  std::printf("  %-34s %10lld\n", "rows DEAD now", static_cast<long long>(counts[3]));
  std::printf("  %-34s %10lld\n", "events that went DEAD", static_cast<long long>(m.dispatch_dead));
  std::printf("  %-34s %10d\n", "dead events replayed", replayed);
  std::printf("  %-34s %10lld\n", "hot path enqueued", static_cast<long long>(m.hot_enqueued));
  std::printf("  %-34s %10lld\n", "hot queue full (poller took them)",
              static_cast<long long>(m.hot_dropped));
  std::printf("  %-34s %10lld\n", "cold (poller) enqueued",
              static_cast<long long>(m.cold_enqueued));
  std::printf("  %-34s %10.0f\n", "commit->listener p50 (us)", latency.percentile(0.50));
  std::printf("  %-34s %10.0f\n", "commit->listener p99 (us)", latency.percentile(0.99));
  std::printf("  %-34s %10zu\n", "latency samples (hot path)", latency.samples());
  std::printf("  %-34s %10d\n", "warnings logged (drops, retries)", warnings.load());
  const bool ok = counts[1] == written && counts[3] == 0 && delivered.load() == written &&
                  m.status_update_failure == 0;
  std::printf("\n%s\n", ok ? "demo OK" : "demo FAILED: counts do not add up");
  return ok ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s PATH.db   (a new SQLite file)\n", argv[0]);
    return 2;
  }
  const std::string path = argv[1];
  if (std::filesystem::exists(path)) {
    std::fprintf(stderr, "outbox-demo: %s already exists; give a new path\n", path.c_str());
    return 2;
  }
  try {
    return run(path);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-demo: %s\n", e.what());
    return 1;
  }
}
