#pragma once
// The relay: poller with claim locking → dispatcher → publishers, plus the admin HTTP server.

#include <memory>

#include "outbox/relay/config.hpp"
#include "outbox/trace_context.hpp"

namespace outbox::prometheus {
class PrometheusMetrics;
}

namespace outbox::relay {

/// Runs one relay process's components. start() and stop() are thread-safe; move-only.
///
/// Admin endpoints (when admin.enabled): GET /healthz, GET /readyz (database reachable),
/// GET /metrics (Prometheus text), GET /api/status, GET /api/dead?type=&aggregate=&limit=,
/// POST /api/dead/{id}/replay, and the subscription and message-group endpoints (docs/relay.md);
/// ?table= picks one of the tables the routes name. /api/* require "Authorization: Bearer
/// <admin.token>" when a token is set; POSTs are refused (403) when none is. Other methods on an
/// endpoint answer 405.
class Relay {
 public:
  /// Opens the database, checks the outbox table, creates the publishers and binds the admin
  /// port. Throws ConfigError / std::invalid_argument for unusable settings, outbox::StoreError
  /// when the database or table is unreachable, std::runtime_error when the port cannot be bound.
  /// `spans`: a span per publish of a route's event, its context forwarded (PublishSpanHook).
  explicit Relay(RelayConfig config, std::shared_ptr<PublishSpanHook> spans = {});
  /// Calls stop().
  ~Relay();
  Relay(Relay&&) noexcept;
  Relay& operator=(Relay&&) noexcept;

  /// Starts polling, dispatching and serving the admin endpoints.
  void start();
  /// Stops polling, lets in-flight events finish (dispatcher.drain_timeout), stops the admin
  /// server. Idempotent.
  void stop();
  /// The admin server's bound port (0 when disabled); useful with admin.port = 0.
  int admin_port() const;
  /// The relay's metrics (also served on /metrics).
  prometheus::PrometheusMetrics& metrics();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::relay
