// Writes one event in a business transaction and delivers it to a listener, on a new SQLite file
// and, when OUTBOX_TEST_PG_URL is set, on PostgreSQL. Exits 0 only if each event arrived once.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>

#include <unistd.h>

#include "outbox/listener.hpp"
#include "outbox/outbox.hpp"
#include "outbox/postgres/driver.hpp"
#include "outbox/postgres/store.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/transaction.hpp"

namespace {

using namespace std::chrono_literals;

bool deliver_one(const std::shared_ptr<outbox::sql::ConnectionPool>& pool,
                 const std::shared_ptr<outbox::OutboxStore>& store, const char* engine) {
  auto tx_context = std::make_shared<outbox::ThreadLocalTxContext>();
  auto listeners = std::make_shared<outbox::DefaultListenerRegistry>();
  std::atomic<int> delivered{0};
  listeners->register_listener(outbox::AggregateType::of("Order"),
                               outbox::EventType::of("OrderPlaced"),
                               [&](const outbox::EventEnvelope&) { ++delivered; });
  auto ob = outbox::Outbox::single_node({.connection_provider = pool,
                                         .tx_context = tx_context,
                                         .store = store,
                                         .listeners = listeners,
                                         .poller = {.interval = 50ms}});
  ob.start();
  outbox::TransactionManager tx(pool, tx_context);
  {
    auto t = tx.begin();
    ob.writer().write(outbox::EventEnvelope::builder(outbox::EventType::of("OrderPlaced"))
                          .aggregate_type(outbox::AggregateType::of("Order"))
                          .aggregate_id("order-1")
                          .payload_json(R"({"orderId":"order-1"})")
                          .build());
    t.commit();
  }
  for (int i = 0; i < 2000 && delivered.load() == 0; ++i) {
    std::this_thread::sleep_for(5ms);
  }
  ob.close();
  std::printf("%s: delivered %d\n", engine, delivered.load());
  return delivered.load() == 1;
}

}  // namespace

int main() {
  const auto dir =
      std::filesystem::temp_directory_path() / ("outbox-consumer-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  bool ok = false;
  {
    auto pool = outbox::sqlite::make_pool((dir / "consumer.db").string());
    outbox::sqlite::create_schema(*pool->acquire());
    ok = deliver_one(pool, std::make_shared<outbox::sqlite::SqliteOutboxStore>(), "sqlite");
  }
  std::filesystem::remove_all(dir);
  if (const char* url = std::getenv("OUTBOX_TEST_PG_URL"); ok && url != nullptr) {
    const std::string table = "consumer_" + std::to_string(::getpid());
    auto pool = outbox::postgres::make_pool(url, 4);
    outbox::postgres::create_schema(*pool->acquire(), table);
    ok = deliver_one(pool,
                     std::make_shared<outbox::postgres::PostgresOutboxStore>(
                         outbox::postgres::PostgresOutboxStore::Options{.table = table}),
                     "postgres");
    pool->acquire()->execute("DROP TABLE " + table);
  }
  return ok ? 0 : 1;
}
