// outbox-two-databases: one process, two databases, two outboxes. Each business transaction runs
// in one database and writes its event through that database's outbox; each event is delivered
// from its own database, never from the other, and each outbox's rows stay in its own table.
//
// Usage: outbox-two-databases URL_A URL_B [TABLE]   e.g.
//   outbox-two-databases sqlite:///tmp/a.db "host=127.0.0.1 dbname=app user=app"
// (any URL `outbox migrate` takes; TABLE defaults to outbox_event). Exits 0 when every event was
// delivered once, from its own database.

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "outbox/detect/detect.hpp"
#include "outbox/listener.hpp"
#include "outbox/outbox.hpp"
#include "outbox/transaction.hpp"

namespace {

// One database and the outbox on it.
struct Side {
  std::string name;
  std::shared_ptr<outbox::sql::ConnectionPool> pool;
  std::shared_ptr<outbox::ThreadLocalTxContext> tx_context =
      std::make_shared<outbox::ThreadLocalTxContext>();
  std::shared_ptr<outbox::DefaultListenerRegistry> listeners =
      std::make_shared<outbox::DefaultListenerRegistry>();
  std::shared_ptr<outbox::OutboxStore> store;
  std::unique_ptr<outbox::Outbox> outbox;
};

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  if (argc < 3 || argc > 4) {
    std::fprintf(stderr, "usage: outbox-two-databases URL_A URL_B [TABLE]\n");
    return 2;
  }
  const std::string table = argc == 4 ? argv[3] : "outbox_event";
  std::mutex mutex;
  std::map<std::string, std::string> delivered_from;  // event id → the side that delivered it
  std::set<std::string> repeated;
  Side sides[2];
  for (int i = 0; i < 2; ++i) {
    auto& s = sides[i];
    s.name = i == 0 ? "A" : "B";
    s.pool = outbox::open_pool(argv[1 + i], 4);
    outbox::migrate(*s.pool->acquire(), table);
    s.store = outbox::detect_store(*s.pool->acquire(), table);
    s.listeners->register_listener(outbox::EventType::of("Transferred"),
                                   [&, name = s.name](const outbox::EventEnvelope& e) {
                                     std::lock_guard lock(mutex);
                                     if (!delivered_from.emplace(e.event_id(), name).second) {
                                       repeated.insert(e.event_id());
                                     }
                                   });
    s.outbox = std::make_unique<outbox::Outbox>(
        outbox::Outbox::single_node({.connection_provider = s.pool,
                                     .tx_context = s.tx_context,
                                     .store = s.store,
                                     .listeners = s.listeners,
                                     .poller = {.interval = 100ms}}));
    s.outbox->start();
  }

  // Each side's writes, in its own transactions (a thread may have one open per database: the
  // two transaction contexts are separate).
  constexpr int kPerSide = 50;
  std::map<std::string, std::string> written_in;  // event id → the side that wrote it
  for (int n = 0; n < kPerSide; ++n) {
    for (auto& s : sides) {
      outbox::TransactionManager tx(s.pool, s.tx_context);
      auto t = tx.begin();
      const auto id = s.outbox->writer().write(
          outbox::EventEnvelope::builder(outbox::EventType::of("Transferred"))
              .payload_json("{\"side\":\"" + s.name + "\",\"n\":" + std::to_string(n) + "}")
              .build());
      t.commit();
      written_in[*id] = s.name;
    }
  }
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  for (;;) {
    {
      std::lock_guard lock(mutex);
      if (delivered_from.size() >= written_in.size() ||
          std::chrono::steady_clock::now() > deadline) {
        break;
      }
    }
    std::this_thread::sleep_for(10ms);
  }
  for (auto& s : sides) {
    s.outbox->close();
  }
  int wrong_side = 0, missing = 0, foreign_rows = 0;
  std::lock_guard lock(mutex);
  for (const auto& [id, side] : written_in) {
    const auto it = delivered_from.find(id);
    missing += it == delivered_from.end() ? 1 : 0;
    wrong_side += it != delivered_from.end() && it->second != side ? 1 : 0;
    // The row is in its own database's table only.
    for (auto& s : sides) {
      const bool here = s.store->find(*s.pool->acquire(), id).has_value();
      foreign_rows += here != (s.name == side) ? 1 : 0;
    }
  }
  std::printf(
      "written %zu (%d per database), delivered %zu, missing %d, from the wrong database %d, "
      "rows in the wrong table %d, repeated %zu\n",
      written_in.size(), kPerSide, delivered_from.size(), missing, wrong_side, foreign_rows,
      repeated.size());
  const bool ok = missing == 0 && wrong_side == 0 && foreign_rows == 0 && repeated.empty();
  std::printf("%s\n", ok ? "OK: each event delivered once, from its own database" : "FAILED");
  return ok ? 0 : 1;
}
