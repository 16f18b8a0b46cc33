#include "outbox/relay/internal/http_server.hpp"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <thread>

#include "outbox/relay/admin_server.hpp"
#include "outbox/store.hpp"
#include "tests/support/test_support.hpp"

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;
using internal::HttpLimits;
using internal::HttpRequest;
using internal::HttpResponse;
using internal::HttpServer;

// A raw client socket: hostile clients are easier to write without an HTTP library.
class Client {
 public:
  explicit Client(int port) {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    connected_ = connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  }
  ~Client() { close(fd_); }
  bool connected() const { return connected_; }
  bool send_all(std::string_view data) {
    while (!data.empty()) {
      const ssize_t n = ::send(fd_, data.data(), data.size(), MSG_NOSIGNAL);
      if (n <= 0) {
        return false;
      }
      data.remove_prefix(static_cast<std::size_t>(n));
    }
    return true;
  }
  // Everything until the server closes, or what arrived before `timeout`.
  std::string read_all(std::chrono::milliseconds timeout = 10s) {
    std::string out;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{fd_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        return out;
      }
      char buffer[4096];
      const ssize_t n = recv(fd_, buffer, sizeof buffer, 0);
      if (n <= 0) {
        closed_ = true;
        return out;
      }
      out.append(buffer, static_cast<std::size_t>(n));
    }
  }
  bool closed_by_server() const { return closed_; }
  // True once the server has sent something (nothing is read).
  bool answered() const {
    pollfd p{fd_, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }

 private:
  int fd_ = -1;
  bool connected_ = false;
  bool closed_ = false;
};

bool valid_utf8_for_test(const std::string& s) {
  return outbox::sanitize_utf8(s) == s;
}

std::string status_line(const std::string& response) {
  return response.substr(0, response.find("\r\n"));
}

std::string body_of(const std::string& response) {
  const auto end = response.find("\r\n\r\n");
  return end == std::string::npos ? std::string() : response.substr(end + 4);
}

struct Recorder {
  std::atomic<int> handled{0};
  std::atomic<std::size_t> largest_body{0};
};

std::unique_ptr<HttpServer> echo_server(Recorder& r, HttpLimits limits = {}) {
  return std::make_unique<HttpServer>(
      "127.0.0.1", 0, limits,
      [](const HttpRequest& head) -> std::optional<HttpResponse> {
        if (head.header("Authorization") != "Bearer t") {
          return HttpResponse{401, "text/plain", "no\n", {}};
        }
        return std::nullopt;
      },
      [&r](const HttpRequest& req) {
        ++r.handled;
        r.largest_body = std::max(r.largest_body.load(), req.body.size());
        return HttpResponse{200, "text/plain", req.method + " " + req.path + " " + req.body, {}};
      });
}

TEST(AdminHttpServer, AnswersAndClosesEveryRequest) {
  Recorder r;
  auto server = echo_server(r);
  server->start();
  Client c(server->port());
  ASSERT_TRUE(c.connected());
  c.send_all("POST /x?y=1 HTTP/1.1\r\nAuthorization: Bearer t\r\nContent-Length: 3\r\n\r\nabc");
  const auto response = c.read_all();
  EXPECT_EQ(status_line(response), "HTTP/1.1 200 OK");
  EXPECT_EQ(body_of(response), "POST /x abc");
  EXPECT_NE(response.find("Connection: close"), std::string::npos);
  EXPECT_TRUE(c.closed_by_server());
}

TEST(AdminHttpServer, AHugeBodyIsRefusedBeforeItIsReadWithOrWithoutAuth) {
  Recorder r;
  auto server = echo_server(r);
  server->start();
  // Unauthorised: refused on the head alone (the 400 MB body once went into memory first).
  Client anonymous(server->port());
  anonymous.send_all("POST /x HTTP/1.1\r\nContent-Length: 400000000\r\n\r\n");
  EXPECT_EQ(status_line(anonymous.read_all()), "HTTP/1.1 401 Unauthorized");
  // Authorised but over the body limit: 413 without reading it.
  Client big(server->port());
  big.send_all("POST /x HTTP/1.1\r\nAuthorization: Bearer t\r\nContent-Length: 400000000\r\n\r\n");
  EXPECT_EQ(status_line(big.read_all()), "HTTP/1.1 413 Content Too Large");
  Client chunked(server->port());
  chunked.send_all(
      "POST /x HTTP/1.1\r\nAuthorization: Bearer t\r\nTransfer-Encoding: chunked\r\n\r\n");
  EXPECT_EQ(status_line(chunked.read_all()), "HTTP/1.1 501 Not Implemented");
  EXPECT_EQ(r.handled.load(), 0);
}

TEST(AdminHttpServer, TooManyOrTooLargeHeadersAreRefused) {
  Recorder r;
  auto server = echo_server(r);
  server->start();
  Client many(server->port());
  std::string head = "GET /x HTTP/1.1\r\n";
  for (int i = 0; i < 100; ++i) {
    head += "X-" + std::to_string(i) + ": v\r\n";
  }
  many.send_all(head + "\r\n");
  EXPECT_EQ(status_line(many.read_all()), "HTTP/1.1 431 Request Header Fields Too Large");
  // 20,000 headers of 8 KB once took 251 MB: the head is cut at 16 KiB.
  Client endless(server->port());
  endless.send_all("GET /x HTTP/1.1\r\n");
  const std::string line = "X-Big: " + std::string(8000, 'a') + "\r\n";
  for (int i = 0; i < 20 && endless.send_all(line); ++i) {
  }
  EXPECT_EQ(status_line(endless.read_all()), "HTTP/1.1 431 Request Header Fields Too Large");
  EXPECT_EQ(r.handled.load(), 0);
}

TEST(AdminHttpServer, SlowClientsAreDroppedAtTheDeadlineAndNeverBlockOthers) {
  Recorder r;
  HttpLimits limits;
  limits.request_deadline = 1500ms;
  auto server = echo_server(r, limits);
  server->start();
  // More slow clients than worker threads, each sending a byte now and then.
  std::vector<std::unique_ptr<Client>> slow;
  for (int i = 0; i < 32; ++i) {
    slow.push_back(std::make_unique<Client>(server->port()));
    slow.back()->send_all("G");
  }
  Client fast(server->port());
  fast.send_all("GET /x HTTP/1.1\r\nAuthorization: Bearer t\r\n\r\n");
  EXPECT_EQ(status_line(fast.read_all()), "HTTP/1.1 200 OK");
  for (auto& c : slow) {
    c->send_all("E");
  }
  for (auto& c : slow) {
    EXPECT_EQ(c->read_all(10s), "");  // dropped without an answer once the deadline passed
    EXPECT_TRUE(c->closed_by_server());
  }
}

TEST(AdminHttpServer, StopDoesNotWaitForIdleOrSlowClients) {
  Recorder r;
  auto server = echo_server(r);
  server->start();
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 16; ++i) {
    idle.push_back(std::make_unique<Client>(server->port()));
    idle.back()->send_all("GET /x HTTP/1.1\r\n");
  }
  auto stopped = std::async(std::launch::async, [&] { server->stop(); });
  // Bounded by the read deadline of the check, not by the clients (they once held it 41 s).
  EXPECT_EQ(stopped.wait_for(5s), std::future_status::ready);
  for (auto& c : idle) {
    c->read_all(5s);
    EXPECT_TRUE(c->closed_by_server());
  }
}

TEST(AdminHttpServer, AFloodOfIdleConnectionsCannotLockOutANewClient) {
  // Found breaking the first version: 256 idle connections made every new one fail.
  Recorder r;
  HttpLimits limits;
  limits.max_connections = 8;
  auto server = echo_server(r, limits);
  server->start();
  std::vector<std::unique_ptr<Client>> idle;
  for (int i = 0; i < 8; ++i) {
    idle.push_back(std::make_unique<Client>(server->port()));
    // Half stall in the head; half pass the screen and stall in a body they never send.
    idle.back()->send_all(i % 2 == 0 ? "GET /x HTTP/1.1\r\n"
                                     : "GET /x HTTP/1.1\r\nAuthorization: Bearer t\r\n"
                                       "Content-Length: 60000\r\n\r\n");
  }
  // More new clients than the flood holds: each replaces the oldest stalled one.
  for (int i = 0; i < 12; ++i) {
    Client fresh(server->port());
    fresh.send_all("GET /x HTTP/1.1\r\nAuthorization: Bearer t\r\n\r\n");
    EXPECT_EQ(status_line(fresh.read_all()), "HTTP/1.1 200 OK") << i;
  }
  // The oldest idle client made room.
  idle.front()->read_all(5s);
  EXPECT_TRUE(idle.front()->closed_by_server());
}

TEST(AdminHttpServer, ResponsesWaitingForSlowReadersAreBounded) {
  // Found breaking the first version: 60 clients that never read an 8 MB answer held 538 MB.
  HttpLimits limits;
  limits.max_buffered_output = 48 * 1024 * 1024;
  HttpServer server(
      "127.0.0.1", 0, limits, [](const HttpRequest&) { return std::optional<HttpResponse>(); },
      [](const HttpRequest&) {
        return HttpResponse{200, "text/plain", std::string(32 << 20, 'x'), {}};
      });
  server.start();
  Client slow(server.port());  // never reads: most of its answer stays buffered
  slow.send_all("GET /big HTTP/1.1\r\n\r\n");
  ASSERT_TRUE(testing::wait_until([&] { return slow.answered(); }));
  Client probe(server.port());
  probe.send_all("GET /big HTTP/1.1\r\n\r\n");
  const auto refused = probe.read_all();
  EXPECT_EQ(status_line(refused), "HTTP/1.1 503 Service Unavailable");
  EXPECT_NE(body_of(refused).find("slow clients"), std::string::npos);
}

TEST(AdminHttpServer, MalformedRequestsGetAJsonError) {
  Recorder r;
  auto server = echo_server(r);
  server->start();
  for (const char* bad :
       {"NONSENSE\r\n\r\n", "GET x HTTP/1.1\r\n\r\n", "GET /x HTTP/1.1\r\n bad fold\r\n\r\n",
        "GET /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        "GET /x HTTP/1.1\r\nContent-Length: -1\r\n\r\n"}) {
    Client c(server->port());
    c.send_all(bad);
    const auto response = c.read_all();
    EXPECT_EQ(status_line(response), "HTTP/1.1 400 Bad Request") << bad;
    EXPECT_NE(body_of(response).find("\"error\":"), std::string::npos) << bad;
  }
}

TEST(AdminServerRoutes, ErrorBodiesAreJsonWhateverTheRequestQuotes) {
  AdminHandlers h;
  h.check_ready = [] { throw std::runtime_error("table missing \xff"); };
  h.metrics = [] { return std::string(); };
  h.status_json = [] { return std::string("{}"); };
  h.dead_json = [](const std::string&, auto, auto, int) { return std::string("[]"); };
  h.replay = [](const std::string&, const std::string&) { return 0; };
  AdminServer server("127.0.0.1", 0, "tok", std::move(h));
  server.start();
  // Found breaking the fix: invalid UTF-8 from the path, a cut multibyte character or an id
  // was copied into the body, which then was not JSON.
  std::string long_path = "/";
  for (int i = 0; i < 150; ++i) {
    long_path += "\xc3\xa9";
  }
  for (const std::string& request :
       {std::string("GET /\xff\xfe HTTP/1.1\r\n\r\n"), "GET " + long_path + " HTTP/1.1\r\n\r\n",
        std::string("POST /api/dead/%FF/replay HTTP/1.1\r\nAuthorization: Bearer tok\r\n\r\n"),
        std::string("GET /readyz HTTP/1.1\r\n\r\n")}) {
    Client c(server.port());
    c.send_all(request);
    const auto response = c.read_all();
    EXPECT_NE(response.find("Content-Type: application/json"), std::string::npos) << response;
    const auto body = body_of(response);
    EXPECT_TRUE(valid_utf8_for_test(body)) << body;
  }
}

TEST(AdminHttpServer, PercentDecoding) {
  EXPECT_EQ(internal::percent_decode("a%2Fb%20c+d"), "a/b c+d");
  EXPECT_EQ(internal::percent_decode("a+b", true), "a b");
  EXPECT_EQ(internal::percent_decode("%zz"), std::nullopt);
  EXPECT_EQ(internal::percent_decode("%4"), std::nullopt);
}

// The admin routes over the server: liveness while handlers are stuck, ids with '/'.
TEST(AdminServerRoutes, HealthzAnswersWhileEveryWorkerIsBusyAndIdsMayContainSlashes) {
  std::promise<void> release;
  std::shared_future<void> released = release.get_future().share();
  std::atomic<int> blocked{0};
  std::string replayed;
  std::mutex m;
  AdminHandlers h;
  h.check_ready = [&] {
    ++blocked;
    released.wait();
  };
  h.metrics = [] { return std::string("m 1\n"); };
  h.status_json = [] { return std::string("{}"); };
  h.dead_json = [](const std::string&, auto, auto, int) { return std::string("[]"); };
  h.replay = [&](const std::string&, const std::string& id) {
    std::lock_guard lock(m);
    replayed = id;
    return 1;
  };
  AdminServer server("127.0.0.1", 0, "tok", std::move(h));
  server.start();
  std::vector<std::unique_ptr<Client>> stuck;
  for (int i = 0; i < 8; ++i) {  // more than the workers: every one of them blocks
    stuck.push_back(std::make_unique<Client>(server.port()));
    stuck.back()->send_all("GET /readyz HTTP/1.1\r\n\r\n");
  }
  Client live(server.port());
  live.send_all("GET /healthz HTTP/1.1\r\n\r\n");
  EXPECT_EQ(body_of(live.read_all()), "ok\n");
  release.set_value();
  for (auto& c : stuck) {
    EXPECT_EQ(status_line(c->read_all()), "HTTP/1.1 200 OK");
  }
  Client replay(server.port());
  replay.send_all(
      "POST /api/dead/tenant%2Fa%2F1/replay HTTP/1.1\r\nAuthorization: Bearer tok\r\n\r\n");
  EXPECT_EQ(status_line(replay.read_all()), "HTTP/1.1 200 OK");
  {
    std::lock_guard lock(m);
    EXPECT_EQ(replayed, "tenant/a/1");
  }
  Client unauthorised(server.port());
  unauthorised.send_all("POST /api/dead/x/replay HTTP/1.1\r\n\r\n");
  const auto refused = unauthorised.read_all();
  EXPECT_EQ(status_line(refused), "HTTP/1.1 401 Unauthorized");
  EXPECT_NE(body_of(refused).find("bearer token"), std::string::npos);
}

}  // namespace
}  // namespace outbox::relay
