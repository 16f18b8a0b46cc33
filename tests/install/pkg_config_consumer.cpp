// Compiled with nothing but `pkg-config --cflags --libs outbox-sqlite`: opens a SQLite outbox and
// writes one event in a transaction, then checks the row is there.
#include <cstdio>
#include <filesystem>
#include <string>

#include <unistd.h>

#include "outbox/outbox.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/transaction.hpp"

int main() {
  const auto path = std::filesystem::temp_directory_path() /
                    ("outbox-pkg-config-" + std::to_string(::getpid()) + ".db");
  int pending = -1;
  {
    auto pool = outbox::sqlite::make_pool(path.string());
    outbox::sqlite::create_schema(*pool->acquire());
    auto store = std::make_shared<outbox::sqlite::SqliteOutboxStore>();
    auto tx_context = std::make_shared<outbox::ThreadLocalTxContext>();
    outbox::OutboxWriter writer(tx_context, store);
    outbox::TransactionManager tx(pool, tx_context);
    auto t = tx.begin();
    writer.write(
        outbox::EventEnvelope::builder(outbox::EventType::of("Built")).payload_json("{}").build());
    t.commit();
    pending = static_cast<int>(store->count_by_status(*pool->acquire())[0]);
  }
  for (const char* suffix : {"", "-wal", "-shm"}) {
    std::filesystem::remove(path.string() + suffix);
  }
  std::printf("pending after commit: %d\n", pending);
  return pending == 1 ? 0 : 1;
}
