#pragma once
// A real HTTP server on loopback (cpp-httplib) that records what it receives.

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/receiver_socket.hpp"

namespace outbox::testing {

/// One request as received.
struct ReceivedRequest {
  std::string method, path, body;
  std::string target;  ///< as sent: not percent-decoded, with the query
  httplib::Headers headers;
  int remote_port = 0;  ///< the client's port: one per connection
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

/// Listens on 127.0.0.1 (free port) in its own thread until destroyed. The responder decides each
/// reply (default: 200 "ok"); every request is recorded first.
class HttpTestServer {
 public:
  using Responder = std::function<void(const ReceivedRequest&, httplib::Response&)>;

  /// With `record` false only the count is kept (benchmarks: memory stays flat). The server
  /// closes a connection after `requests_per_connection` requests (the client reconnects).
  explicit HttpTestServer(bool record = true,
                          std::size_t requests_per_connection = kRequestsPerConnection) {
    auto handler = [this, record](const httplib::Request& req, httplib::Response& res) {
      ReceivedRequest r{req.method, req.path, req.body, req.target, req.headers, req.remote_port};
      Responder responder;
      {
        std::lock_guard lock(mutex_);
        ++count_;
        if (record) {
          received_.push_back(r);
        }
        responder = responder_;
      }
      {
        // A receiver that does not answer: held until release() (or the server goes).
        std::unique_lock lock(mutex_);
        stall_cv_.wait_for(lock, std::chrono::seconds(60), [&] { return !stalled_; });
      }
      if (responder) {
        responder(r, res);
      } else {
        res.set_content("ok", "text/plain");
      }
    };
    server_.set_tcp_nodelay(true);  // replies go out at once, not after a delayed ACK
    // One thread per kept-alive client connection (httplib's default is 8): with more clients
    // than threads, a new connection would wait for an idle one to time out (5 s).
    server_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    server_.Post(".*", handler);
    server_.Get(".*", handler);
    port_ = server_.bind_to_any_port("127.0.0.1");
    if (port_ <= 0) {
      throw std::runtime_error("HttpTestServer: cannot bind");
    }
    accept_like_a_receiver(server_, port_, requests_per_connection);
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // bind_to_any_port already listens: connections queue until the accept loop runs.
  }
  ~HttpTestServer() {
    release();
    server_.stop();
    thread_.join();
  }
  HttpTestServer(const HttpTestServer&) = delete;
  HttpTestServer& operator=(const HttpTestServer&) = delete;

  std::string url(const std::string& path = "/") const {
    return "http://127.0.0.1:" + std::to_string(port_) + path;
  }
  void respond(Responder responder) {
    std::lock_guard lock(mutex_);
    responder_ = std::move(responder);
  }
  std::vector<ReceivedRequest> received() const {
    std::lock_guard lock(mutex_);
    return received_;
  }
  std::size_t count() const {
    std::lock_guard lock(mutex_);
    return count_;
  }
  /// Requests from now on are held unanswered (recorded first) until release(), at most 60 s.
  void stall() {
    std::lock_guard lock(mutex_);
    stalled_ = true;
  }
  void release() {
    {
      std::lock_guard lock(mutex_);
      stalled_ = false;
    }
    stall_cv_.notify_all();
  }

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  mutable std::mutex mutex_;  // guards received_, count_, responder_ and stalled_
  std::condition_variable stall_cv_;
  bool stalled_ = false;
  std::vector<ReceivedRequest> received_;
  std::size_t count_ = 0;
  Responder responder_;
};

}  // namespace outbox::testing
