#include "outbox/relay/admin_server.hpp"

#include <charconv>
#include <map>
#include <stdexcept>

#include "outbox/dead_event_manager.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/relay/internal/admin_routes.hpp"
#include "outbox/relay/internal/dashboard_page.hpp"
#include "outbox/relay/internal/http_server.hpp"
#include "outbox/store.hpp"

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

// Messages may quote the request (a path, an id): made valid UTF-8 first, so the body is JSON.
std::string json_error(const std::string& message) {
  std::string out = "{\"error\":";
  append_json_string(out, sanitize_utf8(message));
  out += "}";
  return out;
}

// What a request path names, once split and decoded.
struct Route {
  enum class Kind {
    Dashboard,
    Healthz,
    Readyz,
    Metrics,
    Status,
    DeadList,
    Replay,
    DeadGroups,
    DeadGroupAction,
    Subscriptions,
    Subscription,
    SubscriptionAction,
    Groups,
    Group,
    GroupAction,
    Unknown
  };
  Kind kind = Kind::Unknown;
  // Replay: the event id; Subscription*: the name. Percent-decoded after splitting (so %2F stays).
  std::string id;
  std::string action;  // SubscriptionAction
};

Route route_of(const std::string& path) {
  using Kind = Route::Kind;
  static const std::map<std::string, Kind, std::less<>> kFixed = {
      {"/", Kind::Dashboard},
      {"/healthz", Kind::Healthz},
      {"/readyz", Kind::Readyz},
      {"/metrics", Kind::Metrics},
      {"/api/status", Kind::Status},
      {"/api/dead", Kind::DeadList},
      {"/api/subscriptions", Kind::Subscriptions},
      {"/api/groups", Kind::Groups},
      {"/api/dead/groups", Kind::DeadGroups}};
  if (auto it = kFixed.find(path); it != kFixed.end()) {
    return {it->second, {}, {}};
  }
  constexpr std::string_view kSubs = "/api/subscriptions/";
  if (path.size() > kSubs.size() && path.starts_with(kSubs)) {
    const std::string_view rest = std::string_view(path).substr(kSubs.size());
    const auto slash = rest.find('/');
    auto name = internal::percent_decode(rest.substr(0, slash));
    if (!name || name->empty()) {
      return {};
    }
    if (slash == std::string_view::npos) {
      return {Kind::Subscription, std::move(*name), {}};
    }
    const std::string_view action = rest.substr(slash + 1);
    if (action == "pause" || action == "resume" || action == "reset" || action == "rewind") {
      return {Kind::SubscriptionAction, std::move(*name), std::string(action)};
    }
    return {};
  }
  constexpr std::string_view kGroups = "/api/groups/";
  if (path.size() > kGroups.size() && path.starts_with(kGroups)) {
    const std::string_view rest = std::string_view(path).substr(kGroups.size());
    const auto slash = rest.find('/');
    auto key = internal::percent_decode(rest.substr(0, slash));
    if (!key || key->empty()) {
      return {};
    }
    if (slash == std::string_view::npos) {
      return {Kind::Group, std::move(*key), {}};
    }
    const std::string_view action = rest.substr(slash + 1);
    if (action == "retry" || action == "skip-head" || action == "dead-letter") {
      return {Kind::GroupAction, std::move(*key), std::string(action)};
    }
    return {};
  }
  constexpr std::string_view kDeadGroups = "/api/dead/groups/";
  if (path.size() > kDeadGroups.size() && path.starts_with(kDeadGroups)) {
    // (Without a second segment it is the replay of an event whose id is "groups".)
    const std::string_view rest = std::string_view(path).substr(kDeadGroups.size());
    if (const auto slash = rest.find('/'); slash != std::string_view::npos) {
      auto fingerprint = internal::percent_decode(rest.substr(0, slash));
      const std::string_view action = rest.substr(slash + 1);
      if (fingerprint && !fingerprint->empty() && (action == "replay" || action == "discard")) {
        return {Kind::DeadGroupAction, std::move(*fingerprint), std::string(action)};
      }
      return {};
    }
  }
  constexpr std::string_view kPrefix = "/api/dead/", kSuffix = "/replay";
  if (path.size() > kPrefix.size() + kSuffix.size() && path.starts_with(kPrefix) &&
      path.ends_with(kSuffix)) {
    const std::string_view raw = std::string_view(path).substr(
        kPrefix.size(), path.size() - kPrefix.size() - kSuffix.size());
    if (raw.find('/') == std::string_view::npos) {
      if (auto id = internal::percent_decode(raw)) {
        return {Kind::Replay, std::move(*id), {}};
      }
    }
  }
  return {};
}

// Query parameters, decoded (form style: '+' is a space); malformed escapes drop the pair.
std::map<std::string, std::string> query_params(std::string_view query) {
  std::map<std::string, std::string> params;
  while (!query.empty()) {
    const auto amp = query.find('&');
    const std::string_view pair = query.substr(0, amp);
    query = amp == std::string_view::npos ? std::string_view() : query.substr(amp + 1);
    const auto eq = pair.find('=');
    auto key = internal::percent_decode(pair.substr(0, eq), true);
    auto value = internal::percent_decode(
        eq == std::string_view::npos ? std::string_view() : pair.substr(eq + 1), true);
    if (key && value && !key->empty()) {
      params.emplace(std::move(*key), std::move(*value));
    }
  }
  return params;
}

// The query parameter `name` as a whole number within [min, max], `fallback` when absent;
// nullopt when it is not one ("5abc" and "1e3" included).
std::optional<int> bounded(const std::map<std::string, std::string>& params, const char* name,
                           int fallback, int min, int max) {
  const auto it = params.find(name);
  if (it == params.end()) {
    return fallback;
  }
  int value = 0;
  const auto& text = it->second;
  const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (error != std::errc() || end != text.data() + text.size() || value < min || value > max) {
    return std::nullopt;
  }
  return value;
}

internal::HttpResponse json(int status, std::string body) {
  internal::HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = std::move(body);
  return r;
}

internal::HttpResponse text(int status, std::string body, std::string type = "text/plain") {
  internal::HttpResponse r;
  r.status = status;
  r.content_type = std::move(type);
  r.body = std::move(body);
  return r;
}

// The endpoints without the socket: the token, the handlers and what they answer.
struct Routes {
  std::string token;
  AdminHandlers handlers;

  // A refusal, or nullopt when the request may go on.
  std::optional<internal::HttpResponse> refuse_unauthorised(const internal::HttpRequest& req,
                                                            bool mutating) const {
    if (token.empty()) {
      if (!mutating) {
        return std::nullopt;
      }
      return json(403, json_error("set admin.token in the relay configuration to enable this"));
    }
    if (same_secret(req.header("Authorization"), "Bearer " + token)) {
      return std::nullopt;
    }
    auto r = json(401, json_error("missing or wrong bearer token"));
    r.headers.emplace_back("WWW-Authenticate", "Bearer");
    return r;
  }

  // Runs on the server's loop before any body is read: cheap answers and every refusal.
  std::optional<internal::HttpResponse> screen(const internal::HttpRequest& req) const {
    using Kind = Route::Kind;
    const Route route = route_of(req.path);
    const bool stream_route = route.kind == Kind::Subscriptions ||
                              route.kind == Kind::Subscription ||
                              route.kind == Kind::SubscriptionAction;
    const bool group_route =
        route.kind == Kind::Groups || route.kind == Kind::Group || route.kind == Kind::GroupAction;
    if (stream_route && !handlers.subscriptions_json) {
      return json(404, json_error("this relay has no [[subscriptions]]"));
    }
    if (group_route && !handlers.groups_json) {
      return json(404, json_error("this relay delivers no message groups (active mode with "
                                  "[[routes]] and groups.enabled)"));
    }
    if (route.kind == Kind::Unknown) {
      return json(404, json_error("no such endpoint: " + req.path.substr(0, 200)));
    }
    const bool mutating = route.kind == Kind::Replay || route.kind == Kind::SubscriptionAction ||
                          route.kind == Kind::GroupAction || route.kind == Kind::DeadGroupAction;
    const char* allow = mutating ? "POST" : "GET";
    if (req.method != allow) {
      auto r = json(405, json_error(std::string("method not allowed; use ") + allow));
      r.headers.emplace_back("Allow", allow);
      return r;
    }
    switch (route.kind) {
      case Kind::Healthz:
        return text(200, "ok\n");  // liveness: answered even while every worker is busy
      case Kind::Dashboard: {
        // A static page: what it shows comes from the API, with the token where one is set.
        auto r = text(200, std::string(internal::dashboard_page()), "text/html; charset=utf-8");
        r.headers.emplace_back("Content-Security-Policy",
                               "default-src 'none'; script-src 'unsafe-inline'; style-src "
                               "'unsafe-inline'; connect-src 'self'; img-src 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'; form-action 'none'");
        r.headers.emplace_back("X-Frame-Options", "DENY");
        r.headers.emplace_back("X-Content-Type-Options", "nosniff");
        r.headers.emplace_back("Referrer-Policy", "no-referrer");
        r.headers.emplace_back("Cache-Control", "no-store");
        return r;
      }
      case Kind::Status:
      case Kind::DeadList:
      case Kind::DeadGroups:
      case Kind::Subscriptions:
      case Kind::Subscription:
      case Kind::Groups:
      case Kind::Group:
        return refuse_unauthorised(req, false);
      case Kind::Replay:
      case Kind::DeadGroupAction:
      case Kind::SubscriptionAction:
      case Kind::GroupAction:
        return refuse_unauthorised(req, true);
      default:
        return std::nullopt;
    }
  }

  internal::HttpResponse handle(const internal::HttpRequest& req) const {
    try {
      return handle_route(req);
    } catch (const std::invalid_argument& e) {  // e.g. a table the relay does not deliver
      return json(400, json_error(e.what()));
    }
  }

  internal::HttpResponse handle_route(const internal::HttpRequest& req) const {
    using Kind = Route::Kind;
    const Route route = route_of(req.path);
    const auto table = [&] {
      const auto params = query_params(req.query);
      const auto it = params.find("table");
      return it == params.end() ? std::string() : it->second;
    };
    switch (route.kind) {
      case Kind::Readyz:
        try {
          handlers.check_ready();
          return text(200, "ready\n");
        } catch (const std::exception& e) {
          return json(503, json_error(std::string("not ready: ") + e.what()));
        }
      case Kind::Metrics:
        return text(200, handlers.metrics(), "text/plain; version=0.0.4");
      case Kind::Status:
        return json(200, handlers.status_json());
      case Kind::DeadList: {
        const auto params = query_params(req.query);
        auto param = [&](const char* name) -> std::optional<std::string> {
          auto it = params.find(name);
          return it == params.end() ? std::nullopt : std::optional<std::string>(it->second);
        };
        int limit = 100;
        if (auto l = param("limit")) {
          try {
            limit = std::stoi(*l);
          } catch (const std::exception&) {
            limit = 0;
          }
          if (limit < 1 || limit > 10000) {
            return json(400, json_error("limit must be between 1 and 10000"));
          }
        }
        return json(200, handlers.dead_json(table(), param("type"), param("aggregate"), limit));
      }
      case Kind::DeadGroups: {
        const auto params = query_params(req.query);
        const auto limit = bounded(params, "limit", DeadEventManager::kReplayAllLimit, 1,
                                   DeadEventManager::kReplayAllLimit);
        const auto top = bounded(params, "top", 1000, 1, 10000);
        if (!limit || !top) {
          return json(400, json_error("limit must be between 1 and 100000, top between 1 and "
                                      "10000 (whole numbers)"));
        }
        return json(200, handlers.dead_groups_json(table(), *limit, *top));
      }
      case Kind::DeadGroupAction:
        if (auto body = handlers.dead_group_action(table(), route.id, route.action)) {
          return json(200, std::move(*body));
        }
        return json(404, json_error("no DEAD event with fingerprint " + route.id));
      case Kind::Replay:
        if (const int replayed = handlers.replay(table(), route.id); replayed > 0) {
          return json(200, "{\"replayed\":" + std::to_string(replayed) + "}");
        }
        return json(404, json_error("no DEAD event " + route.id));
      case Kind::Subscriptions:
        return json(200, handlers.subscriptions_json("").value_or("{}"));
      case Kind::Subscription:
        try {
          if (auto body = handlers.subscriptions_json(route.id)) {
            return json(200, std::move(*body));
          }
        } catch (const std::invalid_argument& e) {  // a name no subscription can have
          return json(400, json_error(e.what()));
        }
        return json(404, json_error("no subscription " + route.id));
      case Kind::SubscriptionAction: {
        const auto params = query_params(req.query);
        const auto to = params.find("to");
        try {
          if (auto body = handlers.subscription_action(
                  route.id, route.action,
                  to == params.end() ? std::nullopt : std::optional<std::string>(to->second))) {
            return json(200, std::move(*body));
          }
          return json(404, json_error("no subscription " + route.id));
        } catch (const std::invalid_argument& e) {
          return json(400, json_error(e.what()));
        } catch (const std::logic_error& e) {
          return json(409, json_error(e.what()));
        }
      }
      case Kind::Groups:
        return json(200, handlers.groups_json(table(), "").value_or("{}"));
      case Kind::Group:
        if (auto body = handlers.groups_json(table(), route.id)) {
          return json(200, std::move(*body));
        }
        return json(404, json_error("no pending event in message group " + route.id));
      case Kind::GroupAction:
        if (auto body = handlers.group_action(table(), route.id, route.action)) {
          return json(200, std::move(*body));
        }
        return json(404, json_error("no pending event in message group " + route.id));
      default:
        return json(404, json_error("no such endpoint"));
    }
  }
};

}  // namespace

struct AdminServer::Impl {
  Routes routes;
  std::unique_ptr<internal::HttpServer> server;
};

internal::HttpResponse admin_response(const std::string& token, AdminHandlers handlers,
                                      const internal::HttpRequest& request) {
  const Routes routes{token, std::move(handlers)};
  if (auto now = routes.screen(request)) {
    return *now;
  }
  return routes.handle(request);
}

AdminServer::AdminServer(const std::string& host, int port, std::string token,
                         AdminHandlers handlers)
    : impl_(std::make_unique<Impl>()) {
  impl_->routes.token = std::move(token);
  impl_->routes.handlers = std::move(handlers);
  const Routes* routes = &impl_->routes;
  impl_->server = std::make_unique<internal::HttpServer>(
      host, port, internal::HttpLimits{},
      [routes](const internal::HttpRequest& req) { return routes->screen(req); },
      [routes](const internal::HttpRequest& req) { return routes->handle(req); });
  port_ = impl_->server->port();
}

AdminServer::~AdminServer() {
  stop();
}

void AdminServer::start() {
  impl_->server->start();
}

void AdminServer::stop() {
  if (impl_) {
    impl_->server->stop();
  }
}

}  // namespace outbox::relay
