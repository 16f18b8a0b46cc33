#include "outbox/prometheus/metrics.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

#include "tests/support/test_support.hpp"

namespace outbox::prometheus {
namespace {

using namespace std::chrono_literals;

TEST(PrometheusMetrics, ExposesCountersGaugesAndPublisherSeries) {
  PrometheusMetrics m;
  m.increment_hot_enqueued();
  m.increment_cold_enqueued();
  m.increment_cold_enqueued();
  m.increment_dispatch_success();
  m.increment_dispatch_dead();
  m.record_queue_depths(3, 7);
  m.record_oldest_lag_ms(1500);
  m.record_publish("kafka-main", PublishResult::Kind::Ok, 2ms);
  m.record_publish("kafka-main", PublishResult::Kind::Ok, 3ms);
  m.record_publish("hooks", PublishResult::Kind::Permanent, 40ms);
  const std::string text = m.serialize();
  for (const char* line : {"outbox_hot_enqueued_total 1", "outbox_cold_enqueued_total 2",
                           "outbox_dispatch_dead_total 1", "outbox_queue_depth{queue=\"cold\"} 7",
                           "outbox_oldest_pending_age_seconds 1.5",
                           "outbox_publish_total{publisher=\"kafka-main\",result=\"ok\"} 2",
                           "outbox_publish_total{publisher=\"hooks\",result=\"permanent\"} 1",
                           "outbox_publish_duration_seconds_count{publisher=\"kafka-main\"} 2",
                           "# TYPE outbox_publish_duration_seconds histogram"}) {
    EXPECT_NE(text.find(line), std::string::npos) << line << "\n" << text;
  }
}

// The exposition must be accepted by Prometheus' own linter (Debian's prometheus package).
TEST(PrometheusMetrics, LeaseSeries) {
  PrometheusMetrics m;
  m.increment_lease_acquired("leader", false);
  m.record_lease("leader", true, 3);
  m.increment_lease_lost("leader");
  m.record_lease("leader", false, 3);
  m.increment_lease_acquired("leader", true);
  m.record_lease("leader", true, 5);
  const std::string text = m.serialize();
  EXPECT_NE(text.find("outbox_lease_held{name=\"leader\"} 1"), std::string::npos) << text;
  EXPECT_NE(text.find("outbox_lease_epoch{name=\"leader\"} 5"), std::string::npos) << text;
  EXPECT_NE(text.find("outbox_lease_acquisitions_total{name=\"leader\"} 2"), std::string::npos)
      << text;
  EXPECT_NE(text.find("outbox_lease_takeovers_total{name=\"leader\"} 1"), std::string::npos)
      << text;
  EXPECT_NE(text.find("outbox_lease_losses_total{name=\"leader\"} 1"), std::string::npos) << text;
}

TEST(PrometheusMetrics, OutputPassesPromtool) {
  PrometheusMetrics m;
  m.increment_dispatch_success();
  m.record_lease("leader", true, 2);
  m.increment_lease_acquired("leader", true);
  m.record_publish("log", PublishResult::Kind::Retriable, 1ms);
  testing::TempDir dir;
  const auto path = dir.file("metrics.txt");
  std::ofstream(path) << m.serialize();
  const std::string cmd = "promtool check metrics < " + path + " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr);
  std::string output;
  char buf[512];
  while (std::fgets(buf, sizeof buf, p) != nullptr) {
    output += buf;
  }
  const int status = pclose(p);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 127) {
    FAIL() << "promtool not found: run scripts/install-deps";
  }
  EXPECT_EQ(status, 0) << output;
}

}  // namespace
}  // namespace outbox::prometheus
