#include "outbox/prometheus/metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <map>
#include <mutex>

namespace outbox::prometheus {
namespace {

namespace pm = ::prometheus;

pm::Counter& counter(pm::Registry& registry, const std::string& name, const std::string& help) {
  return pm::BuildCounter().Name(name).Help(help).Register(registry).Add({});
}

}  // namespace

struct PrometheusMetrics::Impl {
  struct PublisherSeries {
    pm::Counter* ok;
    pm::Counter* retriable;
    pm::Counter* permanent;
    pm::Histogram* duration;
  };

  std::shared_ptr<pm::Registry> registry = std::make_shared<pm::Registry>();
  pm::Counter& hot_enqueued =
      counter(*registry, "outbox_hot_enqueued_total", "Events queued by the after-commit hot path");
  pm::Counter& hot_dropped =
      counter(*registry, "outbox_hot_dropped_total",
              "Hot-path events refused by a full queue (left to the poller)");
  pm::Counter& cold_enqueued =
      counter(*registry, "outbox_cold_enqueued_total", "Events queued by the poller");
  pm::Counter& success =
      counter(*registry, "outbox_dispatch_success_total", "Events delivered and marked DONE");
  pm::Counter& failure =
      counter(*registry, "outbox_dispatch_failure_total", "Failed deliveries scheduled for retry");
  pm::Counter& dead = counter(*registry, "outbox_dispatch_dead_total", "Events marked DEAD");
  pm::Counter& status_update_failure = counter(*registry, "outbox_status_update_failure_total",
                                               "DONE/RETRY/DEAD updates that could not be written");
  pm::Counter& trace_context_dropped =
      counter(*registry, "outbox_trace_context_dropped_total",
              "Invalid traceparent/tracestate values the writer removed from events");
  pm::Counter& wakeups = counter(*registry, "outbox_wakeups_total",
                                 "Change hints (NOTIFY, data_version) that woke the poller");
  pm::Counter& wakeups_empty =
      counter(*registry, "outbox_wakeups_empty_total",
              "Poll cycles a change hint started that found nothing to hand over");
  pm::Counter& wakeup_reconnects =
      counter(*registry, "outbox_wakeup_reconnects_total",
              "Times a change watcher connected again after losing its connection");
  pm::Family<pm::Gauge>& depth = pm::BuildGauge()
                                     .Name("outbox_queue_depth")
                                     .Help("Events waiting in the dispatcher's queues")
                                     .Register(*registry);
  pm::Gauge& hot_depth = depth.Add({{"queue", "hot"}});
  pm::Gauge& cold_depth = depth.Add({{"queue", "cold"}});
  pm::Gauge& oldest = pm::BuildGauge()
                          .Name("outbox_oldest_pending_age_seconds")
                          .Help("Age of the oldest pending event seen by the last poll")
                          .Register(*registry)
                          .Add({});
  pm::Family<pm::Counter>& published = pm::BuildCounter()
                                           .Name("outbox_publish_total")
                                           .Help("Publications by publisher and result")
                                           .Register(*registry);
  pm::Family<pm::Histogram>& duration =
      pm::BuildHistogram()
          .Name("outbox_publish_duration_seconds")
          .Help("Time from publish call to broker/endpoint answer")
          .Register(*registry);

  pm::Family<pm::Gauge>& lease_held = pm::BuildGauge()
                                          .Name("outbox_lease_held")
                                          .Help("1 while this process holds the lease, else 0")
                                          .Register(*registry);
  pm::Family<pm::Gauge>& lease_epoch =
      pm::BuildGauge()
          .Name("outbox_lease_epoch")
          .Help("Epoch of this process's current (or last) holding of the lease")
          .Register(*registry);
  pm::Family<pm::Counter>& lease_acquired = pm::BuildCounter()
                                                .Name("outbox_lease_acquisitions_total")
                                                .Help("Times this process acquired the lease")
                                                .Register(*registry);
  pm::Family<pm::Counter>& lease_takeovers =
      pm::BuildCounter()
          .Name("outbox_lease_takeovers_total")
          .Help("Acquisitions from a holder whose lease expired (failovers)")
          .Register(*registry);
  pm::Family<pm::Counter>& lease_lost =
      pm::BuildCounter()
          .Name("outbox_lease_losses_total")
          .Help("Holdings that ended without a release (renewal refused or late, fenced write)")
          .Register(*registry);

  pm::Family<pm::Counter>& sub_delivered =
      pm::BuildCounter()
          .Name("outbox_subscription_delivered_total")
          .Help("Events a subscription handed to its publisher (in this process)")
          .Register(*registry);
  pm::Family<pm::Counter>& sub_failures =
      pm::BuildCounter()
          .Name("outbox_subscription_failures_total")
          .Help("Batches of a subscription that failed and will be retried from the failed event")
          .Register(*registry);
  pm::Family<pm::Gauge>& sub_lag_events =
      pm::BuildGauge()
          .Name("outbox_subscription_lag_events")
          .Help("Readable events after the subscription's cursor")
          .Register(*registry);
  pm::Family<pm::Gauge>& sub_lag_seconds =
      pm::BuildGauge()
          .Name("outbox_subscription_lag_seconds")
          .Help("Age of the subscription's first unread event (0 when caught up)")
          .Register(*registry);
  pm::Family<pm::Gauge>& sub_status =
      pm::BuildGauge()
          .Name("outbox_subscription_status")
          .Help("1 for the subscription's current status (ACTIVE, PAUSED, FAILED), 0 for others")
          .Register(*registry);
  pm::Family<pm::Counter>& statistics =
      pm::BuildCounter()
          .Name("outbox_statistics_events_total")
          .Help("Events a statistics publisher counted, by event type")
          .Register(*registry);
  pm::Gauge& holdback = pm::BuildGauge()
                            .Name("outbox_stream_holdback_seconds")
                            .Help(
                                "PostgreSQL: age of the oldest open transaction holding the "
                                "stream back (0 when none)")
                            .Register(*registry)
                            .Add({});

  pm::Gauge& groups_blocked =
      pm::BuildGauge()
          .Name("outbox_groups_blocked")
          .Help("Message groups blocked behind a head that failed for good (operator needed)")
          .Register(*registry)
          .Add({});
  pm::Gauge& groups_oldest_blocked = pm::BuildGauge()
                                         .Name("outbox_groups_oldest_blocked_seconds")
                                         .Help("How long the oldest blocked group has waited")
                                         .Register(*registry)
                                         .Add({});
  pm::Gauge& groups_active = pm::BuildGauge()
                                 .Name("outbox_groups_active")
                                 .Help("Message groups with an event running in this process")
                                 .Register(*registry)
                                 .Add({});
  pm::Gauge& partitions_held = pm::BuildGauge()
                                   .Name("outbox_group_partitions_held")
                                   .Help("Message-group partitions this process delivers")
                                   .Register(*registry)
                                   .Add({});

  std::mutex series_mutex;  // guards series
  std::map<std::string, PublisherSeries, std::less<>> series;

  PublisherSeries& series_for(std::string_view publisher) {
    std::lock_guard lock(series_mutex);
    auto it = series.find(publisher);
    if (it == series.end()) {
      const std::string name(publisher);
      static const pm::Histogram::BucketBoundaries kBuckets = {
          0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};
      it = series
               .emplace(
                   name,
                   PublisherSeries{&published.Add({{"publisher", name}, {"result", "ok"}}),
                                   &published.Add({{"publisher", name}, {"result", "retriable"}}),
                                   &published.Add({{"publisher", name}, {"result", "permanent"}}),
                                   &duration.Add({{"publisher", name}}, kBuckets)})
               .first;
    }
    return it->second;
  }
};

PrometheusMetrics::PrometheusMetrics() : impl_(std::make_unique<Impl>()) {}
PrometheusMetrics::~PrometheusMetrics() = default;

void PrometheusMetrics::increment_hot_enqueued() {
  impl_->hot_enqueued.Increment();
}
void PrometheusMetrics::increment_hot_dropped() {
  impl_->hot_dropped.Increment();
}
void PrometheusMetrics::increment_cold_enqueued() {
  impl_->cold_enqueued.Increment();
}
void PrometheusMetrics::increment_dispatch_success() {
  impl_->success.Increment();
}
void PrometheusMetrics::increment_dispatch_failure() {
  impl_->failure.Increment();
}
void PrometheusMetrics::increment_dispatch_dead() {
  impl_->dead.Increment();
}
void PrometheusMetrics::increment_trace_context_dropped() {
  impl_->trace_context_dropped.Increment();
}
void PrometheusMetrics::increment_wakeup() {
  impl_->wakeups.Increment();
}
void PrometheusMetrics::increment_wakeup_empty() {
  impl_->wakeups_empty.Increment();
}
void PrometheusMetrics::increment_wakeup_reconnect() {
  impl_->wakeup_reconnects.Increment();
}

void PrometheusMetrics::increment_status_update_failure() {
  impl_->status_update_failure.Increment();
}
void PrometheusMetrics::record_queue_depths(int hot, int cold) {
  impl_->hot_depth.Set(hot);
  impl_->cold_depth.Set(cold);
}
void PrometheusMetrics::record_oldest_lag_ms(std::int64_t lag_ms) {
  impl_->oldest.Set(static_cast<double>(lag_ms) / 1000.0);
}

// prometheus-cpp's Family::Add returns the existing series for known labels (thread-safe).
void PrometheusMetrics::record_lease(std::string_view name, bool held, std::int64_t epoch) {
  const std::map<std::string, std::string> labels{{"name", std::string(name)}};
  impl_->lease_held.Add(labels).Set(held ? 1 : 0);
  impl_->lease_epoch.Add(labels).Set(static_cast<double>(epoch));
}
void PrometheusMetrics::increment_lease_acquired(std::string_view name, bool takeover) {
  const std::map<std::string, std::string> labels{{"name", std::string(name)}};
  impl_->lease_acquired.Add(labels).Increment();
  auto& takeovers = impl_->lease_takeovers.Add(labels);  // present at 0 from the first holding on
  if (takeover) {
    takeovers.Increment();
  }
}
void PrometheusMetrics::increment_lease_lost(std::string_view name) {
  impl_->lease_lost.Add({{"name", std::string(name)}}).Increment();
}

void PrometheusMetrics::increment_subscription_delivered(std::string_view name, std::int64_t n) {
  impl_->sub_delivered.Add({{"subscription", std::string(name)}}).Increment(static_cast<double>(n));
}
void PrometheusMetrics::increment_subscription_failure(std::string_view name) {
  impl_->sub_failures.Add({{"subscription", std::string(name)}}).Increment();
}
void PrometheusMetrics::record_subscription(std::string_view name, std::string_view status,
                                            std::int64_t lag_events, double lag_seconds) {
  const std::map<std::string, std::string> labels{{"subscription", std::string(name)}};
  impl_->sub_lag_events.Add(labels).Set(static_cast<double>(lag_events));
  impl_->sub_lag_seconds.Add(labels).Set(lag_seconds);
  for (const char* s : {"ACTIVE", "PAUSED", "FAILED"}) {
    impl_->sub_status.Add({{"subscription", std::string(name)}, {"status", s}})
        .Set(status == s ? 1 : 0);
  }
}
void PrometheusMetrics::record_statistics(std::string_view publisher, std::string_view event_type,
                                          std::int64_t n) {
  impl_->statistics
      .Add({{"publisher", std::string(publisher)}, {"event_type", std::string(event_type)}})
      .Increment(static_cast<double>(n));
}
void PrometheusMetrics::forget_subscription(std::string_view name) {
  const std::map<std::string, std::string> labels{{"subscription", std::string(name)}};
  impl_->sub_lag_events.Remove(&impl_->sub_lag_events.Add(labels));
  impl_->sub_lag_seconds.Remove(&impl_->sub_lag_seconds.Add(labels));
  for (const char* s : {"ACTIVE", "PAUSED", "FAILED"}) {
    auto& gauge = impl_->sub_status.Add({{"subscription", std::string(name)}, {"status", s}});
    impl_->sub_status.Remove(&gauge);
  }
}
void PrometheusMetrics::record_stream_holdback(double seconds) {
  impl_->holdback.Set(seconds);
}

void PrometheusMetrics::record_groups(std::int64_t blocked, double oldest_blocked_seconds,
                                      std::int64_t active, std::int64_t partitions_held) {
  impl_->groups_blocked.Set(static_cast<double>(blocked));
  impl_->groups_oldest_blocked.Set(oldest_blocked_seconds);
  impl_->groups_active.Set(static_cast<double>(active));
  impl_->partitions_held.Set(static_cast<double>(partitions_held));
}

void PrometheusMetrics::record_publish(std::string_view publisher, PublishResult::Kind result,
                                       std::chrono::nanoseconds elapsed) {
  auto& s = impl_->series_for(publisher);
  switch (result) {
    case PublishResult::Kind::Ok:
      s.ok->Increment();
      break;
    case PublishResult::Kind::Retriable:
      s.retriable->Increment();
      break;
    case PublishResult::Kind::Permanent:
      s.permanent->Increment();
      break;
  }
  s.duration->Observe(std::chrono::duration<double>(elapsed).count());
}

std::string PrometheusMetrics::serialize() const {
  return pm::TextSerializer().Serialize(impl_->registry->Collect());
}

}  // namespace outbox::prometheus
