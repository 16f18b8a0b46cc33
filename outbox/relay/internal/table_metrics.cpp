#include "outbox/relay/internal/table_metrics.hpp"

#include <algorithm>

namespace outbox::relay::internal {

std::size_t TableGauges::add() {
  std::lock_guard lock(mutex_);
  slots_.emplace_back();
  return slots_.size() - 1;
}

void TableGauges::record_queue_depths(std::size_t slot, int hot, int cold) {
  std::lock_guard lock(mutex_);
  slots_.at(slot).hot = hot;
  slots_.at(slot).cold = cold;
  int hot_sum = 0, cold_sum = 0;
  for (const auto& s : slots_) {
    hot_sum += s.hot;
    cold_sum += s.cold;
  }
  // Under the lock: two tables reporting at once must not leave the older sum behind.
  target_->record_queue_depths(hot_sum, cold_sum);
}

void TableGauges::record_oldest_lag_ms(std::size_t slot, std::int64_t lag_ms) {
  std::lock_guard lock(mutex_);
  slots_.at(slot).lag_ms = lag_ms;
  std::int64_t worst = 0;
  for (const auto& s : slots_) {
    worst = std::max(worst, s.lag_ms);
  }
  target_->record_oldest_lag_ms(worst);
}

TableMetrics::TableMetrics(std::shared_ptr<TableGauges> gauges, std::string lease_prefix)
    : gauges_(std::move(gauges)), lease_prefix_(std::move(lease_prefix)), slot_(gauges_->add()) {}

void TableMetrics::record_lease(std::string_view name, bool held, std::int64_t epoch) {
  gauges_->target().record_lease(lease_prefix_ + std::string(name), held, epoch);
}

void TableMetrics::increment_lease_acquired(std::string_view name, bool takeover) {
  gauges_->target().increment_lease_acquired(lease_prefix_ + std::string(name), takeover);
}

void TableMetrics::increment_lease_lost(std::string_view name) {
  gauges_->target().increment_lease_lost(lease_prefix_ + std::string(name));
}

}  // namespace outbox::relay::internal
