#pragma once
// The thread that keeps a node's claims alive: every quarter lease it renews the claims of the
// events the node holds (queued and running), so another node does not take them meanwhile.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "outbox/clock.hpp"

namespace outbox {
class OutboxStore;
namespace sql {
class ConnectionProvider;
}  // namespace sql
}  // namespace outbox

namespace outbox::internal {

class ClaimHeartbeat {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  struct Options {
    std::shared_ptr<sql::ConnectionProvider> provider;
    std::shared_ptr<OutboxStore> store;
    std::shared_ptr<Clock> clock;
    std::string claim_owner;
    std::chrono::milliseconds claim_timeout{0};
  };
  /// The ids whose claims to renew now.
  using HeldIds = std::function<std::vector<std::string>()>;
  /// The ids really renewed, with a time no later than the renewal.
  using Renewed = std::function<void(const std::unordered_set<std::string>& ids, TimePoint at)>;

  /// Starts the thread.
  ClaimHeartbeat(Options options, HeldIds held, Renewed renewed);
  /// Calls stop().
  ~ClaimHeartbeat();
  ClaimHeartbeat(const ClaimHeartbeat&) = delete;
  ClaimHeartbeat& operator=(const ClaimHeartbeat&) = delete;
  /// Stops the thread. Idempotent.
  void stop();

 private:
  void loop();

  Options options_;
  HeldIds held_;
  Renewed renewed_;
  std::mutex mutex_;  // guards stop_
  std::condition_variable wake_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace outbox::internal
