#include "outbox/relay/log_publisher.hpp"

#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/test_support.hpp"

namespace outbox::relay {
namespace {

TEST(LogPublisher, WritesOneJsonLinePerEventAndRefusesInvalidPayloads) {
  testing::TempDir dir;
  const auto path = dir.file("events.jsonl");
  auto good = EventEnvelope::builder(EventType::of("OrderPlaced"))
                  .aggregate_id("o-1")
                  .header("k", "v")
                  .payload_json("{\"total\":12}")
                  .build();
  auto bad = EventEnvelope::of_json(EventType::of("Broken"), "{oops");
  {
    LogPublisher publisher(path);
    auto results = publisher.publish(
        std::vector<PublishRequest>{{&good, "orders"}, {&bad, "orders"}, {&good, "again"}});
    ASSERT_EQ(results.size(), 3u);
    EXPECT_TRUE(results[0].is_ok());
    EXPECT_EQ(results[1].kind, PublishResult::Kind::Permanent);
    EXPECT_NE(results[1].reason.find("not valid JSON"), std::string::npos);
    EXPECT_TRUE(results[2].is_ok());
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) {
    lines.push_back(nlohmann::json::parse(line));
  }
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0].at("target"), "orders");
  EXPECT_EQ(lines[0].at("event").at("event_id"), good.event_id());
  EXPECT_EQ(lines[0].at("event").at("payload").at("total"), 12);
  EXPECT_EQ(lines[0].at("event").at("headers").at("k"), "v");
  EXPECT_EQ(lines[1].at("target"), "again");
  EXPECT_THROW(LogPublisher("/nonexistent/dir/x.jsonl"), std::invalid_argument);
}

}  // namespace
}  // namespace outbox::relay
