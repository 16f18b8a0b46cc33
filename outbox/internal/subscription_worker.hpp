#pragma once
// One subscription's thread in a SubscriptionRunner: reads its row and the stream, publishes what
// its filter takes and moves its cursor. Internal to outbox/subscription.cpp.

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "outbox/internal/lease_balancer.hpp"
#include "outbox/internal/periodic_worker.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/subscription.hpp"

namespace outbox {

// One subscription's thread and what it last saw. Thread-safe.
class SubscriptionRunner::Worker final : public internal::LeaseBalancer::Item {
 public:
  Worker(SubscriptionRunner& runner, Subscription sub);

  const Subscription& subscription() const { return sub_; }
  const std::string& lease() const override { return lease_; }
  void start() { thread_.start(); }
  /// Something may be readable (a commit, a sequencer run, the lease gained): read at once.
  void wake() {
    woken_ = true;
    thread_.wake();
  }
  void close() { thread_.close(); }
  bool held() const override { return !fence_ || fence_->token().has_value(); }
  void gained() override { wake(); }
  /// Asks the thread to give the lease back after the batch in progress.
  void yield() override {
    yield_ = true;
    thread_.wake();
  }

  View view() const;

 private:
  void tick();
  std::chrono::milliseconds next_wait();
  void set_state(std::optional<SubscriptionState> state);
  /// The wait after an empty poll (the idle backoff).
  std::chrono::milliseconds idle();
  /// One poll; the wait before the next, and in `waiting` why it does not deliver (if so).
  std::chrono::milliseconds run_once(std::string& waiting);

  SubscriptionRunner& runner_;
  Subscription sub_;
  std::string lease_;
  std::shared_ptr<LeaseFence> fence_;
  std::atomic<bool> yield_{false};
  // Woken since the last poll that read something: an empty read then means held back.
  std::atomic<bool> woken_{false};
  int empty_polls_ = 0;       // the thread's own
  mutable std::mutex mutex_;  // guards waiting_, state_, wait_
  std::string waiting_ = "starting";
  std::optional<SubscriptionState> state_;
  std::chrono::milliseconds wait_{0};
  internal::PeriodicWorker thread_;  // last: stopped first
};

}  // namespace outbox
