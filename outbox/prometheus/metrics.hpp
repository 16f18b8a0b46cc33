#pragma once
// MetricsExporter for Prometheus (prometheus-cpp): the outbox counters and gauges, publisher
// results and publish latency, rendered in the text exposition format.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>

#include "outbox/metrics.hpp"
#include "outbox/publisher.hpp"

namespace outbox::prometheus {

/// Metric names: outbox_{hot_enqueued,hot_dropped,cold_enqueued,dispatch_success,
/// dispatch_failure,dispatch_dead,status_update_failure,trace_context_dropped}_total,
/// outbox_queue_depth{queue},
/// outbox_oldest_pending_age_seconds, outbox_publish_total{publisher,result},
/// outbox_publish_duration_seconds{publisher} (histogram). Thread-safe.
class PrometheusMetrics final : public MetricsExporter {
 public:
  PrometheusMetrics();
  ~PrometheusMetrics() override;
  PrometheusMetrics(const PrometheusMetrics&) = delete;
  PrometheusMetrics& operator=(const PrometheusMetrics&) = delete;

  void increment_hot_enqueued() override;
  void increment_hot_dropped() override;
  void increment_cold_enqueued() override;
  void increment_dispatch_success() override;
  void increment_dispatch_failure() override;
  void increment_dispatch_dead() override;
  void increment_status_update_failure() override;
  void increment_trace_context_dropped() override;
  /// outbox_wakeups_total, outbox_wakeups_empty_total, outbox_wakeup_reconnects_total.
  void increment_wakeup() override;
  void increment_wakeup_empty() override;
  void increment_wakeup_reconnect() override;
  void record_queue_depths(int hot, int cold) override;
  void record_oldest_lag_ms(std::int64_t lag_ms) override;
  /// outbox_lease_held{name} (1/0) and outbox_lease_epoch{name}.
  void record_lease(std::string_view name, bool held, std::int64_t epoch) override;
  /// outbox_lease_acquisitions_total{name}, outbox_lease_takeovers_total{name}.
  void increment_lease_acquired(std::string_view name, bool takeover) override;
  /// outbox_lease_losses_total{name}.
  void increment_lease_lost(std::string_view name) override;

  /// outbox_subscription_delivered_total{subscription}, outbox_subscription_failures_total.
  void increment_subscription_delivered(std::string_view name, std::int64_t n) override;
  void increment_subscription_failure(std::string_view name) override;
  /// outbox_subscription_lag_events{subscription}, outbox_subscription_lag_seconds,
  /// outbox_subscription_status{subscription,status} (1 for the current one).
  void record_subscription(std::string_view name, std::string_view status, std::int64_t lag_events,
                           double lag_seconds);
  /// Removes the gauges of a subscription that no longer exists.
  void forget_subscription(std::string_view name);
  /// outbox_statistics_events_total{publisher,event_type} (the statistics publisher).
  void record_statistics(std::string_view publisher, std::string_view event_type, std::int64_t n);
  /// outbox_stream_holdback_seconds.
  void record_stream_holdback(double seconds);
  /// outbox_groups_blocked, outbox_groups_oldest_blocked_seconds (0 when none),
  /// outbox_groups_active (running here now), outbox_group_partitions_held (held here).
  void record_groups(std::int64_t blocked, double oldest_blocked_seconds, std::int64_t active,
                     std::int64_t partitions_held);

  /// Counts one publication by `publisher` and its latency.
  void record_publish(std::string_view publisher, PublishResult::Kind result,
                      std::chrono::nanoseconds elapsed);
  /// Every metric in the Prometheus text format (version 0.0.4).
  std::string serialize() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::prometheus
