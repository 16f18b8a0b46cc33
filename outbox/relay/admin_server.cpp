#include "outbox/relay/admin_server.hpp"

#include <httplib.h>

#include <stdexcept>
#include <thread>

#include "outbox/json_codec.hpp"
#include "outbox/log.hpp"

namespace outbox::relay {
namespace {

// Compares without an early exit, so response times do not reveal how much of a token matched.
bool same_secret(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff |= static_cast<unsigned char>(a[i] ^ (i < b.size() ? b[i] : 0));
  }
  return diff == 0;
}

std::string json_error(const std::string& message) {
  std::string out = "{\"error\":";
  append_json_string(out, message);
  out += "}";
  return out;
}

}  // namespace

struct AdminServer::Impl {
  httplib::Server server;
  std::string token;
  AdminHandlers handlers;
  std::thread thread;
  bool started = false;

  // True when the request may go on; otherwise the response is already set.
  bool authorised(const httplib::Request& req, httplib::Response& res, bool mutating) {
    if (token.empty()) {
      if (!mutating) {
        return true;
      }
      res.status = 403;
      res.set_content(json_error("set admin.token in the relay configuration to enable this"),
                      "application/json");
      return false;
    }
    if (same_secret(req.get_header_value("Authorization"), "Bearer " + token)) {
      return true;
    }
    res.status = 401;
    res.set_header("WWW-Authenticate", "Bearer");
    res.set_content(json_error("missing or wrong bearer token"), "application/json");
    return false;
  }

  void method_not_allowed(const std::string& pattern, const char* allow) {
    auto refuse = [allow](const httplib::Request&, httplib::Response& res) {
      res.status = 405;
      res.set_header("Allow", allow);
      res.set_content(json_error(std::string("method not allowed; use ") + allow),
                      "application/json");
    };
    if (std::string_view(allow) == "GET") {
      server.Post(pattern, refuse);
    } else {
      server.Get(pattern, refuse);
    }
    server.Put(pattern, refuse);
    server.Delete(pattern, refuse);
    server.Patch(pattern, refuse);
  }

  template <typename Fn>
  static void guarded(httplib::Response& res, Fn&& fn) {
    try {
      fn();
    } catch (const std::exception& e) {
      res.status = 500;
      res.set_content(json_error(e.what()), "application/json");
    }
  }

  void routes() {
    server.Get("/healthz", [](const httplib::Request&, httplib::Response& res) {
      res.set_content("ok\n", "text/plain");
    });
    server.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
      try {
        handlers.check_ready();
        res.set_content("ready\n", "text/plain");
      } catch (const std::exception& e) {
        res.status = 503;
        res.set_content(std::string("not ready: ") + e.what() + "\n", "text/plain");
      }
    });
    server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      guarded(res, [&] { res.set_content(handlers.metrics(), "text/plain; version=0.0.4"); });
    });
    server.Get("/api/status", [this](const httplib::Request& req, httplib::Response& res) {
      if (authorised(req, res, false)) {
        guarded(res, [&] { res.set_content(handlers.status_json(), "application/json"); });
      }
    });
    server.Get("/api/dead", [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorised(req, res, false)) {
        return;
      }
      auto param = [&](const char* name) -> std::optional<std::string> {
        if (!req.has_param(name)) {
          return std::nullopt;
        }
        return req.get_param_value(name);
      };
      int limit = 100;
      if (auto l = param("limit")) {
        try {
          limit = std::stoi(*l);
        } catch (const std::exception&) {
          limit = 0;
        }
        if (limit < 1 || limit > 10000) {
          res.status = 400;
          res.set_content(json_error("limit must be between 1 and 10000"), "application/json");
          return;
        }
      }
      guarded(res, [&] {
        res.set_content(handlers.dead_json(param("type"), param("aggregate"), limit),
                        "application/json");
      });
    });
    const std::string replay_pattern = R"(/api/dead/([^/]+)/replay)";
    server.Post(replay_pattern, [this](const httplib::Request& req, httplib::Response& res) {
      if (!authorised(req, res, true)) {
        return;
      }
      guarded(res, [&] {
        const std::string id = req.matches[1];
        if (handlers.replay(id)) {
          res.set_content("{\"replayed\":1}", "application/json");
        } else {
          res.status = 404;
          res.set_content(json_error("no DEAD event " + id), "application/json");
        }
      });
    });
    method_not_allowed(replay_pattern, "POST");
    for (const char* path : {"/healthz", "/readyz", "/metrics", "/api/status", "/api/dead"}) {
      method_not_allowed(path, "GET");
    }
  }
};

AdminServer::AdminServer(const std::string& host, int port, std::string token,
                         AdminHandlers handlers)
    : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(token);
  impl_->handlers = std::move(handlers);
  impl_->routes();
  if (port == 0) {
    port_ = impl_->server.bind_to_any_port(host);
  } else if (impl_->server.bind_to_port(host, port)) {
    port_ = port;
  } else {
    port_ = -1;
  }
  if (port_ <= 0) {
    throw std::runtime_error("admin server: cannot listen on " + host + ":" + std::to_string(port));
  }
}

AdminServer::~AdminServer() {
  stop();
}

void AdminServer::start() {
  if (impl_->started) {
    return;
  }
  impl_->started = true;
  Impl* impl = impl_.get();
  impl_->thread = std::thread([impl] {
    if (!impl->server.listen_after_bind()) {
      log(LogLevel::Error, "admin server stopped unexpectedly");
    }
  });
}

void AdminServer::stop() {
  if (!impl_) {
    return;
  }
  impl_->server.stop();
  if (impl_->thread.joinable()) {
    impl_->thread.join();
  }
}

}  // namespace outbox::relay
