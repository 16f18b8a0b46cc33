// A relay built in code with a PublishSpanHook: every publish runs in a span the hook starts from
// the event's own trace context, the receiver gets the span's context as its parent, the hook
// hears each outcome, and a hook that throws or answers nonsense never stops a delivery. And what
// a relay built in code says as it is made.

#include <gtest/gtest.h>
#include <httplib.h>

#include <map>
#include <mutex>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/log.hpp"
#include "outbox/relay/relay.hpp"
#include "outbox/trace_context.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using testing::wait_until;

const std::string kParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const std::string kChild = "00-4bf92f3577b34da6a3ce929d0e0e4736-1111111111111111-01";

class RecordingSpans final : public PublishSpanHook {
 public:
  std::optional<TraceContext> start(const EventEnvelope& event,
                                    const std::optional<TraceContext>& parent) override {
    std::lock_guard lock(mutex_);
    parents_[*event.aggregate_id()] = parent ? parent->traceparent : "";
    if (*event.aggregate_id() == "throws") {
      throw std::runtime_error("tracer down");
    }
    if (*event.aggregate_id() == "nonsense") {
      return TraceContext{"not-a-traceparent", ""};
    }
    return TraceContext{kChild, "relay=span"};
  }
  void end(const EventEnvelope& event, bool delivered, std::string_view error) override {
    std::lock_guard lock(mutex_);
    ends_[*event.aggregate_id()] = delivered ? "delivered" : std::string(error);
  }
  std::map<std::string, std::string> parents() {
    std::lock_guard lock(mutex_);
    return parents_;
  }
  std::map<std::string, std::string> ends() {
    std::lock_guard lock(mutex_);
    return ends_;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::string> parents_, ends_;
};

TEST(RelaySpans, EachPublishRunsInAChildSpanWhoseContextTheReceiverGets) {
  testing::TempDir dir;
  const std::string url = "sqlite://" + dir.file("spans.db");
  auto pool = open_pool(url, 1);
  migrate(*pool->acquire());
  auto store = detect_store(*pool->acquire());
  const auto event = [](const std::string& id, bool traced) {
    auto b = EventEnvelope::builder(EventType::of("E"))
                 .aggregate_type(AggregateType::of("A"))
                 .aggregate_id(id)
                 .payload_json("{}");
    if (traced) {
      b.header("traceparent", kParent);
    }
    return b.build();
  };
  const std::vector<EventEnvelope> events = {event("traced", true), event("untraced", false),
                                             event("rejected", true), event("throws", true),
                                             event("nonsense", true)};
  store->insert_batch(*pool->acquire(), events);
  // Written by another client: a header value that is not UTF-8 (a row read back is delivered as
  // it is; a span around it must not change that).
  pool->acquire()->execute(
      "INSERT INTO outbox_event (event_id, event_type, aggregate_type, aggregate_id, headers, "
      "payload) VALUES ('latin1', 'E', 'A', 'latin1', '{\"traceparent\": \"" +
      kParent + "\", \"x-name\": \"caf\xe9\"}', '{}')");
  testing::HttpTestServer http;
  std::mutex mutex;
  std::map<std::string, std::string> received;  // aggregate id → traceparent received
  http.respond([&](const testing::ReceivedRequest& r, httplib::Response& res) {
    std::lock_guard lock(mutex);
    received[r.header("X-Outbox-Aggregate-Id")] = r.header("traceparent");
    if (r.header("X-Outbox-Aggregate-Id") == "rejected") {
      res.status = 422;
      res.set_content("no such account", "text/plain");
    }
  });
  relay::RelayConfig config;
  config.database = {.url = url, .table = "outbox_event", .pool_size = 2};
  config.poller.interval = std::chrono::milliseconds(50);
  config.admin.enabled = false;
  relay::PublisherConfig publisher{.name = "hooks"};
  publisher.type = relay::PublisherConfig::Type::Http;
  config.publishers.push_back(publisher);
  config.routes.push_back({.publisher = "hooks", .target = http.url("/events/{aggregate_id}")});
  auto spans = std::make_shared<RecordingSpans>();
  relay::Relay relay(config, spans);
  relay.start();
  ASSERT_TRUE(wait_until([&] { return spans->ends().size() == 6; }));
  relay.stop();

  const auto parents = spans->parents();
  EXPECT_EQ(parents.at("traced"), kParent);
  EXPECT_EQ(parents.at("untraced"), "");  // no context of its own: a root span
  std::lock_guard lock(mutex);
  EXPECT_EQ(received.at("traced"), kChild);
  EXPECT_EQ(received.at("untraced"), kChild);
  EXPECT_EQ(received.at("throws"), kParent);    // the tracer failed: the event's own context
  EXPECT_EQ(received.at("nonsense"), kParent);  // an invalid answer is not forwarded
  const auto ends = spans->ends();
  EXPECT_EQ(ends.at("traced"), "delivered");
  EXPECT_NE(ends.at("rejected").find("422"), std::string::npos) << ends.at("rejected");
  EXPECT_NE(ends.at("rejected").find("no such account"), std::string::npos);
  EXPECT_EQ(received.at("latin1"), kChild);
  EXPECT_EQ(spans->ends().at("latin1"), "delivered");
  EXPECT_EQ(store->count_by_status(*pool->acquire())[1], 5);
  // The row keeps the writer's context: the span's is only what was forwarded.
  const auto row = store->find(*pool->acquire(), events[0].event_id());
  EXPECT_NE(row->headers_json->find(kParent), std::string::npos);
  EXPECT_EQ(row->headers_json->find(kChild), std::string::npos);
}

// A table whose index of fronts is gone (dropped here) is said once as the relay is made: the
// relay made the table's group store twice (once for status, once for its drain), and each said it.
TEST(RelaySpans, AGroupTableWithoutItsIndexOfFrontsIsSaidOnceAsTheRelayIsMade) {
  testing::TempDir dir;
  const std::string url = "sqlite://" + dir.file("fronts.db");
  auto pool = open_pool(url, 1);
  migrate(*pool->acquire());
  pool->acquire()->execute("DROP INDEX outbox_event_groups_front");
  std::mutex mutex;
  std::vector<std::string> warnings;
  set_log_sink([&](LogLevel level, std::string_view message) {
    std::lock_guard lock(mutex);
    if (level == LogLevel::Warning && message.find("_groups_front") != std::string_view::npos) {
      warnings.emplace_back(message);
    }
  });
  relay::RelayConfig config;
  config.database = {.url = url, .table = "outbox_event", .pool_size = 2};
  config.admin.enabled = false;
  config.publishers.push_back(relay::PublisherConfig{.name = "log"});
  config.routes.push_back({.publisher = "log", .table = "outbox_event"});
  { relay::Relay relay(config); }
  set_log_sink({});
  std::lock_guard lock(mutex);
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("no index outbox_event_groups_front"), std::string::npos)
      << warnings[0];
}

}  // namespace
}  // namespace outbox
