// outbox-rest-service: a small order service over HTTP (cpp-httplib) on an embedded SQLite file.
// POST /orders {"customer": "...", "amount_cents": N} writes the order row and its OrderPlaced
// event in ONE transaction; a listener publishes each event once it is committed (here as a JSON
// line on stdout, where a real service would call its broker). GET /orders/{id} reads an order,
// GET /stats counts orders and published events. SIGTERM or SIGINT stops it after the outbox
// drained.
//
// Usage: outbox-rest-service PATH.db [PORT]   (PORT 0 or absent: a free one; the first line
// printed is "listening on 127.0.0.1:<port>")

#include <httplib.h>
#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "outbox/errors.hpp"
#include "outbox/listener.hpp"
#include "outbox/outbox.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/transaction.hpp"

int main(int argc, char** argv) {
  if (argc < 2 || argc > 3) {
    std::fprintf(stderr, "usage: outbox-rest-service PATH.db [PORT]\n");
    return 2;
  }
  const int port = argc == 3 ? std::atoi(argv[2]) : 0;
  // SIGTERM and SIGINT are taken by one thread (sigwait) instead of a handler: stopping the server
  // is not something a signal handler may do. Blocked before any thread starts, so all inherit it.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  auto pool = outbox::sqlite::make_pool(argv[1], 4);
  {
    auto conn = pool->acquire();
    outbox::sqlite::create_schema(*conn);
    conn->execute(
        "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer TEXT NOT NULL, "
        "amount_cents INTEGER NOT NULL CHECK (amount_cents > 0))");
  }
  auto tx_context = std::make_shared<outbox::ThreadLocalTxContext>();
  outbox::TransactionManager tx(pool, tx_context);
  auto listeners = std::make_shared<outbox::DefaultListenerRegistry>();
  std::atomic<long> published{0};
  std::mutex out;
  listeners->register_listener(outbox::AggregateType::of("Order"),
                               outbox::EventType::of("OrderPlaced"),
                               [&](const outbox::EventEnvelope& e) {
                                 std::lock_guard lock(out);
                                 std::printf("published %s %s\n", e.event_id().c_str(),
                                             std::string(e.payload_json()).c_str());
                                 std::fflush(stdout);
                                 ++published;
                               });
  auto ob =
      outbox::Outbox::single_node({.connection_provider = pool,
                                   .tx_context = tx_context,
                                   .store = std::make_shared<outbox::sqlite::SqliteOutboxStore>(),
                                   .listeners = listeners});
  ob.start();

  httplib::Server server;
  std::atomic<long> next_order{0};
  server.Post("/orders", [&](const httplib::Request& req, httplib::Response& res) {
    const auto body = nlohmann::json::parse(req.body, nullptr, false);
    if (!body.is_object() || !body.contains("customer") || !body["customer"].is_string() ||
        !body.contains("amount_cents") || !body["amount_cents"].is_number_integer()) {
      res.status = 400;
      res.set_content(R"({"error":"want {\"customer\": string, \"amount_cents\": integer}"})",
                      "application/json");
      return;
    }
    const std::string id = "order-" + std::to_string(++next_order) + "-" +
                           std::to_string(std::chrono::system_clock::now().time_since_epoch() /
                                          std::chrono::microseconds(1));
    try {
      // One transaction: the order and its event commit together or not at all.
      auto t = tx.begin();
      t.connection().execute(
          "INSERT INTO orders (id, customer, amount_cents) VALUES (?, ?, ?)",
          {id, body["customer"].get<std::string>(), body["amount_cents"].get<std::int64_t>()});
      const auto event_id =
          ob.writer().write(outbox::EventEnvelope::builder(outbox::EventType::of("OrderPlaced"))
                                .aggregate_type(outbox::AggregateType::of("Order"))
                                .aggregate_id(id)
                                .payload_json(nlohmann::json{{"order", id},
                                                             {"customer", body["customer"]},
                                                             {"amount_cents", body["amount_cents"]}}
                                                  .dump())
                                .build());
      t.commit();
      res.status = 201;
      res.set_content(nlohmann::json{{"order", id}, {"event", *event_id}}.dump(),
                      "application/json");
    } catch (const outbox::StoreError& e) {
      // E.g. the CHECK on amount_cents: nothing was written, no event will be published.
      res.status = 422;
      res.set_content(nlohmann::json{{"error", e.what()}}.dump(), "application/json");
    }
  });
  server.Get(R"(/orders/([^/]+))", [&](const httplib::Request& req, httplib::Response& res) {
    const auto rows = pool->acquire()->query(
        "SELECT customer, amount_cents FROM orders WHERE id = ?", {req.matches[1].str()});
    if (rows.empty()) {
      res.status = 404;
      return;
    }
    res.set_content(nlohmann::json{{"order", req.matches[1].str()},
                                   {"customer", rows[0].get_text(0)},
                                   {"amount_cents", rows[0].get_int(1)}}
                        .dump(),
                    "application/json");
  });
  server.Get("/stats", [&](const httplib::Request&, httplib::Response& res) {
    const auto orders = pool->acquire()->query("SELECT COUNT(*) FROM orders")[0].get_int(0);
    res.set_content(nlohmann::json{{"orders", orders}, {"published", published.load()}}.dump(),
                    "application/json");
  });

  const int bound = port > 0 ? (server.bind_to_port("127.0.0.1", port) ? port : -1)
                             : server.bind_to_any_port("127.0.0.1");
  if (bound <= 0) {
    std::fprintf(stderr, "outbox-rest-service: cannot listen on 127.0.0.1:%d\n", port);
    return 1;
  }
  std::thread stopper([&] {
    int signal_number = 0;
    sigwait(&stop_signals, &signal_number);
    while (!server.is_running()) {  // a stop() before listening starts would be lost
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    server.stop();  // listen_after_bind() returns; the outbox drains after it
  });
  {
    std::lock_guard lock(out);
    std::printf("listening on 127.0.0.1:%d\n", bound);
    std::fflush(stdout);
  }
  server.listen_after_bind();
  stopper.join();
  ob.close();  // delivers what is queued, leaves the rest in the table for the next start
  std::printf("stopped: %ld events published\n", published.load());
  return 0;
}
