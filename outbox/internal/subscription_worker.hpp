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
  /// Something may be readable (a commit, a sequencer run, the lease gained): read at once,
  /// unless a failed publication's retry delay is running (hints come at any rate: they must not
  /// turn a backoff into a busy retry loop); the read after the delay then counts as woken.
  void wake() {
    woken_ = true;
    std::lock_guard lock(mutex_);  // with tick(): a wake-up either precedes retry_at_ or sees it
    if (std::chrono::steady_clock::now() >= retry_at_) {
      thread_.wake();
    }
  }
  /// Reads at once, even during a retry delay (an operator changed the subscription).
  void poll_now() {
    woken_ = true;
    std::lock_guard lock(mutex_);
    retry_at_ = {};
    polled_now_ = true;
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
  int empty_polls_ = 0;    // the thread's own
  bool retrying_ = false;  // the thread's own: run_once's wait is a retry delay
  /// A cursor move for events already published whose write failed (the disk full, the server
  /// gone): saved before anything is read again, so an outage of the table does not publish the
  /// batch again at every retry. The thread's own.
  struct UnsavedAdvance {
    StreamPosition from;
    StreamPosition to;
    std::int64_t delivered = 0;
    std::optional<LeaseToken> token;
  };
  std::optional<UnsavedAdvance> unsaved_;
  mutable std::mutex mutex_;  // guards waiting_, state_, wait_, retry_at_, polled_now_
  std::string waiting_ = "starting";
  std::optional<SubscriptionState> state_;
  std::chrono::milliseconds wait_{0};
  std::chrono::steady_clock::time_point retry_at_{};  // wake() ends no wait before it
  bool polled_now_ = false;                           // poll_now() since the attempt began
  internal::PeriodicWorker thread_;                   // last: stopped first
};

}  // namespace outbox
