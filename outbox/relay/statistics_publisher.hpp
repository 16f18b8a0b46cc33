#pragma once
// Monitoring publisher: counts events per type (Crablet's StatisticsPublisher), logs a summary
// once per interval and exposes the counts as a Prometheus counter. Delivers nowhere.

#include <chrono>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "outbox/publisher.hpp"

namespace outbox::prometheus {
class PrometheusMetrics;
}

namespace outbox::relay {

/// Every event is Ok. Thread-safe.
class StatisticsPublisher final : public Publisher {
 public:
  /// `metrics` (optional) gets outbox_statistics_events_total{publisher,event_type}.
  StatisticsPublisher(std::string name, std::chrono::milliseconds log_interval,
                      std::shared_ptr<prometheus::PrometheusMetrics> metrics = {});

  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override;
  /// Events counted per event type since the start.
  std::map<std::string, std::int64_t> counts() const;

 private:
  std::string name_;
  std::chrono::milliseconds log_interval_;
  std::shared_ptr<prometheus::PrometheusMetrics> metrics_;
  mutable std::mutex mutex_;  // guards counts_, since_log_, last_log_
  std::map<std::string, std::int64_t, std::less<>> counts_;
  std::int64_t since_log_ = 0;
  std::chrono::steady_clock::time_point last_log_;
};

}  // namespace outbox::relay
