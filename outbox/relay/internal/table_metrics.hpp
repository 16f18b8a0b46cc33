#pragma once
// A relay that drains several outbox tables runs one Outbox per table over one exporter: each
// table reports through its own TableMetrics, which passes counters on, prefixes the table's
// lease names, and reports the gauges summed (queue depths) or at their worst (oldest lag).

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "outbox/metrics.hpp"

namespace outbox::relay::internal {

/// The gauges of every table, combined; shared by the TableMetrics of one relay. Thread-safe.
class TableGauges {
 public:
  explicit TableGauges(std::shared_ptr<MetricsExporter> target) : target_(std::move(target)) {}
  /// A slot for one more table.
  std::size_t add();
  void record_queue_depths(std::size_t slot, int hot, int cold);
  void record_oldest_lag_ms(std::size_t slot, std::int64_t lag_ms);
  MetricsExporter& target() const { return *target_; }

 private:
  struct Slot {
    int hot = 0, cold = 0;
    std::int64_t lag_ms = 0;
  };
  std::shared_ptr<MetricsExporter> target_;
  std::mutex mutex_;
  std::vector<Slot> slots_;
};

/// One table's view of the relay's exporter. `lease_prefix` ("" for the relay's own table,
/// "<table>/" otherwise) keeps the leases of two tables' lease tables apart (both have part:0).
class TableMetrics final : public MetricsExporter {
 public:
  TableMetrics(std::shared_ptr<TableGauges> gauges, std::string lease_prefix);
  void increment_hot_enqueued() override { gauges_->target().increment_hot_enqueued(); }
  void increment_hot_dropped() override { gauges_->target().increment_hot_dropped(); }
  void increment_cold_enqueued() override { gauges_->target().increment_cold_enqueued(); }
  void increment_dispatch_success() override { gauges_->target().increment_dispatch_success(); }
  void increment_dispatch_failure() override { gauges_->target().increment_dispatch_failure(); }
  void increment_dispatch_dead() override { gauges_->target().increment_dispatch_dead(); }
  void increment_status_update_failure() override {
    gauges_->target().increment_status_update_failure();
  }
  void increment_wakeup() override { gauges_->target().increment_wakeup(); }
  void increment_wakeup_empty() override { gauges_->target().increment_wakeup_empty(); }
  void increment_wakeup_reconnect() override { gauges_->target().increment_wakeup_reconnect(); }
  void record_queue_depths(int hot, int cold) override {
    gauges_->record_queue_depths(slot_, hot, cold);
  }
  void record_oldest_lag_ms(std::int64_t lag_ms) override {
    gauges_->record_oldest_lag_ms(slot_, lag_ms);
  }
  void record_lease(std::string_view name, bool held, std::int64_t epoch) override;
  void increment_lease_acquired(std::string_view name, bool takeover) override;
  void increment_lease_lost(std::string_view name) override;

 private:
  std::shared_ptr<TableGauges> gauges_;
  std::string lease_prefix_;
  std::size_t slot_;
};

}  // namespace outbox::relay::internal
