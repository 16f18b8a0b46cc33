#include "writer.hpp"

#include <signal.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/errors.hpp"
#include "outbox/event_type.hpp"
#include "outbox/transaction.hpp"
#include "outbox/writer.hpp"

namespace outbox::chaos {
namespace {

std::atomic<bool> stop_requested{false};

extern "C" void on_term(int) {
  stop_requested = true;
}

// Sleeps up to `d`, waking early on SIGTERM.
void pause_for(std::chrono::milliseconds d) {
  const auto until = std::chrono::steady_clock::now() + d;
  while (!stop_requested && std::chrono::steady_clock::now() < until) {
    // The stop flag's poll period.
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string placeholder(sql::Connection& conn, int n) {
  return conn.dialect() == "postgres" ? "$" + std::to_string(n) : "?";
}

class Writer {
 public:
  explicit Writer(const WriterOptions& o) : o_(o), rng_(o.seed) {
    rolled_back_ = std::fopen(rolled_back_file(o.dir, o.index).c_str(), "a");
    if (!rolled_back_) {
      throw std::runtime_error("cannot open " + rolled_back_file(o.dir, o.index));
    }
  }
  ~Writer() { std::fclose(rolled_back_); }
  Writer(const Writer&) = delete;
  Writer& operator=(const Writer&) = delete;

  int run() {
    const auto period = std::chrono::microseconds(1'000'000 / std::max(1, o_.rate));
    auto next = std::chrono::steady_clock::now();
    while (!stop_requested) {
      try {
        connect();
        transaction();
      } catch (const std::exception& e) {
        // The server restarted, a connection was killed, the disk is full: what committed is in
        // the ledger table, so reread it and go on after a short pause.
        ++errors_;
        if (errors_ <= 3 || errors_ % 100 == 0) {
          std::fprintf(stderr, "writer %d: %s (error %zu)\n", o_.index, e.what(), errors_);
        }
        next_seq_.clear();
        pause_for(std::chrono::milliseconds(writer_ ? 50 : 250));
      }
      next += period;
      const auto now = std::chrono::steady_clock::now();
      if (next < now) {
        next = now;
      }
      pause_for(std::chrono::duration_cast<std::chrono::milliseconds>(next - now));
    }
    std::fprintf(stderr, "writer %d: committed %zu events, rolled back %zu, errors %zu\n", o_.index,
                 committed_, rolled_back_count_, errors_);
    return 0;
  }

 private:
  void connect() {
    if (!writer_) {
      auto pool = open_pool(o_.db, 2);
      auto store = detect_store(*pool->acquire(), o_.table);
      tx_ = std::make_unique<TransactionManager>(pool, context_);
      writer_ = std::make_unique<OutboxWriter>(context_, std::move(store));
      pool_ = std::move(pool);
    }
    if (next_seq_.empty()) {
      auto conn = pool_->acquire();
      for (int k = 0; k < o_.keys; ++k) {
        next_seq_[key(k)] = 1;
      }
      const auto rows = conn->query("SELECT k, MAX(seq) FROM " + ledger_table(o_.table) +
                                        " WHERE w = " + placeholder(*conn, 1) + " GROUP BY k",
                                    {std::int64_t{o_.index}});
      for (const auto& row : rows) {
        next_seq_[row.get_text(0)] = row.get_int(1) + 1;
      }
    }
  }

  std::string key(int k) const { return "w" + std::to_string(o_.index) + "-k" + std::to_string(k); }

  EventEnvelope event(const std::string& k, long seq) const {
    auto b = EventEnvelope::builder(EventType::of("ChaosEvent"))
                 .aggregate_type(AggregateType::of("Chaos"))
                 .aggregate_id(k)
                 .payload_json("{\"k\":\"" + k + "\",\"s\":" + std::to_string(seq) + "}");
    if (o_.mode == "groups") {
      b.message_group(k);
    }
    return b.build();
  }

  // Inserts the ledger row and the event: both or neither commit.
  void write(Transaction& t, const EventEnvelope& e, const std::string& k, long seq) {
    auto& conn = t.connection();
    conn.execute(
        "INSERT INTO " + ledger_table(o_.table) + " (event_id, w, k, seq) VALUES (" +
            placeholder(conn, 1) + ", " + placeholder(conn, 2) + ", " + placeholder(conn, 3) +
            ", " + placeholder(conn, 4) + ")",
        {sql::TextRef{e.event_id()}, std::int64_t{o_.index}, sql::TextRef{k}, std::int64_t{seq}});
    writer_->write(e);
  }

  void record_rollback(const std::string& id) {
    std::fprintf(rolled_back_, "%s\n", id.c_str());
    std::fflush(rolled_back_);
    ++rolled_back_count_;
  }

  void transaction() {
    const auto k = key(static_cast<int>(rng_() % static_cast<unsigned>(o_.keys)));
    long seq = next_seq_.at(k);
    const auto kind = rng_() % 10;
    auto t = tx_->begin();
    if (kind < 6) {
      // One event.
      write(t, event(k, seq), k, seq);
      t.commit();
      next_seq_[k] = seq + 1;
      ++committed_;
    } else if (kind < 8) {
      // Several events of the key in one transaction.
      const long n = 2 + static_cast<long>(rng_() % 3);
      for (long i = 0; i < n; ++i) {
        write(t, event(k, seq + i), k, seq + i);
      }
      t.commit();
      next_seq_[k] = seq + n;
      committed_ += static_cast<std::size_t>(n);
    } else if (kind == 8) {
      // A business error after the writes: the whole transaction rolls back.
      const auto e = event(k, seq);
      write(t, e, k, seq);
      record_rollback(e.event_id());
      t.rollback();
    } else {
      // The first event commits; the second was written in a savepoint that rolled back.
      write(t, event(k, seq), k, seq);
      {
        auto sp = t.savepoint();
        const auto e = event(k, seq + 1);
        write(t, e, k, seq + 1);
        record_rollback(e.event_id());
        sp.rollback();
      }
      t.commit();
      next_seq_[k] = seq + 1;
      ++committed_;
    }
  }

  const WriterOptions& o_;
  std::mt19937_64 rng_;
  std::FILE* rolled_back_ = nullptr;
  std::shared_ptr<sql::ConnectionPool> pool_;
  std::shared_ptr<ThreadLocalTxContext> context_ = std::make_shared<ThreadLocalTxContext>();
  std::unique_ptr<TransactionManager> tx_;
  std::unique_ptr<OutboxWriter> writer_;
  std::map<std::string, long> next_seq_;
  std::size_t committed_ = 0;
  std::size_t rolled_back_count_ = 0;
  std::size_t errors_ = 0;
};

}  // namespace

std::string ledger_table(const std::string& table) {
  return table + "_ledger";
}

std::string rolled_back_file(const std::string& dir, int index) {
  return dir + "/rolled-back-" + std::to_string(index) + ".txt";
}

int run_writer(const WriterOptions& options) {
  struct sigaction sa {};
  sa.sa_handler = on_term;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  // The harness starts its children with these blocked (a stop sent while loading waits here).
  sigset_t stops;
  sigemptyset(&stops);
  sigaddset(&stops, SIGTERM);
  sigaddset(&stops, SIGINT);
  sigprocmask(SIG_UNBLOCK, &stops, nullptr);
  try {
    Writer writer(options);
    return writer.run();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "writer %d: %s\n", options.index, e.what());
    return 1;
  }
}

}  // namespace outbox::chaos
