#pragma once
// Observability seam.

#include <atomic>
#include <cstdint>
#include <memory>
#include <string_view>

namespace outbox {

/// Receives counters and gauges from the dispatcher and poller. Every method defaults to a no-op.
/// Implementations must be thread-safe and must not throw.
class MetricsExporter {
 public:
  virtual ~MetricsExporter() = default;
  virtual void increment_hot_enqueued() {}
  virtual void increment_hot_dropped() {}
  virtual void increment_cold_enqueued() {}
  virtual void increment_dispatch_success() {}
  virtual void increment_dispatch_failure() {}
  virtual void increment_dispatch_dead() {}
  /// A DONE/RETRY/DEAD update that could not be written (the row stays for the poller).
  virtual void increment_status_update_failure() {}
  virtual void record_queue_depths(int /*hot*/, int /*cold*/) {}
  virtual void record_oldest_lag_ms(std::int64_t /*lag_ms*/) {}
  /// Whether this process holds lease `name`, and the epoch of that holding (or the last one).
  virtual void record_lease(std::string_view /*name*/, bool /*held*/, std::int64_t /*epoch*/) {}
  /// This process acquired lease `name`; `takeover`: from another owner whose holding expired.
  virtual void increment_lease_acquired(std::string_view /*name*/, bool /*takeover*/) {}
  /// A holding ended without a release: its renewal was refused or late, or a fenced write found
  /// it gone.
  virtual void increment_lease_lost(std::string_view /*name*/) {}
  /// Events a subscription handed to its publisher, and its failed batches.
  virtual void increment_subscription_delivered(std::string_view /*name*/, std::int64_t /*n*/) {}
  virtual void increment_subscription_failure(std::string_view /*name*/) {}
  /// The writer removed an invalid traceparent or tracestate from an event (docs/guide.md).
  virtual void increment_trace_context_dropped() {}
  /// A change watcher told the poller rows may have been committed (docs/guide.md, wake-ups).
  virtual void increment_wakeup() {}
  /// A cycle a wake-up started handed nothing over (the hint was spurious or came late).
  virtual void increment_wakeup_empty() {}
  /// A change watcher connected again after losing its connection.
  virtual void increment_wakeup_reconnect() {}

  /// A shared exporter that does nothing.
  static std::shared_ptr<MetricsExporter> noop();
};

/// Keeps every counter and gauge in memory, readable with snapshot(). Thread-safe.
class InMemoryMetrics final : public MetricsExporter {
 public:
  struct Snapshot {
    std::int64_t hot_enqueued, hot_dropped, cold_enqueued, dispatch_success, dispatch_failure,
        dispatch_dead, status_update_failure, hot_depth, cold_depth, oldest_lag_ms, lease_acquired,
        lease_takeovers, lease_lost, trace_context_dropped, wakeups, wakeups_empty,
        wakeup_reconnects;
  };
  void increment_hot_enqueued() override { hot_enqueued_++; }
  void increment_hot_dropped() override { hot_dropped_++; }
  void increment_cold_enqueued() override { cold_enqueued_++; }
  void increment_dispatch_success() override { dispatch_success_++; }
  void increment_dispatch_failure() override { dispatch_failure_++; }
  void increment_dispatch_dead() override { dispatch_dead_++; }
  void increment_status_update_failure() override { status_update_failure_++; }
  void record_queue_depths(int hot, int cold) override {
    hot_depth_ = hot;
    cold_depth_ = cold;
  }
  void record_oldest_lag_ms(std::int64_t lag_ms) override { oldest_lag_ms_ = lag_ms; }
  void increment_lease_acquired(std::string_view, bool takeover) override {
    lease_acquired_++;
    if (takeover) {
      lease_takeovers_++;
    }
  }
  void increment_lease_lost(std::string_view) override { lease_lost_++; }
  void increment_trace_context_dropped() override { trace_context_dropped_++; }
  void increment_wakeup() override { wakeups_++; }
  void increment_wakeup_empty() override { wakeups_empty_++; }
  void increment_wakeup_reconnect() override { wakeup_reconnects_++; }
  Snapshot snapshot() const;

 private:
  std::atomic<std::int64_t> hot_enqueued_{0}, hot_dropped_{0}, cold_enqueued_{0},
      dispatch_success_{0}, dispatch_failure_{0}, dispatch_dead_{0}, status_update_failure_{0},
      hot_depth_{0}, cold_depth_{0}, oldest_lag_ms_{0}, lease_acquired_{0}, lease_takeovers_{0},
      lease_lost_{0}, trace_context_dropped_{0}, wakeups_{0}, wakeups_empty_{0},
      wakeup_reconnects_{0};
};

}  // namespace outbox
