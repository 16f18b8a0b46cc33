#pragma once
// The Outbox composite on top of a storage fixture (MemoryFixture or SqliteFixture): options with
// a 1 ms retry backoff and a poller the test drives, and a helper that commits one event.

#include <chrono>
#include <cstddef>
#include <filesystem>
#include <memory>
#include <string>

#include "outbox/metrics.hpp"
#include "outbox/outbox.hpp"
#include "outbox/retry_policy.hpp"

namespace outbox::testing {

template <typename Storage>
class OutboxFixture : public Storage {
 protected:
  Outbox::Options options() {
    using namespace std::chrono_literals;
    return {.connection_provider = this->pool,
            .tx_context = this->tx_context,
            .store = this->store,
            .listeners = this->listeners,
            .metrics = metrics,
            .dispatcher = {.retry_policy =
                               std::make_shared<ExponentialBackoffRetryPolicy>(1ms, 1ms, false)},
            // tests drive the poller with poll() unless they say otherwise
            .poller = {.interval = 1h}};
  }
  // Writes one event in its own committed transaction; returns the id.
  std::string commit_one(Outbox& ob, const std::string& type, const std::string& payload = "{}") {
    auto t = this->tx->begin();
    auto id = ob.writer().write(EventType::of(type), payload);
    t.commit();
    return *id;
  }

  std::shared_ptr<InMemoryMetrics> metrics = std::make_shared<InMemoryMetrics>();
};

// Every process thread, counted from /proc: what "starts no thread" means.
inline std::size_t thread_count() {
  std::size_t n = 0;
  for ([[maybe_unused]] const auto& entry :
       std::filesystem::directory_iterator("/proc/self/task")) {
    ++n;
  }
  return n;
}

}  // namespace outbox::testing
