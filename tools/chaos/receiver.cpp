#include "receiver.hpp"

#include <httplib.h>

#include <condition_variable>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <thread>

#include "tests/support/receiver_socket.hpp"

namespace outbox::chaos {

struct Receiver::State {
  explicit State(std::chrono::milliseconds stall_for) : stall(stall_for) {}
  httplib::Server server;
  std::thread thread;
  int port = 0;
  const std::chrono::milliseconds stall;
  mutable std::mutex mutex;  // guards everything below
  std::condition_variable closing_cv;
  bool closing = false;
  EndpointMode mode = EndpointMode::Healthy;
  std::vector<Receipt> receipts;
  std::unordered_set<std::string> ids;
  EndpointCounts counts;

  void handle(const httplib::Request& req, httplib::Response& res) {
    Receipt receipt;
    receipt.event_id = req.get_header_value("X-Outbox-Event-Id");
    receipt.via = req.path.substr(req.path.rfind('/') + 1);
    try {
      const auto body = nlohmann::json::parse(req.body);
      receipt.key = body.at("k").get<std::string>();
      receipt.seq = body.at("s").get<long>();
    } catch (const std::exception&) {
      receipt.key.clear();
    }
    std::unique_lock lock(mutex);
    if (receipt.event_id.empty() || receipt.key.empty()) {
      // Not an event of this harness: refused for good, and counted (it should never happen).
      ++counts.malformed;
      res.status = 400;
      return;
    }
    switch (mode) {
      case EndpointMode::Failing:
        ++counts.failed;
        res.status = 500;
        res.set_content("chaos: failing", "text/plain");
        return;
      case EndpointMode::Throttle:
        ++counts.throttled;
        res.status = 503;
        res.set_header("Retry-After", "1");
        return;
      case EndpointMode::Healthy:
      case EndpointMode::Stalling:
        break;
    }
    ids.insert(receipt.event_id);
    receipts.push_back(std::move(receipt));
    if (mode == EndpointMode::Stalling) {
      ++counts.stalled;
      closing_cv.wait_for(lock, stall, [&] { return closing; });
    }
    res.set_content("ok", "text/plain");
  }
};

Receiver::Receiver(std::chrono::milliseconds stall) : state_(std::make_unique<State>(stall)) {
  auto* s = state_.get();
  s->server.set_tcp_nodelay(true);
  // Every relay worker may be stalled at once: one thread per connection, more than all of them.
  s->server.new_task_queue = [] { return new httplib::ThreadPool(256); };
  s->server.Post(".*",
                 [s](const httplib::Request& req, httplib::Response& res) { s->handle(req, res); });
  s->port = s->server.bind_to_any_port("127.0.0.1");
  if (s->port <= 0) {
    throw std::runtime_error("receiver: cannot bind a port on 127.0.0.1");
  }
  outbox::testing::accept_like_a_receiver(s->server, s->port);
  s->thread = std::thread([s] { s->server.listen_after_bind(); });
}

Receiver::~Receiver() {
  {
    std::lock_guard lock(state_->mutex);
    state_->closing = true;
  }
  state_->closing_cv.notify_all();
  state_->server.stop();
  state_->thread.join();
}

std::string Receiver::url(const std::string& path) const {
  return "http://127.0.0.1:" + std::to_string(state_->port) + path;
}

void Receiver::set_mode(EndpointMode mode) {
  std::lock_guard lock(state_->mutex);
  state_->mode = mode;
}

std::vector<Receipt> Receiver::receipts() const {
  std::lock_guard lock(state_->mutex);
  return state_->receipts;
}

std::size_t Receiver::received_of(const std::unordered_set<std::string>& ids) const {
  std::lock_guard lock(state_->mutex);
  std::size_t n = 0;
  for (const auto& id : ids) {
    n += state_->ids.contains(id) ? 1 : 0;
  }
  return n;
}

EndpointCounts Receiver::counts() const {
  std::lock_guard lock(state_->mutex);
  return state_->counts;
}

}  // namespace outbox::chaos
