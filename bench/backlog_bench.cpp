// outbox-backlog-bench: how claim, poll and purge behave on a large backlog, per engine.
//
//   outbox-backlog-bench URL [PENDING] [DONE] [ROUNDS]
//     URL: sqlite:///path.db | postgresql://… or "host=… dbname=…" | mysql://… / mariadb://…
//
// Fills a fresh table with PENDING pending rows and DONE terminal rows (defaults 1,000,000 and
// 1,000,000), then times ROUNDS (default 200) rounds of: claim 100 + batched mark-done of those
// 100, poll 100, and purge batches of 500 terminal rows. Prints one line per operation.

#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sqlite/driver.hpp"

namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

void prefill(outbox::sql::Connection& conn, const std::string& t, long pending, long done) {
  const auto d = conn.dialect();
  const std::string cols =
      "(event_id, event_type, aggregate_type, payload, status, attempts, available_at, "
      "created_at, done_at)";
  if (d == "postgres") {
    conn.execute("INSERT INTO " + t + cols +
                 " SELECT md5('p' || g), 'Bench', '__GLOBAL__', '{\"n\":1}', 0, 0, "
                 "now() - interval '1 hour' + g * interval '1 microsecond', "
                 "now() - interval '1 hour' + g * interval '1 microsecond', NULL "
                 "FROM generate_series(1, " +
                 std::to_string(pending) + ") g");
    conn.execute("INSERT INTO " + t + cols +
                 " SELECT md5('d' || g), 'Bench', '__GLOBAL__', '{\"n\":1}', 1, 0, "
                 "now() - interval '3 days', now() - interval '3 days' + g * interval "
                 "'1 microsecond', now() - interval '2 days' FROM generate_series(1, " +
                 std::to_string(done) + ") g");
    conn.execute("ANALYZE " + t);
  } else if (d == "mysql") {
    // In statements of 100,000 rows: one of a million outlasts the driver's 30 s read timeout.
    constexpr long kChunk = 100000;
    auto range = [](long from, long n) {
      return " FROM seq_" + std::to_string(from) + "_to_" + std::to_string(from + n - 1);
    };
    for (long from = 1; from <= pending; from += kChunk) {
      conn.execute("INSERT INTO " + t + cols +
                   " SELECT MD5(CONCAT('p', seq)), 'Bench', '__GLOBAL__', '{\"n\":1}', 0, 0, "
                   "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR + INTERVAL seq MICROSECOND, "
                   "UTC_TIMESTAMP(6) - INTERVAL 1 HOUR + INTERVAL seq MICROSECOND, NULL" +
                   range(from, std::min(kChunk, pending - from + 1)));
    }
    for (long from = 1; from <= done; from += kChunk) {
      conn.execute("INSERT INTO " + t + cols +
                   " SELECT MD5(CONCAT('d', seq)), 'Bench', '__GLOBAL__', '{\"n\":1}', 1, 0, "
                   "UTC_TIMESTAMP(6) - INTERVAL 3 DAY, UTC_TIMESTAMP(6) - INTERVAL 3 DAY + "
                   "INTERVAL seq MICROSECOND, UTC_TIMESTAMP(6) - INTERVAL 2 DAY" +
                   range(from, std::min(kChunk, done - from + 1)));
    }
    conn.execute("ANALYZE TABLE " + t);
  } else {
    const auto now_us = std::chrono::duration_cast<std::chrono::microseconds>(
                            std::chrono::system_clock::now().time_since_epoch())
                            .count();
    const auto hour = 3600LL * 1000000;
    conn.execute("BEGIN");
    conn.execute("WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < " +
                 std::to_string(pending) + ") INSERT INTO " + t + cols +
                 " SELECT printf('p%031d', n), 'Bench', '__GLOBAL__', '{\"n\":1}', 0, 0, " +
                 std::to_string(now_us - hour) + " + n, " + std::to_string(now_us - hour) +
                 " + n, NULL FROM s");
    conn.execute("WITH RECURSIVE s(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM s WHERE n < " +
                 std::to_string(done) + ") INSERT INTO " + t + cols +
                 " SELECT printf('d%031d', n), 'Bench', '__GLOBAL__', '{\"n\":1}', 1, 0, " +
                 std::to_string(now_us - 72 * hour) + ", " + std::to_string(now_us - 72 * hour) +
                 " + n, " + std::to_string(now_us - 48 * hour) + " FROM s");
    conn.execute("COMMIT");
    conn.execute("ANALYZE");
  }
}

struct Stats {
  std::vector<double> ms;
  void add(Clock::time_point start) {
    ms.push_back(std::chrono::duration<double, std::milli>(Clock::now() - start).count());
  }
  void print(const char* what, double rows_per_op) {
    std::sort(ms.begin(), ms.end());
    double sum = 0;
    for (double v : ms) {
      sum += v;
    }
    const double mean = ms.empty() ? 0 : sum / static_cast<double>(ms.size());
    std::printf("  %-34s %8.2f ms/op  p50 %8.2f  p99 %8.2f  %9.0f ops/s  %10.0f rows/s\n", what,
                mean, ms.empty() ? 0 : ms[ms.size() / 2],
                ms.empty() ? 0 : ms[std::min(ms.size() - 1, ms.size() * 99 / 100)],
                mean > 0 ? 1000.0 / mean : 0, mean > 0 ? rows_per_op * 1000.0 / mean : 0);
  }
};

int run(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s URL [PENDING] [DONE] [ROUNDS]\n", argv[0]);
    return 2;
  }
  const std::string url = argv[1];
  const long pending = argc > 2 ? std::atol(argv[2]) : 1000000;
  const long done = argc > 3 ? std::atol(argv[3]) : 1000000;
  const int rounds = argc > 4 ? std::atoi(argv[4]) : 200;
  auto pool = outbox::open_pool(url, 1);
  auto conn = pool->acquire();
  const std::string table = "backlog_bench_" + std::to_string(getpid());
  outbox::create_schema_for(*conn, table);
  auto store = outbox::detect_store(*conn, table);
  auto purger = outbox::detect_purger(*conn, table);
  const auto fill_start = Clock::now();
  prefill(*conn, table, pending, done);
  std::printf("%s: %ld pending + %ld terminal rows filled in %.1f s\n",
              std::string(conn->dialect()).c_str(), pending, done,
              std::chrono::duration<double>(Clock::now() - fill_start).count());

  Stats claim, mark, poll, purge;
  for (int i = 0; i < rounds; ++i) {
    auto t0 = Clock::now();
    auto rows =
        store->claim_pending(*conn, "bench", std::chrono::system_clock::now(), 5min, 0us, 100);
    claim.add(t0);
    std::vector<std::string> ids;
    for (const auto& r : rows) {
      ids.push_back(r.event_id);
    }
    t0 = Clock::now();
    store->mark_done_batch(*conn, ids, std::chrono::system_clock::now());
    mark.add(t0);
    t0 = Clock::now();
    store->poll_pending(*conn, std::chrono::system_clock::now(), 0us, 100);
    poll.add(t0);
  }
  const auto cutoff = std::chrono::system_clock::now() - 24h;
  for (int i = 0; i < std::max(1, rounds / 10); ++i) {
    const auto t0 = Clock::now();
    purger->purge(*conn, cutoff, 500);
    purge.add(t0);
  }
  claim.print("claim 100 (SKIP LOCKED / UPDATE)", 100);
  mark.print("mark 100 DONE (one statement)", 100);
  poll.print("poll 100", 100);
  purge.print("purge 500 terminal rows", 500);
  conn->execute("DROP TABLE " + table);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-backlog-bench: %s\n", e.what());
    return 1;
  }
}
