#include "outbox/internal/claim_heartbeat.hpp"

#include <optional>
#include <stdexcept>

#include "outbox/internal/writes_first.hpp"
#include "outbox/log.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox::internal {

ClaimHeartbeat::ClaimHeartbeat(Options options, HeldIds held, Renewed renewed)
    : options_(std::move(options)), held_(std::move(held)), renewed_(std::move(renewed)) {
  thread_ = std::thread([this] { loop(); });
}

ClaimHeartbeat::~ClaimHeartbeat() {
  stop();
}

void ClaimHeartbeat::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  }
}

void ClaimHeartbeat::loop() {
  const outbox::internal::WritesFirst
      first;  // a renewal held back past the claim timeout means duplicates
  const auto period =
      std::max<std::chrono::milliseconds>(options_.claim_timeout / 4, std::chrono::milliseconds(1));
  // A connection of its own where the provider can make one: borrowing from a pool that busy
  // listeners exhaust would let the lease of a running event run out.
  std::unique_ptr<sql::Connection> own;
  std::unique_lock wait_lock(mutex_);
  for (;;) {
    if (wake_.wait_for(wait_lock, period, [&] { return stop_; })) {
      return;
    }
    wait_lock.unlock();
    const auto stamped = std::chrono::steady_clock::now();  // before the statement: conservative
    const std::vector<std::string> ids = held_();
    if (!ids.empty()) {
      try {
        if (!own || own->is_broken()) {
          own.reset();
          own = options_.provider->open_dedicated();
        }
        std::optional<sql::PooledConnection> borrowed;
        if (!own) {
          borrowed.emplace(options_.provider->acquire());
        }
        sql::Connection& conn = own ? *own : borrowed->get();
        std::vector<std::string> renewed_ids;
        try {
          renewed_ids =
              options_.store->renew_claims(conn, options_.claim_owner, ids, options_.clock->now());
        } catch (...) {
          own.reset();  // opened again at the next beat
          throw;
        }
        if (std::chrono::steady_clock::now() - stamped > options_.claim_timeout / 4) {
          // Too slow to be sure the renewal came before another node could take a lapsing claim:
          // the queued events keep their old claim time (and are dropped when it lapses).
          throw std::runtime_error("renewal took longer than a quarter lease");
        }
        // Only the rows really renewed: one skipped (locked right now) or taken by another node
        // keeps its old claim time and is dropped if that lapses.
        renewed_(std::unordered_set<std::string>(renewed_ids.begin(), renewed_ids.end()), stamped);
      } catch (const std::exception& e) {
        log(LogLevel::Warning,
            std::string("OutboxDispatcher: could not renew claims (queued events whose claim "
                        "lapses are left for the poller): ") +
                e.what());
      }
    }
    wait_lock.lock();
  }
}

}  // namespace outbox::internal
