#include "outbox/relay/statistics_publisher.hpp"

#include <cstdio>

#include "outbox/log.hpp"
#include "outbox/prometheus/metrics.hpp"

namespace outbox::relay {

StatisticsPublisher::StatisticsPublisher(std::string name, std::chrono::milliseconds log_interval,
                                         std::shared_ptr<prometheus::PrometheusMetrics> metrics)
    : name_(std::move(name)),
      log_interval_(log_interval),
      metrics_(std::move(metrics)),
      last_log_(std::chrono::steady_clock::now()) {}

std::vector<PublishResult> StatisticsPublisher::publish(std::span<const PublishRequest> batch) {
  std::map<std::string, std::int64_t, std::less<>> added;
  for (const auto& r : batch) {
    ++added[r.event->event_type()];
  }
  if (metrics_) {
    for (const auto& [type, n] : added) {
      metrics_->record_statistics(name_, type, n);
    }
  }
  std::string summary;
  {
    std::lock_guard lock(mutex_);
    for (const auto& [type, n] : added) {
      counts_[type] += n;
    }
    since_log_ += static_cast<std::int64_t>(batch.size());
    const auto now = std::chrono::steady_clock::now();
    if (now - last_log_ >= log_interval_) {
      const double seconds = std::chrono::duration<double>(now - last_log_).count();
      char rate[64];
      std::snprintf(rate, sizeof rate, "%.1f/s", static_cast<double>(since_log_) / seconds);
      summary = "statistics " + name_ + ": " + std::to_string(since_log_) + " events in " +
                std::to_string(static_cast<long long>(seconds)) + " s (" + rate + "); since start:";
      for (const auto& [type, n] : counts_) {
        summary += " " + type + "=" + std::to_string(n);
      }
      since_log_ = 0;
      last_log_ = now;
    }
  }
  if (!summary.empty()) {
    log(LogLevel::Info, summary);
  }
  return std::vector<PublishResult>(batch.size(), PublishResult::ok());
}

std::map<std::string, std::int64_t> StatisticsPublisher::counts() const {
  std::lock_guard lock(mutex_);
  return {counts_.begin(), counts_.end()};
}

}  // namespace outbox::relay
