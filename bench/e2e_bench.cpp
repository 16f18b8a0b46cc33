// outbox-bench: end-to-end throughput and latency of the outbox on a real database, beside the SQL
// floor (the same business transactions with only the SQL an outbox minimally needs).
//
//   outbox-bench --db=URL [--mode=hot|poller|drain|writer] [--events=N] [--writers=W] [--per-tx=K]
//                [--payload=BYTES] [--workers=N] [--floor] [--poll-ms=MS] [--rate=TX_PER_S]
//                [--take=N]   (events a worker takes from the queue at once; default 1)
//                [--rounds=N] (--mode=writer: rounds of its three runs, medians; default 3)
//     URL: sqlite:///path.db | postgresql://… or "host=… dbname=…" | mysql://… / mariadb://…
//
// hot:    W writer threads run business transactions (UPDATE one of 10,000 accounts + K events);
//         the hot path delivers to a no-op listener; the poller backs it up.
// poller: the same writers without the hot path; only the poller delivers.
// drain:  N events are inserted first (bulk), then a claim-locking poller drains them.
// writer: the writer's own cost: the business transactions alone (UPDATE only), with one bare
//         outbox INSERT per event, and with OutboxWriter::write_all; nothing is delivered. Prints
//         each in events/s and the ratios (writer/bare ≥ 0.95 is issue "performance, second
//         round"'s target).
// --floor also runs the floor for the mode and prints ours/floor. Progress goes to stderr once a
// second; the result is one line on stdout.

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "outbox/dispatcher.hpp"
#include "outbox/errors.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/transaction.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

struct Config {
  std::string db;
  std::string mode = "hot";
  int events = 20000;
  int writers = 4;
  int per_tx = 1;
  int payload = 200;
  int workers = 4;
  bool floor = false;
  int poll_ms = 100;
  int take = 1;    // events a worker takes from the queue at once (dispatcher max_batch_size)
  int rate = 0;    ///< business transactions per second across all writers; 0 = as fast as possible
  int rounds = 3;  ///< --mode=writer: rounds of the three runs, medians printed
};

Config parse(int argc, char** argv) {
  Config c;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    const auto eq = a.find('=');
    const std::string key = a.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : a.substr(eq + 1);
    auto num = [&] {
      char* end = nullptr;
      const long v = std::strtol(value.c_str(), &end, 10);
      if (value.empty() || *end != '\0' || v < 0) {
        throw std::invalid_argument("bad number for " + key + ": '" + value + "'");
      }
      return static_cast<int>(v);
    };
    if (key == "--db") {
      c.db = value;
    } else if (key == "--mode") {
      c.mode = value;
    } else if (key == "--events") {
      c.events = num();
    } else if (key == "--writers") {
      c.writers = std::max(1, num());
    } else if (key == "--per-tx") {
      c.per_tx = std::max(1, num());
    } else if (key == "--payload") {
      c.payload = num();
    } else if (key == "--workers") {
      c.workers = std::max(1, num());
    } else if (key == "--floor") {
      c.floor = true;
    } else if (key == "--poll-ms") {
      c.poll_ms = std::max(1, num());
    } else if (key == "--rate") {
      c.rate = num();
    } else if (key == "--take") {
      c.take = std::max(1, num());
    } else if (key == "--rounds") {
      c.rounds = std::max(1, num());
    } else {
      throw std::invalid_argument("unknown flag " + key + " (see the header of e2e_bench.cpp)");
    }
  }
  if (c.db.empty()) {
    throw std::invalid_argument("--db=URL is required");
  }
  if (c.mode != "hot" && c.mode != "poller" && c.mode != "drain" && c.mode != "writer") {
    throw std::invalid_argument("--mode must be hot, poller, drain or writer");
  }
  return c;
}

// Parameter marker n (1-based) in the connection's dialect.
std::string mark(const outbox::sql::Connection& c, int n) {
  return c.dialect() == "postgres" ? "$" + std::to_string(n) : "?";
}

long peak_rss_mb() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss / 1024;
}

double pct(std::vector<double>& v, double p) {
  if (v.empty()) {
    return 0;
  }
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<std::size_t>(p * static_cast<double>(v.size())))];
}

// Prints a progress line to stderr once a second until stopped.
class Progress {
 public:
  explicit Progress(std::function<std::string()> line) : line_(std::move(line)) {
    thread_ = std::thread([this] {
      std::unique_lock lock(mutex_);
      while (!cv_.wait_for(lock, 1s, [&] { return stop_; })) {
        std::fprintf(stderr, "  … %s\n", line_().c_str());
      }
    });
  }
  ~Progress() {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  std::function<std::string()> line_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

struct Bench {
  Config cfg;
  std::shared_ptr<outbox::sql::ConnectionPool> pool;
  std::string table;
  std::shared_ptr<outbox::OutboxStore> store;
  std::string payload;

  void setup() {
    auto conn = pool->acquire();
    table = "bench_outbox_" + std::to_string(getpid());
    outbox::create_schema_for(*conn, table);
    store = outbox::detect_store(*conn, table);
    conn->execute("CREATE TABLE " + table +
                  "_accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)");
    conn->begin();
    for (int base = 0; base < 10000; base += 500) {
      std::string sql = "INSERT INTO " + table + "_accounts VALUES ";
      for (int i = base; i < base + 500; ++i) {
        sql += (i == base ? "(" : ",(") + std::to_string(i) + ",0)";
      }
      conn->execute(sql);
    }
    conn->commit();
    payload = R"({"seq":SEQ,"pad":")" +
              std::string(static_cast<std::size_t>(std::max(0, cfg.payload - 30)), 'x') + "\"}";
  }
  void teardown() {
    auto conn = pool->acquire();
    // The schema's companions too (lease, subscriptions, blocked groups): a server database
    // shared by many runs keeps nothing of them.
    for (const char* suffix : {"", "_accounts", "_lease", "_subscription", "_group_block"}) {
      conn->execute("DROP TABLE IF EXISTS " + table + suffix);
    }
  }
  std::string payload_for(int seq) const {
    std::string p = payload;
    p.replace(p.find("SEQ"), 3, std::to_string(seq));
    return p;
  }
  // Events first … first + count − 1 of the run, as the writers write them.
  std::vector<outbox::EventEnvelope> events(int first, int count) const {
    std::vector<outbox::EventEnvelope> batch;
    for (int i = first; i < first + count; ++i) {
      batch.push_back(outbox::EventEnvelope::builder(outbox::EventType::of("Bench"))
                          .payload_json(payload_for(i))
                          .build());
    }
    return batch;
  }
  std::string update_sql(const outbox::sql::Connection& c) const {
    return "UPDATE " + table + "_accounts SET balance = balance + 1 WHERE id = " + mark(c, 1);
  }

  // Runs W writer threads over `events` events, K per transaction; `write` does one transaction.
  double run_writers(const std::function<void(int first, int count, std::mt19937&)>& write) {
    std::atomic<int> next{0};
    const auto start = Clock::now();
    std::vector<std::thread> threads;
    for (int w = 0; w < cfg.writers; ++w) {
      threads.emplace_back([&, w] {
        std::mt19937 rng(static_cast<unsigned>(w + 1));
        for (;;) {
          const int first = next.fetch_add(cfg.per_tx);
          if (first >= cfg.events) {
            return;
          }
          if (cfg.rate > 0) {
            // Open-loop pacing: transaction k starts at k / rate seconds (the wait is the load
            // shape, not a delay the result depends on).
            const auto due =
                start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                            static_cast<double>(first / cfg.per_tx) / cfg.rate));
            std::this_thread::sleep_until(due);
          }
          write(first, std::min(cfg.per_tx, cfg.events - first), rng);
        }
      });
    }
    for (auto& t : threads) {
      t.join();
    }
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

  // The floor for hot/poller: the same business transactions with one plain outbox INSERT per
  // event, then batched mark-done of every id (100 per UPDATE). Returns {committed/s, marked/s}.
  std::pair<double, double> floor_writes() {
    std::string d;
    std::string insert;
    std::string update;
    {
      auto c = pool->acquire();
      d = std::string(c->dialect());
      insert = "INSERT INTO " + table +
               " (event_id, event_type, aggregate_type, payload, status, attempts, available_at, "
               "created_at) VALUES (" +
               mark(*c, 1) + ", 'Bench', '__GLOBAL__', " + mark(*c, 2) + ", 0, 0, ";
      if (d == "postgres") {
        insert += "now(), now())";
      } else if (d == "mysql") {
        insert += "UTC_TIMESTAMP(6), UTC_TIMESTAMP(6))";
      } else {
        insert += "?, ?)";
      }
      update = update_sql(*c);
    }
    std::mutex ids_mutex;
    std::vector<std::string> ids;
    const double secs = run_writers([&](int first, int count, std::mt19937& rng) {
      auto conn = pool->acquire();
      conn->begin();
      conn->execute(update, {std::int64_t{static_cast<int>(rng() % 10000)}});
      std::vector<std::string> mine;
      for (int i = 0; i < count; ++i) {
        mine.push_back(outbox::new_ulid());
        const std::string p = payload_for(first + i);
        if (d == "sqlite") {
          const auto now = outbox::to_micros(std::chrono::system_clock::now());
          conn->execute(insert,
                        {outbox::sql::TextRef{mine.back()}, outbox::sql::TextRef{p}, now, now});
        } else {
          conn->execute(insert, {outbox::sql::TextRef{mine.back()}, outbox::sql::TextRef{p}});
        }
      }
      conn->commit();
      std::lock_guard lock(ids_mutex);
      ids.insert(ids.end(), mine.begin(), mine.end());
    });
    const auto start = Clock::now();
    auto conn = pool->acquire();
    for (std::size_t i = 0; i < ids.size(); i += 100) {
      std::vector<std::string> batch(
          ids.begin() + static_cast<long>(i),
          ids.begin() + static_cast<long>(std::min(ids.size(), i + 100)));
      store->mark_done_batch(*conn, batch, std::chrono::system_clock::now());
    }
    const double mark_secs = std::chrono::duration<double>(Clock::now() - start).count();
    conn->execute("DELETE FROM " + table);
    return {cfg.events / secs, cfg.events / mark_secs};
  }

  // The floor for drain: claim 100 + batched mark-done in a loop until the backlog is empty.
  double floor_drain() {
    prefill();
    auto conn = pool->acquire();
    const auto start = Clock::now();
    int drained = 0;
    for (;;) {
      auto rows =
          store->claim_pending(*conn, "floor", std::chrono::system_clock::now(), 5min, 0us, 100);
      if (rows.empty()) {
        break;
      }
      std::vector<std::string> ids;
      for (const auto& r : rows) {
        ids.push_back(r.event_id);
      }
      store->mark_done_batch(*conn, ids, std::chrono::system_clock::now());
      drained += static_cast<int>(ids.size());
    }
    const double secs = std::chrono::duration<double>(Clock::now() - start).count();
    conn->execute("DELETE FROM " + table);
    vacuum(*conn);  // our run must not pay for the floor's dead rows
    return drained / secs;
  }

  void vacuum(outbox::sql::Connection& conn) const {
    if (conn.dialect() == "postgres") {
      conn.execute("VACUUM ANALYZE " + table);
    } else if (conn.dialect() == "mysql") {
      conn.execute("OPTIMIZE TABLE " + table);
    } else {
      conn.execute("VACUUM");
    }
  }

  void prefill() {
    auto conn = pool->acquire();
    for (int base = 0; base < cfg.events; base += 5000) {
      const auto batch = events(base, std::min(cfg.events, base + 5000) - base);
      conn->begin();
      store->insert_batch(*conn, batch);
      conn->commit();
    }
    // Fresh statistics, as autovacuum would have: a plan made for the empty table would sort
    // the whole backlog on every claim.
    if (conn->dialect() == "postgres") {
      conn->execute("ANALYZE " + table);
    }
  }

  // The business transactions alone: the UPDATE of one account, nothing for the outbox.
  double plain_writes() {
    std::string update;
    {
      auto c = pool->acquire();
      update = update_sql(*c);
    }
    const double secs = run_writers([&](int, int, std::mt19937& rng) {
      auto conn = pool->acquire();
      conn->begin();
      conn->execute(update, {std::int64_t{static_cast<int>(rng() % 10000)}});
      conn->commit();
    });
    return cfg.events / secs;
  }

  // --mode=writer: the three, in one run, on an emptied table each time.
  int run_writer_cost() {
    auto tx_context = std::make_shared<outbox::ThreadLocalTxContext>();
    outbox::TransactionManager tx(pool, tx_context);
    outbox::OutboxWriter writer(tx_context, store);
    std::string update;
    {
      auto c = pool->acquire();
      update = update_sql(*c);
    }
    // Rounds of the three, interleaved, and the median of each: one run of each in a fixed
    // order differed by up to ±10 % from the next (checkpoints, the file's free pages).
    std::vector<double> plains, bares, ourses;
    for (int round = 0; round < cfg.rounds; ++round) {
      plains.push_back(plain_writes());
      bares.push_back(floor_writes().first);  // empties the table after itself
      ourses.push_back(writer_writes(tx, writer, update));
    }
    const double plain = median(plains);
    const double bare = median(bares);
    const double ours = median(ourses);
    std::printf(
        "mode=writer engine=%s events=%d writers=%d per_tx=%d payload=%d rounds=%d plain/s=%.0f "
        "bare_insert/s=%.0f writer/s=%.0f writer_vs_bare=%.2f bare_vs_plain=%.2f "
        "writer_vs_plain=%.2f\n",
        std::string(pool->acquire()->dialect()).c_str(), cfg.events, cfg.writers, cfg.per_tx,
        cfg.payload, cfg.rounds, plain, bare, ours, ours / bare, bare / plain, ours / plain);
    teardown();
    return 0;
  }

  static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  }

  // The business transactions with OutboxWriter::write_all; empties the table after itself.
  double writer_writes(outbox::TransactionManager& tx, outbox::OutboxWriter& writer,
                       const std::string& update) {
    const double secs = run_writers([&](int first, int count, std::mt19937& rng) {
      for (;;) {
        try {
          auto t = tx.begin();
          t.connection().execute(update, {std::int64_t{static_cast<int>(rng() % 10000)}});
          writer.write_all(events(first, count));
          t.commit();
          return;
        } catch (const outbox::StoreError& e) {
          std::fprintf(stderr, "  write retried: %s\n", e.what());
        }
      }
    });
    pool->acquire()->execute("DELETE FROM " + table);
    return cfg.events / secs;
  }

  int run() {
    setup();
    if (cfg.mode == "writer") {
      return run_writer_cost();
    }
    const int n = cfg.events;
    std::vector<std::atomic<std::int64_t>> commit_ns(static_cast<std::size_t>(n));
    std::vector<std::atomic<std::int64_t>> latency_ns(static_cast<std::size_t>(n));
    std::vector<std::atomic<std::uint8_t>> seen(static_cast<std::size_t>(n));
    std::atomic<int> delivered{0};
    std::atomic<int> duplicates{0};
    std::atomic<int> committed{0};
    auto now_ns = [] {
      return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
          .count();
    };
    auto listeners = std::make_shared<outbox::DefaultListenerRegistry>();
    listeners->register_listener(
        outbox::EventType::of("Bench"), [&](const outbox::EventEnvelope& e) {
          // PostgreSQL's JSONB may reorder keys on the cold path: look the key up.
          const auto json = e.payload_json();
          const auto at = json.find("\"seq\":");
          const int seq = at == std::string_view::npos ? -1 : std::atoi(json.data() + at + 6);
          if (seq < 0 || seq >= n) {
            return;
          }
          if (seen[static_cast<std::size_t>(seq)].fetch_add(1) > 0) {
            ++duplicates;
            return;
          }
          const auto c = commit_ns[static_cast<std::size_t>(seq)].load();
          if (c > 0) {
            latency_ns[static_cast<std::size_t>(seq)] = now_ns() - c;
          }
          ++delivered;
        });
    auto metrics = std::make_shared<outbox::InMemoryMetrics>();
    auto tx_context = std::make_shared<outbox::ThreadLocalTxContext>();
    outbox::TransactionManager tx(pool, tx_context);
    outbox::Outbox::Options options{
        .connection_provider = pool,
        .tx_context = tx_context,
        .store = store,
        .listeners = listeners,
        .metrics = metrics,
        .dispatcher = {.worker_count = cfg.workers,
                       .hot_queue_capacity = 4096,
                       .max_batch_size = static_cast<std::size_t>(cfg.take)},
        .poller = {.batch_size = 500, .interval = std::chrono::milliseconds(cfg.poll_ms)},
    };
    double floor_committed = 0;
    double floor_marked = 0;
    double floor_rate = 0;
    if (cfg.floor) {
      if (cfg.mode == "drain") {
        floor_rate = floor_drain();
      } else {
        std::tie(floor_committed, floor_marked) = floor_writes();
      }
    }
    Progress progress([&] {
      return "committed " + std::to_string(committed.load()) + ", delivered " +
             std::to_string(delivered.load()) + ", DONE " +
             std::to_string(metrics->snapshot().dispatch_success) + ", rss " +
             std::to_string(peak_rss_mb()) + " MB";
    });
    // The WAL's largest size during the run (SQLite): a checkpoint policy that falls behind shows
    // here first.
    std::atomic<std::uintmax_t> peak_wal{0};
    std::atomic<bool> sampling{true};
    std::thread wal_sampler([&] {
      if (cfg.db.rfind("sqlite://", 0) != 0) {
        return;
      }
      const std::string wal = cfg.db.substr(9) + "-wal";
      while (sampling) {
        std::error_code ec;
        const auto size = std::filesystem::file_size(wal, ec);
        if (!ec && size > peak_wal) {
          peak_wal = size;
        }
        std::this_thread::sleep_for(10ms);  // the sampling period
      }
    });
    double write_secs = 0;
    Clock::time_point start;
    std::unique_ptr<outbox::Outbox> ob;
    if (cfg.mode == "drain") {
      prefill();
      committed = n;
      options.claim_locking = outbox::ClaimLocking{"bench", std::chrono::minutes(5)};
      start = Clock::now();
      ob = std::make_unique<outbox::Outbox>(outbox::Outbox::multi_node(options));
      ob->start();
    } else {
      ob = std::make_unique<outbox::Outbox>(outbox::Outbox::single_node(options));
      ob->start();
      outbox::OutboxWriter poller_only_writer(tx_context, store);
      auto& writer = cfg.mode == "hot" ? ob->writer() : poller_only_writer;
      start = Clock::now();
      std::string update;
      {
        auto c = pool->acquire();
        update = update_sql(*c);
      }
      write_secs = run_writers([&](int first, int count, std::mt19937& rng) {
        for (;;) {
          try {
            auto t = tx.begin();
            t.connection().execute(update, {std::int64_t{static_cast<int>(rng() % 10000)}});
            auto batch = events(first, count);
            // Registered before the writer's hook, so it runs first after the commit.
            tx_context->after_commit([&, first, count] {
              const auto t_ns = now_ns();
              for (int i = 0; i < count; ++i) {
                commit_ns[static_cast<std::size_t>(first + i)] = t_ns;
              }
            });
            writer.write_all(std::move(batch));
            t.commit();
            committed += count;
            return;
          } catch (const outbox::StoreError& e) {
            // Deadlocks/serialization failures under contention are retried like an application
            // would.
            std::fprintf(stderr, "  write retried: %s\n", e.what());
          }
        }
      });
    }
    const auto deadline = Clock::now() + 30min;
    while (metrics->snapshot().dispatch_success < n && Clock::now() < deadline) {
      std::this_thread::sleep_for(1ms);  // the completion check's poll interval
    }
    const double total_secs = std::chrono::duration<double>(Clock::now() - start).count();
    ob->close();
    sampling = false;
    wal_sampler.join();
    std::vector<double> lat_us;
    lat_us.reserve(static_cast<std::size_t>(n));
    for (auto& l : latency_ns) {
      if (l.load() > 0) {
        lat_us.push_back(static_cast<double>(l.load()) / 1000.0);
      }
    }
    const double delivered_rate = metrics->snapshot().dispatch_success / total_secs;
    std::printf(
        "mode=%s engine=%s events=%d writers=%d per_tx=%d payload=%d workers=%d rate=%d "
        "committed/s=%.0f delivered/s=%.0f p50_us=%.0f p99_us=%.0f p999_us=%.0f duplicates=%d "
        "undelivered=%d peak_rss_mb=%ld",
        cfg.mode.c_str(), std::string(pool->acquire()->dialect()).c_str(), n, cfg.writers,
        cfg.per_tx, cfg.payload, cfg.workers, cfg.rate, write_secs > 0 ? n / write_secs : 0,
        delivered_rate, pct(lat_us, 0.50), pct(lat_us, 0.99), pct(lat_us, 0.999), duplicates.load(),
        n - delivered.load(), peak_rss_mb());
    if (cfg.db.rfind("sqlite://", 0) == 0) {
      std::printf(" peak_wal_mb=%.1f", static_cast<double>(peak_wal.load()) / (1024.0 * 1024.0));
    }
    if (cfg.floor && cfg.mode == "drain") {
      std::printf(" floor_drain/s=%.0f ratio=%.2f", floor_rate, delivered_rate / floor_rate);
    } else if (cfg.floor) {
      std::printf(" floor_committed/s=%.0f floor_marked/s=%.0f ratio=%.2f", floor_committed,
                  floor_marked, delivered_rate / floor_committed);
    }
    std::printf("\n");
    teardown();
    return duplicates.load() == 0 && delivered.load() == n ? 0 : 1;
  }
};

}  // namespace

int main(int argc, char** argv) {
  outbox::set_log_level(outbox::LogLevel::Error);
  try {
    Bench b{parse(argc, argv)};
    b.pool =
        outbox::open_pool(b.cfg.db, static_cast<std::size_t>(b.cfg.writers + b.cfg.workers + 4));
    return b.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-bench: %s\n", e.what());
    return 2;
  }
}
