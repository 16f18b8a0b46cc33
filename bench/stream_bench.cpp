// What stream mode costs and gives on one engine, in one run:
// - backlog: N events written, then one subscription reads them all and hands them to the log
//   publisher (to /dev/null), beside a claim drain of the same backlog (claim 500 + one batched
//   DONE mark per page, one thread): events/s of each and their ratio;
// - fan-out: 3 subscriptions reading the same backlog at once: events/s summed over them;
// - MariaDB: the sequencer's cost per event (numbering the backlog, alone);
// - live: a writer commits one event every 2 ms for `seconds`; write → publish latency p50/p99
//   (from the event's occurred_at, taken just before its insert and commit) of a subscription woken
//   by the writer's process (as an in-process runner is), then of one that only polls every 100 ms
//   (a writer in another process; on MariaDB the sequencer polls every 100 ms as well).
// Usage: outbox-stream-bench DB_URL [EVENTS] [SECONDS]. Prints one line per figure.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/relay/log_publisher.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/subscription.hpp"
#include "tests/support/tables.hpp"

namespace {

using SteadyClock = std::chrono::steady_clock;
using namespace std::chrono_literals;

double since(SteadyClock::time_point t0) {
  return std::chrono::duration<double>(SteadyClock::now() - t0).count();
}

// Counts what it is handed (and forwards to the log publisher for its serialization cost).
class Counting final : public outbox::Publisher {
 public:
  explicit Counting(std::shared_ptr<outbox::Publisher> next) : next_(std::move(next)) {}
  std::vector<outbox::PublishResult> publish(
      std::span<const outbox::PublishRequest> batch) override {
    auto results = next_->publish(batch);
    const auto now = std::chrono::system_clock::now();
    {
      std::lock_guard lock(mutex_);
      for (const auto& r : batch) {
        latencies_.push_back(
            std::chrono::duration<double, std::milli>(now - r.event->occurred_at()).count());
      }
    }
    count_ += static_cast<long>(batch.size());
    return results;
  }
  long count() const { return count_; }
  std::vector<double> latencies() {
    std::lock_guard lock(mutex_);
    return latencies_;
  }

 private:
  std::shared_ptr<outbox::Publisher> next_;
  std::atomic<long> count_{0};
  std::mutex mutex_;  // guards latencies_
  std::vector<double> latencies_;
};

struct Bench {
  std::string url;
  std::string table;
  std::shared_ptr<outbox::sql::ConnectionPool> pool;
  std::shared_ptr<outbox::OutboxStore> store;
  std::shared_ptr<outbox::StreamStore> stream;

  void fresh_table() {
    table = "stream_bench_" + std::to_string(::getpid()) + "_" + std::to_string(++tables_);
    auto conn = pool->acquire();
    outbox::create_schema_for(*conn, table);
    store = outbox::detect_store(*conn, table);
    stream = outbox::detect_stream_store(*conn, table);
  }
  void drop_table() {
    if (url.starts_with("sqlite")) {
      return;
    }
    outbox::testing::drop_outbox_tables(*pool->acquire(), table);
  }
  void write_backlog(int events) {
    auto conn = pool->acquire();
    std::vector<outbox::EventEnvelope> batch;
    for (int i = 0; i < events; ++i) {
      batch.push_back(outbox::EventEnvelope::builder(outbox::EventType::of("BenchEvent"))
                          .aggregate_id("a" + std::to_string(i % 100))
                          .tag("k", std::to_string(i % 10))
                          .payload_json("{\"n\":" + std::to_string(i) + ",\"pad\":\"" +
                                        std::string(100, 'x') + "\"}")
                          .build());
      if (batch.size() == 500 || i + 1 == events) {
        conn->begin();
        store->insert_batch(*conn, batch);
        conn->commit();
        batch.clear();
      }
    }
  }
  // Runs `subs` subscriptions from the start until each has read `events`; events/s summed.
  double read_backlog(int subs, int events) {
    auto log = std::make_shared<outbox::relay::LogPublisher>("/dev/null");
    outbox::SubscriptionRunner::Options o{.connection_provider = pool, .store = stream};
    std::vector<std::shared_ptr<Counting>> counters;
    for (int i = 0; i < subs; ++i) {
      counters.push_back(std::make_shared<Counting>(log));
      o.subscriptions.push_back({.spec = {"bench" + std::to_string(i), {}, "log", ""},
                                 .publisher = counters.back(),
                                 .schedule = {.poll_interval = 10ms, .batch_size = 1000}});
    }
    outbox::SubscriptionRunner runner(std::move(o));
    const auto t0 = SteadyClock::now();
    runner.start();
    for (const auto& c : counters) {
      while (c->count() < events) {
        std::this_thread::sleep_for(1ms);
      }
    }
    const double secs = since(t0);
    runner.close();
    return static_cast<double>(subs) * events / secs;
  }
  double claim_drain(int events) {
    auto conn = pool->acquire();
    const auto t0 = SteadyClock::now();
    int drained = 0;
    while (drained < events) {
      const auto now = std::chrono::system_clock::now();
      const auto rows = store->claim_pending(*conn, "bench", now, 60s, 0us, 500);
      if (rows.empty()) {
        break;
      }
      std::vector<std::string> ids;
      for (const auto& r : rows) {
        ids.push_back(r.event_id);
      }
      store->mark_done_batch(*conn, ids, now, "bench");
      drained += static_cast<int>(ids.size());
    }
    return drained / since(t0);
  }
  // The sequencer alone over a backlog: microseconds per event.
  double sequencer_cost() {
    auto conn = pool->acquire();
    const auto t0 = SteadyClock::now();
    int numbered = 0;
    while (int n = stream->sequence(*conn, 1000)) {
      numbered += n;
    }
    return numbered == 0 ? 0 : since(t0) * 1e6 / numbered;
  }
  // One subscription woken by the writer; commit → publish latency percentiles (ms).
  std::pair<double, double> live_latency(double seconds, bool woken) {
    auto counter =
        std::make_shared<Counting>(std::make_shared<outbox::relay::LogPublisher>("/dev/null"));
    outbox::SubscriptionRunner runner(
        {.connection_provider = pool,
         .store = stream,
         .subscriptions = {{.spec = {"live", {}, "log", ""},
                            .publisher = counter,
                            .schedule = {.poll_interval = woken ? 500ms : 100ms,
                                         .batch_size = 100,
                                         .backoff_threshold = 1000000},
                            .start_at_end = true}},
         .sequencer_interval = 100ms});
    runner.start();
    auto conn = pool->acquire();
    const auto end = SteadyClock::now() + std::chrono::duration<double>(seconds);
    long written = 0;
    while (SteadyClock::now() < end) {
      store->insert_new(
          *conn,
          outbox::EventEnvelope::builder(outbox::EventType::of("Live")).payload_json("{}").build());
      ++written;
      if (woken) {
        runner.wake();
      }
      std::this_thread::sleep_for(2ms);
    }
    while (counter->count() < written) {
      std::this_thread::sleep_for(1ms);
    }
    runner.close();
    auto l = counter->latencies();
    std::sort(l.begin(), l.end());
    auto pct = [&](double p) {
      return l.empty() ? 0.0 : l[static_cast<std::size_t>(p * (l.size() - 1))];
    };
    return {pct(0.5), pct(0.99)};
  }

 private:
  int tables_ = 0;
};

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: outbox-stream-bench DB_URL [EVENTS] [SECONDS]\n");
    return 2;
  }
  Bench b;
  b.url = argv[1];
  const int events = argc > 2 ? std::atoi(argv[2]) : 100000;
  const double seconds = argc > 3 ? std::atof(argv[3]) : 5.0;
  try {
    b.pool = outbox::open_pool(b.url, 8);
    const std::string engine(b.pool->acquire()->dialect());

    b.fresh_table();
    b.write_backlog(events);
    std::string sequencer;
    if (b.stream->needs_sequencer()) {
      char buf[96];
      std::snprintf(buf, sizeof buf, " sequencer_us/event=%.1f", b.sequencer_cost());
      sequencer = buf;
    }
    const double one = b.read_backlog(1, events);
    const double drain = b.claim_drain(events);
    std::printf("stream %s events=%d subscription_read/s=%.0f claim_drain/s=%.0f ratio=%.2f%s\n",
                engine.c_str(), events, one, drain, one / drain, sequencer.c_str());
    b.drop_table();

    b.fresh_table();
    b.write_backlog(events);
    b.sequencer_cost();
    std::printf("stream %s events=%d fanout_3_subscriptions/s=%.0f (summed)\n", engine.c_str(),
                events, b.read_backlog(3, events));
    b.drop_table();

    for (const bool woken : {true, false}) {
      b.fresh_table();
      const auto [p50, p99] = b.live_latency(seconds, woken);
      std::printf("stream %s live %s write_to_publish_ms p50=%.1f p99=%.1f\n", engine.c_str(),
                  woken ? "woken_by_writer" : "polling_100ms", p50, p99);
      b.drop_table();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-stream-bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
