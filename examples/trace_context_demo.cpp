// outbox-trace-demo: W3C trace context through the outbox. The application has its own tracer
// (here a toy one: the current span per thread, as a tracing library keeps it); the outbox's
// TraceContextProvider reads it when an event is written, the row carries the traceparent, and
// the listener that delivers the event sees the span that wrote it. Usage: outbox-trace-demo
// PATH.db

#include <atomic>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>

#include "outbox/listener.hpp"
#include "outbox/metrics.hpp"
#include "outbox/outbox.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "outbox/trace_context.hpp"
#include "outbox/transaction.hpp"

namespace {

// The application's tracer: a span per request, current on the thread that serves it.
class Tracer {
 public:
  class Span {
   public:
    explicit Span(const std::string& trace_id) : previous_(current_) {
      static thread_local std::mt19937_64 random{std::random_device{}()};
      char id[17];
      std::snprintf(id, sizeof id, "%016llx", static_cast<unsigned long long>(random() | 1));
      traceparent_ = "00-" + trace_id + "-" + id + "-01";
      current_ = this;
    }
    ~Span() { current_ = previous_; }
    Span(const Span&) = delete;
    Span& operator=(const Span&) = delete;
    const std::string& traceparent() const { return traceparent_; }

   private:
    std::string traceparent_;
    Span* previous_;
  };
  static const Span* current() { return current_; }

 private:
  static thread_local Span* current_;
};
thread_local Tracer::Span* Tracer::current_ = nullptr;

}  // namespace

int main(int argc, char** argv) {
  using namespace std::chrono_literals;
  if (argc != 2 || std::filesystem::exists(argv[1])) {
    std::fprintf(stderr, "usage: outbox-trace-demo PATH.db (a file that does not exist yet)\n");
    return 2;
  }
  auto pool = outbox::sqlite::make_pool(argv[1], 2);
  outbox::sqlite::create_schema(*pool->acquire());
  auto tx_context = std::make_shared<outbox::ThreadLocalTxContext>();
  outbox::TransactionManager tx(pool, tx_context);
  auto listeners = std::make_shared<outbox::DefaultListenerRegistry>();
  auto metrics = std::make_shared<outbox::InMemoryMetrics>();
  std::mutex mutex;
  std::string received;
  std::atomic<int> delivered{0};
  listeners->register_listener(outbox::EventType::of("OrderPlaced"),
                               [&](const outbox::EventEnvelope& e) {
                                 const auto it = e.headers().find("traceparent");
                                 std::lock_guard lock(mutex);
                                 received = it == e.headers().end() ? "(none)" : it->second;
                                 ++delivered;
                               });
  auto ob = outbox::Outbox::single_node({
      .connection_provider = pool,
      .tx_context = tx_context,
      .store = std::make_shared<outbox::sqlite::SqliteOutboxStore>(),
      .listeners = listeners,
      .metrics = metrics,
      // The hook: the current span of the writing thread, if there is one.
      .trace_context = []() -> std::optional<outbox::TraceContext> {
        if (const auto* span = Tracer::current()) {
          return outbox::TraceContext{span->traceparent(), ""};
        }
        return std::nullopt;
      },
  });
  ob.start();
  std::string written_in;
  {
    Tracer::Span request("4bf92f3577b34da6a3ce929d0e0e4736");  // a request being served
    written_in = request.traceparent();
    auto t = tx.begin();
    ob.writer().write(outbox::EventType::of("OrderPlaced"), R"({"order":"o-1"})");
    t.commit();
  }
  const auto deadline = std::chrono::steady_clock::now() + 30s;
  while (delivered.load() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(5ms);
  }
  ob.close();
  std::lock_guard lock(mutex);
  std::printf("written in span  %s\ndelivered with   %s\n", written_in.c_str(), received.c_str());
  const bool ok = delivered.load() == 1 && received == written_in &&
                  metrics->snapshot().trace_context_dropped == 0;
  std::printf("%s\n", ok ? "OK: the listener saw the span that wrote the event"
                         : "FAILED: the trace context did not travel with the event");
  return ok ? 0 : 1;
}
