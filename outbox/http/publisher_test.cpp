#include "outbox/http/publisher.hpp"
#include "outbox/http/internal/response.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <future>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string_view>
#include <thread>

#include "tests/support/http_server.hpp"
#include "tests/support/test_support.hpp"

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

// An HTTP/1.1 server on raw sockets that records every byte it receives: cpp-httplib parses
// requests, and so would hide a second request smuggled inside the first one's body. Connections
// are served one at a time: after the head and Content-Length bytes of body, `answer` (default
// "200 ok" with Connection: close), then whatever else arrives is still recorded until the client
// closes.
class RawHttpServer {
 public:
  explicit RawHttpServer(
      std::string answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
      : answer_(std::move(answer)) {
    listen_fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof addr;
    if (listen_fd_ < 0 || ::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), length) != 0 ||
        ::listen(listen_fd_, 16) != 0 ||
        ::getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &length) != 0 ||
        ::pipe(wake_) != 0) {
      throw std::runtime_error("RawHttpServer: cannot listen");
    }
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] { run(); });
  }
  ~RawHttpServer() {
    const char stop = 0;
    if (::write(wake_[1], &stop, 1) != 1) {
      std::abort();  // the thread would never stop
    }
    thread_.join();
    ::close(listen_fd_);
    ::close(wake_[0]);
    ::close(wake_[1]);
  }
  RawHttpServer(const RawHttpServer&) = delete;
  RawHttpServer& operator=(const RawHttpServer&) = delete;

  std::string url(const std::string& path) const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  /// Connections accepted and bytes read so far, finished connections or not.
  std::size_t accepted() const {
    std::lock_guard lock(mutex_);
    return accepted_;
  }
  std::size_t bytes_received() const {
    std::lock_guard lock(mutex_);
    return bytes_received_;
  }
  /// Waits up to `timeout` for `n` connections to finish; returns the raw bytes of each so far.
  std::vector<std::string> wait_for_connections(std::size_t n, std::chrono::milliseconds timeout) {
    std::unique_lock lock(mutex_);
    finished_changed_.wait_for(lock, timeout, [&] { return finished_.size() >= n; });
    return finished_;
  }

 private:
  void run() {
    for (;;) {
      pollfd fds[2] = {{listen_fd_, POLLIN, 0}, {wake_[0], POLLIN, 0}};
      if (::poll(fds, 2, -1) < 0) {
        if (errno == EINTR) {
          continue;
        }
        return;
      }
      if (fds[1].revents != 0) {
        return;
      }
      const int fd = ::accept(listen_fd_, nullptr, nullptr);
      if (fd < 0) {
        continue;
      }
      {
        std::lock_guard lock(mutex_);
        ++accepted_;
      }
      std::string bytes = serve(fd);
      ::close(fd);
      {
        std::lock_guard lock(mutex_);
        finished_.push_back(std::move(bytes));
      }
      finished_changed_.notify_all();
    }
  }

  // Appends what `fd` has next; false on end of stream, error, deadline or stop.
  bool read_more(int fd, std::string& bytes, std::chrono::steady_clock::time_point deadline) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    pollfd fds[2] = {{fd, POLLIN, 0}, {wake_[0], POLLIN, 0}};
    if (left.count() <= 0 || ::poll(fds, 2, static_cast<int>(left.count())) <= 0 ||
        fds[1].revents != 0) {
      return false;
    }
    char buffer[4096];
    const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
    if (n <= 0) {
      return false;
    }
    bytes.append(buffer, static_cast<std::size_t>(n));
    std::lock_guard lock(mutex_);
    bytes_received_ += static_cast<std::size_t>(n);
    return true;
  }

  // Where the first request in `bytes` ends (head + Content-Length), or npos while incomplete.
  static std::size_t request_end(const std::string& bytes) {
    const auto head_end = bytes.find("\r\n\r\n");
    if (head_end == std::string::npos) {
      return std::string::npos;
    }
    std::string head = bytes.substr(0, head_end + 2);
    std::transform(head.begin(), head.end(), head.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    std::size_t length = 0;
    const auto field = head.find("\r\ncontent-length:");
    if (field != std::string::npos) {
      length = std::strtoul(head.c_str() + field + 17, nullptr, 10);
    }
    const std::size_t end = head_end + 4 + length;
    return bytes.size() >= end ? end : std::string::npos;
  }

  std::string serve(int fd) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    std::string bytes;
    while (request_end(bytes) == std::string::npos && read_more(fd, bytes, deadline)) {
    }
    if (request_end(bytes) != std::string::npos) {
      if (::send(fd, answer_.data(), answer_.size(), MSG_NOSIGNAL) < 0) {
        return bytes;
      }
      ::shutdown(fd, SHUT_WR);
      while (read_more(fd, bytes, deadline)) {  // until the client closes: keep the leftovers
      }
    }
    return bytes;
  }

  std::string answer_;
  int listen_fd_ = -1;
  int wake_[2] = {-1, -1};  // written once to stop the thread
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;  // guards accepted_, bytes_received_ and finished_
  std::condition_variable finished_changed_;
  std::size_t accepted_ = 0;
  std::size_t bytes_received_ = 0;
  std::vector<std::string> finished_;
};

// Well-formed UTF-8 (Unicode Table 3-7) without C0 controls or DEL: what every store accepts as
// text and a log line can show.
bool is_clean_utf8(std::string_view text) {
  std::size_t i = 0;
  while (i < text.size()) {
    const auto b = static_cast<unsigned char>(text[i]);
    if (b < 0x80) {
      if (b < 0x20 || b == 0x7f) {
        return false;
      }
      ++i;
      continue;
    }
    std::size_t length = 0;
    unsigned char low = 0x80, high = 0xbf;
    if (b >= 0xc2 && b <= 0xdf) {
      length = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
      length = 3;
      low = b == 0xe0 ? 0xa0 : 0x80;
      high = b == 0xed ? 0x9f : 0xbf;
    } else if (b >= 0xf0 && b <= 0xf4) {
      length = 4;
      low = b == 0xf0 ? 0x90 : 0x80;
      high = b == 0xf4 ? 0x8f : 0xbf;
    } else {
      return false;
    }
    if (i + length > text.size()) {
      return false;
    }
    for (std::size_t k = 1; k < length; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if (c < (k == 1 ? low : 0x80) || c > (k == 1 ? high : 0xbf)) {
        return false;
      }
    }
    i += length;
  }
  return true;
}

std::size_t count_of(const std::string& text, const std::string& needle) {
  std::size_t n = 0;
  for (auto at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) {
    ++n;
  }
  return n;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return text;
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

// A receiver that closes each connection after two requests: the publisher's threads reconnect
// and every event arrives, once.
TEST(HttpPublisher, ReceiverClosingConnectionsOftenGetsEveryEventOnce) {
  testing::HttpTestServer server(true, 2);
  HttpPublisher publisher({});
  constexpr int kThreads = 8;
  constexpr int kCalls = 10;
  constexpr int kPerCall = 5;
  std::vector<std::thread> threads;
  std::atomic<int> not_ok{0};
  std::mutex ids_mutex;
  std::vector<std::string> sent;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int c = 0; c < kCalls; ++c) {
        std::vector<EventEnvelope> events;
        for (int i = 0; i < kPerCall; ++i) {
          events.push_back(event((t * kCalls + c) * kPerCall + i));
        }
        std::vector<PublishRequest> batch;
        for (auto& e : events) {
          batch.push_back({&e, server.url("/hooks")});
        }
        for (const auto& r : publisher.publish(batch)) {
          not_ok += r.is_ok() ? 0 : 1;
        }
        std::lock_guard lock(ids_mutex);
        for (const auto& e : events) {
          sent.push_back(e.event_id());
        }
      }
    });
  }
  for (auto& t : threads) {
    t.join();
  }
  EXPECT_EQ(not_ok.load(), 0);
  std::vector<std::string> received;
  std::set<int> connections;
  for (const auto& r : server.received()) {
    received.push_back(r.header("X-Outbox-Event-Id"));
    connections.insert(r.remote_port);
  }
  EXPECT_GE(connections.size(), received.size() / 2);
  std::sort(sent.begin(), sent.end());
  std::sort(received.begin(), received.end());
  EXPECT_EQ(received.size(), static_cast<std::size_t>(kThreads * kCalls * kPerCall));
  EXPECT_EQ(received, sent);
}

// The test receiver's listen queue: 64 clients connecting at once, before anything is accepted,
// all get their connection from the kernel (with httplib's queue of 5, the SYNs beyond it were
// dropped and retried after 1 s).
TEST(HttpTestReceiver, QueuesManyConnectionsAtOnce) {
  httplib::Server server;
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  testing::accept_like_a_receiver(server, port);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<std::uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  constexpr int kClients = 64;
  std::vector<pollfd> fds;
  for (int i = 0; i < kClients; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    ASSERT_GE(fd, 0);
    const int rc = ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr);
    ASSERT_TRUE(rc == 0 || errno == EINPROGRESS) << std::strerror(errno);
    fds.push_back({fd, POLLOUT, 0});
  }
  // Loopback answers a queued SYN at once; a dropped one waits for its retransmit (1 s).
  int connected = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(500);
  std::vector<bool> done(kClients, false);
  while (connected < kClients && std::chrono::steady_clock::now() < deadline) {
    ::poll(fds.data(), fds.size(), 50);
    for (int i = 0; i < kClients; ++i) {
      if (!done[i] && (fds[i].revents & POLLOUT) != 0) {
        int error = 0;
        socklen_t len = sizeof error;
        ::getsockopt(fds[i].fd, SOL_SOCKET, SO_ERROR, &error, &len);
        EXPECT_EQ(error, 0) << std::strerror(error);
        done[i] = true;
        fds[i].events = 0;
        ++connected;
      }
    }
  }
  EXPECT_EQ(connected, kClients);
  for (const auto& p : fds) {
    ::close(p.fd);
  }
  EXPECT_THROW(testing::accept_like_a_receiver(server, port == 65535 ? 1 : port + 1),
               std::runtime_error);
}

// Batch mode with message groups: requests go in queue order (one per run of a target), and a
// group's events after one that failed (its request refused, its payload invalid) are not sent;
// other events still go.
TEST(HttpPublisher, BatchModeSendsNothingOfAGroupAfterItsFailure) {
  testing::HttpTestServer server;
  server.respond([](const testing::ReceivedRequest& r, httplib::Response& res) {
    if (r.body.find("\"n\":2") != std::string::npos) {
      res.status = 500;  // the request holding g/2
    }
  });
  HttpPublisher publisher({.mode = HttpPublisher::Mode::Batch, .max_batch = 2});
  std::vector<EventEnvelope> events;
  for (int n = 0; n < 6; ++n) {
    events.push_back(EventEnvelope::builder(EventType::of(n % 2 ? "Apaid" : "Zcreated"))
                         .message_group("g")
                         .payload_json("{\"n\":" + std::to_string(n) + "}")
                         .build());
  }
  events.push_back(EventEnvelope::builder(EventType::of("Other"))
                       .message_group("h")
                       .payload_json("{\"n\":9}")
                       .build());
  std::vector<PublishRequest> batch;
  for (auto& e : events) {
    batch.push_back({&e, server.url("/events")});
  }
  auto results = publisher.publish(batch);
  ASSERT_EQ(results.size(), 7u);
  EXPECT_TRUE(results[0].is_ok());
  EXPECT_TRUE(results[1].is_ok());
  EXPECT_EQ(results[2].kind, Kind::Retriable);  // its request was refused
  EXPECT_EQ(results[3].kind, Kind::Retriable);
  for (int n = 4; n < 6; ++n) {
    EXPECT_EQ(results[n].kind, Kind::Retriable);
    EXPECT_NE(results[n].reason.find("not sent"), std::string::npos) << results[n].reason;
  }
  EXPECT_TRUE(results[6].is_ok()) << results[6].reason;  // another group still goes
  const auto got = server.received();
  ASSERT_EQ(got.size(), 3u);
  EXPECT_NE(got[2].body.find("\"n\":9"), std::string::npos);

  // Per-event targets ({event_type}): requests in queue order, not in the order of the URLs.
  server.respond([](const testing::ReceivedRequest&, httplib::Response&) {});
  std::vector<PublishRequest> typed;
  for (int n = 0; n < 2; ++n) {
    typed.push_back({&events[n], server.url("/events/" + std::string(events[n].event_type()))});
  }
  for (const auto& r : publisher.publish(typed)) {
    EXPECT_TRUE(r.is_ok()) << r.reason;
  }
  const auto in_order = server.received();
  ASSERT_EQ(in_order.size(), 5u);
  EXPECT_EQ(in_order[3].path, "/events/Zcreated");
  EXPECT_EQ(in_order[4].path, "/events/Apaid");

  // An invalid payload stops its group too: the events behind it are not sent.
  auto bad = EventEnvelope::builder(EventType::of("Bad"))
                 .message_group("b")
                 .payload_json("{not json")
                 .build();
  auto behind =
      EventEnvelope::builder(EventType::of("Bad")).message_group("b").payload_json("{}").build();
  auto other =
      EventEnvelope::builder(EventType::of("Other")).message_group("c").payload_json("{}").build();
  std::vector<PublishRequest> with_bad{
      {&bad, server.url("/b")}, {&behind, server.url("/b")}, {&other, server.url("/b")}};
  const auto after_bad = publisher.publish(with_bad);
  EXPECT_EQ(after_bad[0].kind, Kind::Permanent);
  EXPECT_EQ(after_bad[1].kind, Kind::Retriable);
  EXPECT_NE(after_bad[1].reason.find("not sent"), std::string::npos);
  EXPECT_TRUE(after_bad[2].is_ok());
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
  for (const char* retriable : {"/408", "/429", "/500", "/503", "/600", "/999"}) {
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

TEST(HttpPublisher, RetryAfterHeaderLinesAreTrimmedAtBothEnds) {
  namespace h = outbox::http::internal;
  EXPECT_EQ(h::retry_after_header("Retry-After: 7\r\n"), "7");
  EXPECT_EQ(h::retry_after_header("retry-after:\t 7 \t\r\n"), "7");
  // Only blanks after the colon: an empty value, not the line's CR LF (found by a helper).
  EXPECT_EQ(h::retry_after_header("Retry-After: \r\n"), "");
  EXPECT_EQ(h::retry_after_header("Retry-After:\t\r\n\t"), "");
  EXPECT_EQ(h::retry_after_header("Retry-After:\r 5"), "5");
  EXPECT_EQ(h::retry_after_header("X-Retry-After: 7\r\n"), std::nullopt);
  EXPECT_EQ(h::retry_after_header("Retry-Afterx: 7\r\n"), std::nullopt);
}

// An interim response's Retry-After is not the final response's (curl hands every response's
// header lines to the callback): a 503 without one after a 103 with one is plain backoff.
TEST(HttpPublisher, RetryAfterOfAnInterimResponseDoesNotCarryOver) {
  RawHttpServer server(
      "HTTP/1.1 103 Early Hints\r\nRetry-After: 3000\r\n\r\n"
      "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 1\r\nConnection: close\r\n\r\nx");
  HttpPublisher publisher({});
  auto e = event(1);
  const auto result = publisher.publish(std::vector<PublishRequest>{{&e, server.url("/")}}).at(0);
  EXPECT_EQ(result.kind, Kind::Retriable) << result.reason;
  EXPECT_EQ(result.reason, "HTTP 503: x");
  EXPECT_EQ(result.retry_after, std::nullopt);
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
    } else if (r.path == "/far") {
      res.set_header("Retry-After", "Thu, 01 Jan 2147483647 00:00:00 GMT");
    } else if (r.path == "/garbage") {
      res.set_header("Retry-After", "soon");
    } else if (r.path == "/zero") {
      res.set_header("Retry-After", "0");
    } else if (r.path == "/zeros") {
      res.set_header("Retry-After", "0000000000");
    } else if (r.path == "/padded") {
      res.set_header("Retry-After", "00000000007");
    } else if (r.path == "/past") {
      res.set_header("Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT");
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
  // A date whose distance overflowed when converted to milliseconds (fuzzer finding).
  EXPECT_EQ(result("/far").retry_after, std::chrono::hours(1));
  EXPECT_EQ(result("/garbage").retry_after, std::nullopt);
  // Zero or past is no hint (it once meant an immediate retry, forever, never counted).
  EXPECT_EQ(result("/zero").retry_after, std::nullopt);
  EXPECT_EQ(result("/zeros").retry_after, std::nullopt);  // once: an hour, uncounted
  EXPECT_EQ(result("/padded").retry_after, std::chrono::seconds(7));
  EXPECT_EQ(result("/past").retry_after, std::nullopt);
  EXPECT_EQ(result("/none").retry_after, std::nullopt);
  EXPECT_EQ(result("/none").kind, Kind::Retriable);
}

// Issue 9 item 11: an envelope header `Content-Length: 0` used to replace libcurl's own, so the
// receiver read the body as a second request. Names the request already carries are refused and
// nothing reaches the wire; other envelope headers still do.
TEST(HttpPublisher, EnvelopeHeadersCannotReframeOrForgeTheRequest) {
  RawHttpServer server;
  HttpPublisher publisher({.request_timeout = std::chrono::seconds(5),
                           .hmac_secret = "k",
                           .signature_header = "X-Sig",
                           .headers = {{"X-Env", "test"}}});
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"Content-Length", "0"},
      {"content-length", "0"},
      {"Transfer-Encoding", "chunked"},
      {"transfer-encoding", "chunked"},
      {"Host", "evil"},
      {"host", "evil"},
      {"X-Outbox-Event-Id", "forged"},
      {"x-outbox-event-id", "forged"},
      {"X-OUTBOX-Replayed", "forged"},
      {"Content-Type", "text/plain"},
      {"Content-Encoding", "gzip"},
      {"content-range", "bytes 0-1/2"},
      {"TE", "trailers"},
      {"Trailer", "X-Forged"},
      {"Connection", "close"},
      {"Keep-Alive", "timeout=5"},
      {"Upgrade", "h2c"},
      {"Proxy-Authorization", "Basic Zm9yZ2Vk"},
      {"Expect", "100-continue"},
      {"authorization", "Bearer forged"},
      {"User-Agent", "forged-agent/1.0"},
      {"accept", "text/forged"},
      {"x-sig", "sha256=forged"},  // the configured signature header
      {"x-env", "forged"},         // a configured static header
  };
  std::vector<EventEnvelope> events;
  for (const auto& [name, value] : refused) {
    events.push_back(EventEnvelope::builder(EventType::of("OrderPlaced"))
                         .header("X-Trace", "1")
                         .header(name, value)
                         .payload_json("{\"n\":1}")
                         .build());
  }
  std::vector<PublishRequest> batch;
  for (const auto& e : events) {
    batch.push_back({&e, server.url("/hook")});
  }
  auto results = publisher.publish(batch);
  ASSERT_EQ(results.size(), refused.size());
  for (std::size_t i = 0; i < results.size(); ++i) {
    EXPECT_EQ(results[i].kind, Kind::Permanent) << refused[i].first << ": " << results[i].reason;
    EXPECT_NE(results[i].reason.find("'" + refused[i].first + "'"), std::string::npos)
        << results[i].reason;
  }
  // publish() waits for the answer, and the server reads a request before answering: anything
  // sent would already be counted.
  EXPECT_EQ(server.accepted(), 0u);
  EXPECT_EQ(server.bytes_received(), 0u);

  auto ordinary = EventEnvelope::builder(EventType::of("OrderPlaced"))
                      .header("X-Trace", "1")
                      .header("traceparent", "00-abc-1")
                      .payload_json("{\"n\":2}")
                      .build();
  auto ok = publisher.publish(std::vector<PublishRequest>{{&ordinary, server.url("/hook")}});
  ASSERT_EQ(ok.size(), 1u);
  EXPECT_TRUE(ok[0].is_ok()) << ok[0].reason;
  const auto connections = server.wait_for_connections(1, std::chrono::seconds(5));
  ASSERT_EQ(connections.size(), 1u);
  EXPECT_EQ(server.accepted(), 1u);
  const std::string& raw = connections[0];
  ASSERT_GE(raw.size(), 7u);
  EXPECT_EQ(raw.rfind("POST /hook HTTP/1.1\r\n", 0), 0u) << raw;
  EXPECT_NE(raw.find("\r\nX-Trace: 1\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\ntraceparent: 00-abc-1\r\n"), std::string::npos) << raw;
  EXPECT_NE(raw.find("\r\nX-Outbox-Event-Id: " + ordinary.event_id() + "\r\n"), std::string::npos)
      << raw;
  EXPECT_EQ(count_of(raw, "POST "), 1u) << raw;
  EXPECT_EQ(count_of(lower(raw), "\r\ncontent-length:"), 1u) << raw;
  EXPECT_EQ(count_of(lower(raw), "\r\nhost:"), 1u) << raw;
  EXPECT_EQ(raw.find("forged"), std::string::npos) << raw;
  EXPECT_EQ(raw.find("evil"), std::string::npos) << raw;
  EXPECT_EQ(raw.substr(raw.size() - 7), "{\"n\":2}") << raw;  // the body ends the stream
}

// Batch mode carries envelope headers as JSON members, where no name can reframe the request.
TEST(HttpPublisher, BatchModeCarriesAnyEnvelopeHeaderNameInTheBody) {
  testing::HttpTestServer server;
  HttpPublisher publisher({.mode = HttpPublisher::Mode::Batch});
  auto e = EventEnvelope::builder(EventType::of("OrderPlaced"))
               .header("Content-Length", "0")
               .payload_json("{}")
               .build();
  auto results = publisher.publish(std::vector<PublishRequest>{{&e, server.url("/batch")}});
  ASSERT_EQ(results.size(), 1u);
  EXPECT_TRUE(results[0].is_ok()) << results[0].reason;
  auto got = server.received();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(nlohmann::json::parse(got[0].body).at(0).at("headers").at("Content-Length"), "0");
}

// Issue 9 item 5: the reason keeps 200 bytes of the body, which could end inside a character or
// hold invalid UTF-8 and NUL bytes; PostgreSQL then refused to store the error.
TEST(HttpPublisher, ReasonFromTheResponseBodyIsCleanUtf8) {
  testing::HttpTestServer server;
  std::string cut = std::string("bad\xff", 4) + std::string(1, '\0') +
                    "nul\ttab\r\nline \xC0\xAF overlong \xED\xA0\x80 surrogate ";
  cut.resize(199, 'a');
  cut += "\xE2\x82\xAC tail";  // bytes 199-201: the 200-byte limit splits the euro sign
  server.respond([&](const testing::ReceivedRequest& r, httplib::Response& res) {
    res.status = 400;
    res.set_content(r.path == "/cut"     ? cut
                    : r.path == "/short" ? std::string("ok\xE2\x82")
                                         : std::string("\xE2\x82\xAC"),
                    "text/plain");
  });
  HttpPublisher publisher({});
  auto e = event(1);
  auto reason_of = [&](const char* path) {
    auto r = publisher.publish(std::vector<PublishRequest>{{&e, server.url(path)}}).at(0);
    EXPECT_EQ(r.kind, Kind::Permanent) << path;
    EXPECT_TRUE(is_clean_utf8(r.reason)) << path << ": " << r.reason;
    return r.reason;
  };
  const std::string reason = reason_of("/cut");
  EXPECT_EQ(reason.rfind("HTTP 400: bad\xEF\xBF\xBD?nul tab  line \xEF\xBF\xBD", 0), 0u) << reason;
  EXPECT_NE(reason.find("surrogate aaaa"), std::string::npos) << reason;
  EXPECT_EQ(reason.back(), 'a') << reason;  // the split character is dropped, not garbled
  // A body that itself ends inside a character was not cut: that is reported as invalid.
  EXPECT_EQ(reason_of("/short"), "HTTP 400: ok\xEF\xBF\xBD");
  EXPECT_EQ(reason_of("/whole"), "HTTP 400: \xE2\x82\xAC");
}

TEST(HttpPublisher, RefusesConfiguredHeadersTheRequestAlreadyCarries) {
  const std::vector<std::pair<std::string, std::string>> taken = {
      {"Content-Length", "0"},    {"transfer-encoding", "chunked"},
      {"Host", "elsewhere"},      {"Content-Type", "text/plain"},
      {"Connection", "close"},    {"Proxy-Authorization", "Basic x"},
      {"X-Outbox-Event-Id", "x"}, {"x-outbox-source", "orders"},
      {"x-outbox-signature", "x"}};
  for (const auto& [name, value] : taken) {
    EXPECT_THROW(HttpPublisher({.headers = {{name, value}}}), std::invalid_argument) << name;
  }
  EXPECT_THROW(HttpPublisher({.signature_header = "X-Sig", .headers = {{"x-sig", "v"}}}),
               std::invalid_argument);
  EXPECT_THROW(HttpPublisher({.bearer_token = "t", .headers = {{"Authorization", "Basic x"}}}),
               std::invalid_argument);
  for (const char* name : {"Content-Length", "host", "Authorization", "X-Outbox-Event-Id"}) {
    EXPECT_THROW(HttpPublisher({.signature_header = name}), std::invalid_argument) << name;
  }
  // Another authorization scheme is configured as a header; any other name is the user's.
  EXPECT_NO_THROW(
      HttpPublisher({.headers = {{"Authorization", "Basic dTpw"}, {"X-Source", "orders"}}}));
  EXPECT_NO_THROW(HttpPublisher({.signature_header = "X-Hub-Signature-256"}));
}

TEST(HttpPublisher, RejectsBadOptions) {
  EXPECT_THROW(HttpPublisher({.max_batch = 0}), std::invalid_argument);
  EXPECT_THROW(HttpPublisher({.request_timeout = std::chrono::milliseconds(0)}),
               std::invalid_argument);
  EXPECT_THROW(HttpPublisher({.headers = {{"X-A", "a\r\nInjected: 1"}}}), std::invalid_argument);
}

TEST(HttpPublisher, CancelEndsATransferThatWouldTakeAnHour) {
  testing::HttpTestServer server;
  server.stall();
  HttpPublisher publisher({.request_timeout = std::chrono::hours(1)});
  auto e = event(1);
  std::promise<PublishResult> done;
  auto result = done.get_future();
  std::thread posting([&] {
    done.set_value(publisher.publish(std::vector<PublishRequest>{{&e, server.url("/slow")}}).at(0));
  });
  ASSERT_TRUE(testing::wait_until([&] { return server.count() == 1; }));
  publisher.cancel();
  ASSERT_EQ(result.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  posting.join();
  const auto r = result.get();
  EXPECT_EQ(r.kind, Kind::Retriable);
  EXPECT_NE(r.reason.find("cancelled"), std::string::npos) << r.reason;
  EXPECT_EQ(publisher.publish(std::vector<PublishRequest>{{&e, server.url("/x")}}).at(0).reason,
            r.reason);
  EXPECT_EQ(server.count(), 1u);  // nothing sent after cancel()
}

}  // namespace
}  // namespace outbox::http
