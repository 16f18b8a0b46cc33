#include "outbox/relay/internal/table_metrics.hpp"

#include <gtest/gtest.h>

#include <map>

namespace outbox::relay::internal {
namespace {

class Recording final : public MetricsExporter {
 public:
  void increment_dispatch_success() override { ++success; }
  void record_queue_depths(int h, int c) override {
    hot = h;
    cold = c;
  }
  void record_oldest_lag_ms(std::int64_t l) override { lag = l; }
  void record_lease(std::string_view name, bool held, std::int64_t) override {
    leases[std::string(name)] = held;
  }
  int success = 0, hot = -1, cold = -1;
  std::int64_t lag = -1;
  std::map<std::string, bool> leases;
};

TEST(TableMetrics, CountersPassOnGaugesCombineLeasesKeepTheirTable) {
  auto target = std::make_shared<Recording>();
  auto gauges = std::make_shared<TableGauges>(target);
  TableMetrics events(gauges, ""), jobs(gauges, "outbox_dispatch_jobs/");
  events.increment_dispatch_success();
  jobs.increment_dispatch_success();
  EXPECT_EQ(target->success, 2);

  events.record_queue_depths(1, 10);
  jobs.record_queue_depths(0, 5);
  EXPECT_EQ(target->hot, 1);
  EXPECT_EQ(target->cold, 15);
  jobs.record_queue_depths(0, 0);
  EXPECT_EQ(target->cold, 10);

  events.record_oldest_lag_ms(300);
  jobs.record_oldest_lag_ms(9000);
  EXPECT_EQ(target->lag, 9000);  // the worst table: an alert on the gauge sees it
  jobs.record_oldest_lag_ms(0);
  EXPECT_EQ(target->lag, 300);

  events.record_lease("part:0", true, 1);
  jobs.record_lease("part:0", false, 1);
  EXPECT_TRUE(target->leases.at("part:0"));
  EXPECT_FALSE(target->leases.at("outbox_dispatch_jobs/part:0"));
}

}  // namespace
}  // namespace outbox::relay::internal
