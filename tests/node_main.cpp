// outbox-test-node: one node of the multi-process and crash tests. It writes events in business
// transactions through Outbox::multi_node on PostgreSQL or MariaDB, delivers them to a listener
// that records every delivery in a ledger table, and exits once no row is pending.
//
//   outbox-test-node URL TABLE LEDGER NODE EVENTS EVENTS_PER_TX LOCK_TIMEOUT_MS [ROLLBACK_FILE]
//
// With ROLLBACK_FILE, every 10th transaction is rolled back after writing its event ids (flushed)
// to that file, so a test can check that no rolled-back event is ever delivered.
// Exit codes: 0 drained, 2 usage, 3 timed out, 4 failed.

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "outbox/listener.hpp"
#include "outbox/log.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/mysql/store.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/transaction.hpp"

namespace {

using namespace std::chrono_literals;

bool is_mysql(const std::string& url) {
  return url.rfind("mysql://", 0) == 0 || url.rfind("mariadb://", 0) == 0;
}

int run(int argc, char** argv) {
  if (argc < 8) {
    std::fprintf(stderr,
                 "usage: %s URL TABLE LEDGER NODE EVENTS EVENTS_PER_TX LOCK_TIMEOUT_MS "
                 "[ROLLBACK_FILE]\n",
                 argv[0]);
    return 2;
  }
  const std::string url = argv[1];
  const std::string table = argv[2];
  const std::string ledger = argv[3];
  const std::string node = argv[4];
  const int events = std::atoi(argv[5]);
  const int per_tx = std::max(1, std::atoi(argv[6]));
  const auto lock_timeout = std::chrono::milliseconds(std::atoi(argv[7]));
  FILE* rollback_file = argc > 8 ? std::fopen(argv[8], "a") : nullptr;

  const bool mysql = is_mysql(url);
  auto pool = mysql ? outbox::mysql::make_pool(url, 12) : outbox::postgres::make_pool(url, 12);
  std::shared_ptr<outbox::OutboxStore> store;
  if (mysql) {
    store = std::make_shared<outbox::mysql::MySqlOutboxStore>(
        outbox::mysql::MySqlOutboxStore::Options{.table = table});
  } else {
    store = std::make_shared<outbox::postgres::PostgresOutboxStore>(
        outbox::postgres::PostgresOutboxStore::Options{.table = table});
  }
  const std::string record = mysql ? "INSERT INTO " + ledger + " (event_id, node) VALUES (?, ?)"
                                   : "INSERT INTO " + ledger + " (event_id, node) VALUES ($1, $2)";
  auto listeners = std::make_shared<outbox::DefaultListenerRegistry>();
  listeners->register_listener(
      outbox::EventType::of("Transfer"), [&](const outbox::EventEnvelope& e) {
        auto conn = pool->acquire();
        conn->execute(record, {outbox::sql::TextRef{e.event_id()}, outbox::sql::TextRef{node}});
      });
  auto tx_context = std::make_shared<outbox::ThreadLocalTxContext>();
  outbox::TransactionManager tx(pool, tx_context);
  auto ob = outbox::Outbox::multi_node({
      .connection_provider = pool,
      .tx_context = tx_context,
      .store = store,
      .listeners = listeners,
      .claim_locking = outbox::ClaimLocking{node, lock_timeout},
      .dispatcher = {.retry_policy =
                         std::make_shared<outbox::ExponentialBackoffRetryPolicy>(50ms, 1000ms),
                     .worker_count = 4,
                     .hot_queue_capacity = 2000,
                     .cold_queue_capacity = 2000},
      .poller = {.batch_size = 200, .interval = 100ms},
  });
  ob.start();

  int written = 0;
  for (int t = 0; written < events; ++t) {
    const bool roll_back = rollback_file != nullptr && t % 10 == 9;
    try {
      auto txn = tx.begin();
      std::vector<outbox::EventEnvelope> batch;
      for (int i = 0; i < per_tx && written + static_cast<int>(batch.size()) < events; ++i) {
        batch.push_back(outbox::EventEnvelope::builder(outbox::EventType::of("Transfer"))
                            .aggregate_id(node + "-" + std::to_string(t))
                            .payload_json(R"({"amount":)" + std::to_string(t) + "}")
                            .build());
      }
      if (roll_back) {
        for (const auto& e : batch) {
          std::fprintf(rollback_file, "%s\n", e.event_id().c_str());
        }
        std::fflush(rollback_file);
      }
      const auto n = static_cast<int>(batch.size());
      ob.writer().write_all(std::move(batch));
      if (roll_back) {
        txn.rollback();
      } else {
        txn.commit();
        written += n;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: write failed (retrying): %s\n", node.c_str(), e.what());
      std::this_thread::sleep_for(100ms);  // a failed write is retried after a pause
    }
  }

  // Drain: wait until no row of any node is pending, bounded.
  const auto deadline = std::chrono::steady_clock::now() + 600s;
  for (;;) {
    try {
      auto counts = store->count_by_status(*pool->acquire());
      if (counts[0] + counts[2] == 0) {
        break;
      }
    } catch (const std::exception& e) {
      std::fprintf(stderr, "%s: status query failed: %s\n", node.c_str(), e.what());
    }
    if (std::chrono::steady_clock::now() > deadline) {
      return 3;
    }
    std::this_thread::sleep_for(50ms);  // the drain check's poll interval
  }
  ob.close();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // OUTBOX_TEST_NODE_WARNINGS=1 shows warnings too (claims dropped, renewals failed).
  const char* warnings = std::getenv("OUTBOX_TEST_NODE_WARNINGS");
  outbox::set_log_level(warnings != nullptr && *warnings == '1' ? outbox::LogLevel::Warning
                                                                : outbox::LogLevel::Error);
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-test-node: %s\n", e.what());
    return 4;
  }
}
