#include "outbox/relay/statistics_publisher.hpp"

#include <gtest/gtest.h>

#include "outbox/prometheus/metrics.hpp"

namespace outbox::relay {
namespace {

TEST(StatisticsPublisher, CountsPerTypeAndExportsTheCounts) {
  auto metrics = std::make_shared<prometheus::PrometheusMetrics>();
  StatisticsPublisher stats("stats", std::chrono::milliseconds(0), metrics);
  const auto a = EventEnvelope::of_json(EventType::of("A"), "{}");
  const auto b = EventEnvelope::of_json(EventType::of("B"), "{}");
  const std::vector<PublishRequest> batch = {{&a, ""}, {&b, ""}, {&a, ""}};
  const auto results = stats.publish(batch);
  ASSERT_EQ(results.size(), 3u);
  for (const auto& r : results) {
    EXPECT_TRUE(r.is_ok());
  }
  stats.publish(std::span(batch).first(1));
  EXPECT_EQ(stats.counts(), (std::map<std::string, std::int64_t>{{"A", 3}, {"B", 1}}));
  const auto text = metrics->serialize();
  EXPECT_NE(text.find("outbox_statistics_events_total{event_type=\"A\",publisher=\"stats\"} 3"),
            std::string::npos)
      << text;
}

}  // namespace
}  // namespace outbox::relay
