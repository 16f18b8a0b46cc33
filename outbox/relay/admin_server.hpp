#pragma once
// The relay's admin HTTP server (internal/http_server: bounded, deadline per request); routes
// are described on Relay.

#include <functional>
#include <memory>
#include <optional>
#include <string>

namespace outbox::relay {

/// What the admin endpoints call; each may throw (answered 500 with the message, 503 for ready).
struct AdminHandlers {
  std::function<void()> check_ready;         ///< throws when the database is unreachable
  std::function<std::string()> metrics;      ///< Prometheus text
  std::function<std::string()> status_json;  ///< StatusReport as JSON
  // `table` (the request's ?table=, empty when absent) picks one of the relay's tables; a table
  // it does not deliver throws std::invalid_argument (answered 400).
  std::function<std::string(const std::string& table, std::optional<std::string> type,
                            std::optional<std::string> aggregate, int limit)>
      dead_json;  ///< DEAD rows as JSON
  /// Events replayed: those of that id DEAD in `table` (in each of the relay's tables when empty).
  std::function<int(const std::string& table, const std::string& id)> replay;
  /// DEAD events of `table` grouped by failure fingerprint (of its first `limit` DEAD rows), the
  /// `top` largest groups.
  std::function<std::string(const std::string& table, int limit, int top)> dead_groups_json;
  /// replay | discard every DEAD event of `table` with that fingerprint: what it did as JSON;
  /// nullopt when no DEAD event has it.
  std::function<std::optional<std::string>(const std::string& table, const std::string& fingerprint,
                                           const std::string& action)>
      dead_group_action;
  /// Stream mode; unset when the relay has no subscriptions (the endpoints answer 404). `name`
  /// empty: every subscription. nullopt: no subscription of that name.
  std::function<std::optional<std::string>(const std::string& name)> subscriptions_json;
  /// pause | resume | reset | rewind (`to`: start, end, an RFC 3339 time or a position). The
  /// subscription's JSON after it; nullopt: none of that name. Throws std::invalid_argument
  /// (answered 400) or std::logic_error (409: its status does not allow the action).
  std::function<std::optional<std::string>(const std::string& name, const std::string& action,
                                           std::optional<std::string> to)>
      subscription_action;
  /// Message groups; unset when the relay delivers none (the endpoints answer 404). `group`
  /// empty: the groups an operator may have to act on. nullopt: no pending event in that group.
  std::function<std::optional<std::string>(const std::string& table, const std::string& group)>
      groups_json;
  /// retry | skip-head | dead-letter: the group's JSON after it; nullopt: no pending event in
  /// that group.
  std::function<std::optional<std::string>(const std::string& table, const std::string& group,
                                           const std::string& action)>
      group_action;
};

/// Serves the endpoints on its own threads from start() to stop(). Thread-safe.
class AdminServer {
 public:
  /// Binds host:port (0 = any free port). Throws std::runtime_error when it cannot.
  AdminServer(const std::string& host, int port, std::string token, AdminHandlers handlers);
  ~AdminServer();
  AdminServer(const AdminServer&) = delete;
  AdminServer& operator=(const AdminServer&) = delete;

  void start();
  /// Idempotent.
  void stop();
  int port() const noexcept { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

}  // namespace outbox::relay
