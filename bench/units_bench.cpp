// Google Benchmark units for the pieces on the hot path (BM_<Component>_<Op>).

#include <benchmark/benchmark.h>
#include <stdlib.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <mutex>
#include <thread>

#include "outbox/dispatcher.hpp"
#include "outbox/envelope.hpp"
#include "outbox/in_flight_tracker.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/internal/write_gate.hpp"
#include "outbox/sqlite/store.hpp"

namespace {

using namespace std::chrono_literals;

const std::string kPayload =
    R"({"orderId":"o-123456","amountCents":4200,"currency":"EUR",)"
    R"("items":[{"sku":"A-1","qty":2},{"sku":"B-7","qty":1}],)"
    R"("customer":{"id":"c-42","tier":"gold"},"note":"benchmark payload"})";

// A throwaway SQLite file with the outbox schema.
struct TempDb {
  TempDb() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "outbox-bench-XXXXXX").string();
    dir = mkdtemp(tmpl.data());
    pool = outbox::sqlite::make_pool(dir + "/b.db", 8);
    outbox::sqlite::create_schema(*pool->acquire());
  }
  ~TempDb() { std::filesystem::remove_all(dir); }
  std::string dir;
  std::shared_ptr<outbox::sql::ConnectionPool> pool;
  std::shared_ptr<outbox::sqlite::SqliteOutboxStore> store =
      std::make_shared<outbox::sqlite::SqliteOutboxStore>();
};

outbox::EventEnvelope make_event() {
  return outbox::EventEnvelope::builder(outbox::EventType::of("OrderPlaced"))
      .aggregate_type(outbox::AggregateType::of("Order"))
      .aggregate_id("o-123456")
      .header("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
      .payload_json(kPayload)
      .build();
}

void BM_Ulid_New(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(outbox::new_ulid());
  }
}
BENCHMARK(BM_Ulid_New);

void BM_Envelope_Build(benchmark::State& state) {
  for (auto _ : state) {
    benchmark::DoNotOptimize(make_event());
  }
}
BENCHMARK(BM_Envelope_Build);

void BM_Envelope_Copy(benchmark::State& state) {
  const auto e = make_event();
  for (auto _ : state) {
    outbox::EventEnvelope copy = e;  // shares payload and headers: no byte is copied
    benchmark::DoNotOptimize(copy);
  }
}
BENCHMARK(BM_Envelope_Copy);

const outbox::Headers kHeaders{
    {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    {"source", "orders-service"},
    {"note", "quote \" and \\ and \xC3\xA9"}};

void BM_JsonCodec_Encode(benchmark::State& state) {
  const auto& codec = outbox::JsonCodec::default_codec();
  for (auto _ : state) {
    benchmark::DoNotOptimize(codec.to_json(kHeaders));
  }
}
BENCHMARK(BM_JsonCodec_Encode);

void BM_JsonCodec_Parse(benchmark::State& state) {
  const auto& codec = outbox::JsonCodec::default_codec();
  const std::string json = *codec.to_json(kHeaders);
  for (auto _ : state) {
    benchmark::DoNotOptimize(codec.parse_object(json));
  }
}
BENCHMARK(BM_JsonCodec_Parse);

void BM_InFlightTracker_AcquireRelease(benchmark::State& state) {
  outbox::DefaultInFlightTracker tracker;
  const std::string id = outbox::new_ulid();
  for (auto _ : state) {
    benchmark::DoNotOptimize(tracker.try_acquire(id));
    tracker.release(id);
  }
}
BENCHMARK(BM_InFlightTracker_AcquireRelease)->Threads(1)->Threads(2);

// enqueue_hot → listener running on a worker, one event at a time (round trip of the hand-off;
// the DONE marks are written meanwhile by the group commit).
void BM_Dispatcher_HotHandoff(benchmark::State& state) {
  TempDb db;
  std::mutex m;
  std::condition_variable cv;
  std::uint64_t seen = 0;
  auto listeners = std::make_shared<outbox::DefaultListenerRegistry>();
  listeners->register_listener(outbox::AggregateType::of("Order"),
                               outbox::EventType::of("OrderPlaced"), [&](const auto&) {
                                 {
                                   std::lock_guard lock(m);
                                   ++seen;
                                 }
                                 cv.notify_one();
                               });
  outbox::OutboxDispatcher d({.connection_provider = db.pool,
                              .store = db.store,
                              .listeners = listeners,
                              .worker_count = 2});
  d.start();
  std::uint64_t sent = 0;
  for (auto _ : state) {
    state.PauseTiming();
    auto e = make_event();  // a fresh id each time: never a duplicate of an event in flight
    state.ResumeTiming();
    while (!d.enqueue_hot(outbox::QueuedEvent{std::move(e), outbox::QueuedEvent::Source::Hot, 0})) {
    }
    ++sent;
    std::unique_lock lock(m);
    cv.wait(lock, [&] { return seen >= sent; });
  }
  d.close();
}
BENCHMARK(BM_Dispatcher_HotHandoff)->UseRealTime();

// From the holder's release to the waiter's return from take(), after a hold of 5 ms (a long
// write): the waiter is asleep by then, so this is how long the gate sits free before it runs.
void BM_SqliteWriteGate_HandoverAfterHold(benchmark::State& state) {
  using Clock = std::chrono::steady_clock;
  outbox::sqlite::internal::WriteGate gate;
  for (auto _ : state) {
    gate.take(std::chrono::milliseconds(0));
    std::atomic<Clock::rep> taken_at{0};
    std::thread waiter([&] {
      if (gate.take(std::chrono::seconds(10))) {
        taken_at = Clock::now().time_since_epoch().count();
        gate.release();
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const auto released = Clock::now();
    gate.release();
    waiter.join();
    state.SetIterationTime(std::chrono::duration<double>(Clock::duration(taken_at.load()) -
                                                         released.time_since_epoch())
                               .count());
  }
}
BENCHMARK(BM_SqliteWriteGate_HandoverAfterHold)
    ->UseManualTime()
    ->Iterations(200)  // each holds 5 ms: the default count would take minutes
    ->Unit(benchmark::kMicrosecond);

void BM_Sqlite_InsertAutocommit(benchmark::State& state) {
  TempDb db;
  auto conn = db.pool->acquire();
  for (auto _ : state) {
    db.store->insert_new(*conn, make_event());
  }
}
BENCHMARK(BM_Sqlite_InsertAutocommit);

void BM_Sqlite_InsertBatch100(benchmark::State& state) {
  TempDb db;
  auto conn = db.pool->acquire();
  for (auto _ : state) {
    std::vector<outbox::EventEnvelope> batch;
    for (int i = 0; i < 100; ++i) {
      batch.push_back(make_event());
    }
    conn->begin();
    db.store->insert_batch(*conn, batch);
    conn->commit();
  }
  state.SetItemsProcessed(state.iterations() * 100);
}
BENCHMARK(BM_Sqlite_InsertBatch100);

void BM_Sqlite_ClaimAndMark100(benchmark::State& state) {
  TempDb db;
  auto conn = db.pool->acquire();
  for (auto _ : state) {
    state.PauseTiming();
    std::vector<outbox::EventEnvelope> batch;
    for (int i = 0; i < 100; ++i) {
      batch.push_back(make_event());
    }
    conn->begin();
    db.store->insert_batch(*conn, batch);
    conn->commit();
    state.ResumeTiming();
    auto rows =
        db.store->claim_pending(*conn, "bench", std::chrono::system_clock::now(), 5min, 0us, 100);
    std::vector<std::string> ids;
    for (const auto& r : rows) {
      ids.push_back(r.event_id);
    }
    db.store->mark_done_batch(*conn, ids, std::chrono::system_clock::now());
  }
  state.SetItemsProcessed(state.iterations() * 100);
}
BENCHMARK(BM_Sqlite_ClaimAndMark100);

}  // namespace

int main(int argc, char** argv) {
  outbox::set_log_level(outbox::LogLevel::Error);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
