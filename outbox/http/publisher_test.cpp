#include "outbox/http/publisher.hpp"

#include <gtest/gtest.h>

#include <condition_variable>
#include <ctime>
#include <nlohmann/json.hpp>

#include "tests/support/http_server.hpp"

namespace outbox::http {
namespace {

using Kind = PublishResult::Kind;

EventEnvelope event(int n) {
  return EventEnvelope::builder(EventType::of("OrderPlaced"))
      .aggregate_type(AggregateType::of("Order"))
      .aggregate_id("o-" + std::to_string(n))
      .header("traceparent", "00-abc-" + std::to_string(n))
      .payload_json("{\"n\":" + std::to_string(n) + "}")
      .build();
}

TEST(HttpPublisher, WebhookPostsPayloadWithMetadataTokenAndSignature) {
  testing::HttpTestServer server;
  HttpPublisher publisher(
      {.bearer_token = "s3cret", .hmac_secret = "key", .headers = {{"X-Env", "test"}}});
  auto e = event(1);
  auto bytes = EventEnvelope::builder(EventType::of("Blob")).payload_bytes({1, 2, 0, 3}).build();
  auto results = publisher.publish(std::vector<PublishRequest>{{&e, server.url("/hooks/orders")},
                                                               {&bytes, server.url("/blob")}});
  ASSERT_EQ(results.size(), 2u);
  EXPECT_TRUE(results[0].is_ok()) << results[0].reason;
  EXPECT_TRUE(results[1].is_ok()) << results[1].reason;
  auto got = server.received();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].method, "POST");
  EXPECT_EQ(got[0].path, "/hooks/orders");
  EXPECT_EQ(got[0].body, "{\"n\":1}");
  EXPECT_EQ(got[0].header("Content-Type"), "application/json");
  EXPECT_EQ(got[0].header("Authorization"), "Bearer s3cret");
  EXPECT_EQ(got[0].header("X-Outbox-Event-Id"), e.event_id());
  EXPECT_EQ(got[0].header("X-Outbox-Event-Type"), "OrderPlaced");
  EXPECT_EQ(got[0].header("X-Outbox-Aggregate-Type"), "Order");
  EXPECT_EQ(got[0].header("X-Outbox-Aggregate-Id"), "o-1");
  EXPECT_EQ(got[0].header("traceparent"), "00-abc-1");
  EXPECT_EQ(got[0].header("X-Env"), "test");
  EXPECT_EQ(got[0].header("X-Outbox-Signature"), "sha256=" + hmac_sha256_hex("key", got[0].body));
  EXPECT_EQ(got[1].header("Content-Type"), "application/octet-stream");
  EXPECT_EQ(got[1].body, std::string("\x01\x02\x00\x03", 4));
}

TEST(HttpPublisher, HmacMatchesRfc4231) {
  // RFC 4231 test case 2.
  EXPECT_EQ(hmac_sha256_hex("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
}

TEST(HttpPublisher, BatchModePostsJsonArraysOfAtMostMaxBatch) {
  testing::HttpTestServer server;
  HttpPublisher publisher({.mode = HttpPublisher::Mode::Batch, .max_batch = 100});
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 250; ++i) {
    events.push_back(event(i));
  }
  auto bad = EventEnvelope::of_json(EventType::of("Bad"), "{not json");
  std::vector<PublishRequest> batch;
  for (auto& e : events) {
    batch.push_back({&e, server.url("/api/events/batch")});
  }
  batch.insert(batch.begin() + 10, {&bad, server.url("/api/events/batch")});
  auto results = publisher.publish(batch);
  ASSERT_EQ(results.size(), 251u);
  EXPECT_EQ(results[10].kind, Kind::Permanent);
  EXPECT_NE(results[10].reason.find("not valid JSON"), std::string::npos) << results[10].reason;
  for (std::size_t i = 0; i < results.size(); ++i) {
    if (i != 10) {
      EXPECT_TRUE(results[i].is_ok()) << i << results[i].reason;
    }
  }
  auto got = server.received();
  ASSERT_EQ(got.size(), 3u);
  std::vector<std::string> ids;
  for (const auto& r : got) {
    auto array = nlohmann::json::parse(r.body);
    ASSERT_TRUE(array.is_array());
    EXPECT_LE(array.size(), 100u);
    for (const auto& item : array) {
      ids.push_back(item.at("event_id"));
      EXPECT_EQ(item.at("event_type"), "OrderPlaced");
      EXPECT_EQ(item.at("payload").at("n").get<int>(),
                std::stoi(item.at("aggregate_id").get<std::string>().substr(2)));
      EXPECT_EQ(item.at("headers").at("traceparent").get<std::string>().substr(0, 7), "00-abc-");
    }
  }
  ASSERT_EQ(ids.size(), 250u);
  for (int i = 0; i < 250; ++i) {
    EXPECT_EQ(ids[i], events[i].event_id());  // order kept within a target
  }
}

TEST(HttpPublisher, ClassifiesStatusesTimeoutsAndConnectionErrors) {
  testing::HttpTestServer server;
  std::mutex gate_mutex;
  std::condition_variable gate;
  bool release = false;
  server.respond([&](const testing::ReceivedRequest& r, httplib::Response& res) {
    if (r.path == "/slow") {
      std::unique_lock lock(gate_mutex);  // held until the test releases it, past the timeout
      gate.wait(lock, [&] { return release; });
      return;
    }
    res.status = std::stoi(r.path.substr(1));
    res.set_content(res.status == 400 ? "amount must be positive" : "x", "text/plain");
  });
  // A short timeout only where the test wants one: sanitizer builds answer slowly.
  HttpPublisher publisher({});
  HttpPublisher impatient({.request_timeout = std::chrono::milliseconds(300)});
  auto e = event(1);
  auto kind_of = [&](const std::string& url) {
    return publisher.publish(std::vector<PublishRequest>{{&e, url}}).at(0);
  };
  EXPECT_EQ(kind_of(server.url("/200")).kind, Kind::Ok);
  EXPECT_EQ(kind_of(server.url("/204")).kind, Kind::Ok);
  for (const char* retriable : {"/408", "/429", "/500", "/503"}) {
    auto got = kind_of(server.url(retriable));
    EXPECT_EQ(got.kind, Kind::Retriable) << retriable << " " << got.reason;
  }
  auto bad_request = kind_of(server.url("/400"));
  EXPECT_EQ(bad_request.kind, Kind::Permanent);
  EXPECT_EQ(bad_request.reason, "HTTP 400: amount must be positive");
  EXPECT_EQ(kind_of(server.url("/404")).kind, Kind::Permanent);
  auto slow = impatient.publish(std::vector<PublishRequest>{{&e, server.url("/slow")}}).at(0);
  EXPECT_EQ(slow.kind, Kind::Retriable);
  EXPECT_NE(slow.reason.find("imeout"), std::string::npos) << slow.reason;
  {
    std::lock_guard lock(gate_mutex);
    release = true;
  }
  gate.notify_all();
  EXPECT_EQ(kind_of("http://127.0.0.1:1/").kind, Kind::Retriable);
  EXPECT_EQ(kind_of("nope://x").kind, Kind::Permanent);

  auto bad_header =
      EventEnvelope::builder(EventType::of("H")).header("bad name", "v").payload_json("{}").build();
  auto r = publisher.publish(std::vector<PublishRequest>{{&bad_header, server.url("/200")}}).at(0);
  EXPECT_EQ(r.kind, Kind::Permanent);
  EXPECT_NE(r.reason.find("bad name"), std::string::npos);
}

TEST(HttpPublisher, RetryAfterIsReportedInSecondsOrAsAnHttpDate) {
  testing::HttpTestServer server;
  server.respond([](const testing::ReceivedRequest& r, httplib::Response& res) {
    res.status = r.path == "/date" ? 503 : 429;
    if (r.path == "/seconds") {
      res.set_header("Retry-After", "7");
    } else if (r.path == "/date") {
      char date[64];
      const std::time_t at = std::time(nullptr) + 120;
      std::tm tm{};
      gmtime_r(&at, &tm);
      std::strftime(date, sizeof date, "%a, %d %b %Y %H:%M:%S GMT", &tm);
      res.set_header("Retry-After", date);
    } else if (r.path == "/huge") {
      res.set_header("Retry-After", "99999999999");
    } else if (r.path == "/garbage") {
      res.set_header("Retry-After", "soon");
    }
  });
  HttpPublisher publisher({});
  auto e = event(1);
  auto result = [&](const char* path) {
    return publisher.publish(std::vector<PublishRequest>{{&e, server.url(path)}}).at(0);
  };
  EXPECT_EQ(result("/seconds").retry_after, std::chrono::seconds(7));
  auto dated = result("/date");
  ASSERT_TRUE(dated.retry_after.has_value());
  EXPECT_GE(*dated.retry_after, std::chrono::seconds(100));
  EXPECT_LE(*dated.retry_after, std::chrono::seconds(120));
  EXPECT_EQ(result("/huge").retry_after, std::chrono::hours(1));
  EXPECT_EQ(result("/garbage").retry_after, std::nullopt);
  EXPECT_EQ(result("/none").retry_after, std::nullopt);
  EXPECT_EQ(result("/none").kind, Kind::Retriable);
}

TEST(HttpPublisher, RejectsBadOptions) {
  EXPECT_THROW(HttpPublisher({.max_batch = 0}), std::invalid_argument);
  EXPECT_THROW(HttpPublisher({.request_timeout = std::chrono::milliseconds(0)}),
               std::invalid_argument);
  EXPECT_THROW(HttpPublisher({.headers = {{"X-A", "a\r\nInjected: 1"}}}), std::invalid_argument);
}

}  // namespace
}  // namespace outbox::http
