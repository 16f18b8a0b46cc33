#include "outbox/metrics.hpp"

namespace outbox {

std::shared_ptr<MetricsExporter> MetricsExporter::noop() {
  static const std::shared_ptr<MetricsExporter> instance = std::make_shared<MetricsExporter>();
  return instance;
}

InMemoryMetrics::Snapshot InMemoryMetrics::snapshot() const {
  return Snapshot{hot_enqueued_.load(),
                  hot_dropped_.load(),
                  cold_enqueued_.load(),
                  dispatch_success_.load(),
                  dispatch_failure_.load(),
                  dispatch_dead_.load(),
                  status_update_failure_.load(),
                  hot_depth_.load(),
                  cold_depth_.load(),
                  oldest_lag_ms_.load(),
                  lease_acquired_.load(),
                  lease_takeovers_.load(),
                  lease_lost_.load(),
                  trace_context_dropped_.load(),
                  wakeups_.load(),
                  wakeups_empty_.load(),
                  wakeup_reconnects_.load()};
}

}  // namespace outbox
