#pragma once
// The chaos harness's endpoint: a real HTTP server on loopback that records each delivery in
// arrival order and misbehaves on command (fails, throttles, stalls).

#include <chrono>
#include <memory>
#include <string>
#include <unordered_set>
#include <vector>

#include "ledger.hpp"

namespace outbox::chaos {

/// How the endpoint answers for now.
enum class EndpointMode {
  Healthy,   ///< records, 200
  Failing,   ///< 500, records nothing
  Throttle,  ///< 503 with Retry-After: 1, records nothing
  Stalling,  ///< records, then answers only after the stall (past the relay's request timeout)
};

/// What the endpoint did besides accepting.
struct EndpointCounts {
  std::size_t failed = 0;     ///< 500s sent
  std::size_t throttled = 0;  ///< 503s sent
  std::size_t stalled = 0;    ///< recorded deliveries answered late: each may come again
  std::size_t malformed = 0;  ///< requests without an event id or a readable payload
};

/// Listens on 127.0.0.1 (a free port) until destroyed. Thread-safe.
class Receiver {
 public:
  /// Throws std::runtime_error when no port can be bound.
  explicit Receiver(std::chrono::milliseconds stall);
  ~Receiver();
  Receiver(const Receiver&) = delete;
  Receiver& operator=(const Receiver&) = delete;

  /// The URL of `path` on this server.
  std::string url(const std::string& path) const;
  void set_mode(EndpointMode mode);
  /// Every delivery so far, in arrival order.
  std::vector<Receipt> receipts() const;
  /// How many of `ids` arrived at least once.
  std::size_t received_of(const std::unordered_set<std::string>& ids) const;
  EndpointCounts counts() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace outbox::chaos
