#pragma once
// The relay's stream mode: the runner of its [[subscriptions]], and a monitor that keeps their
// gauges fresh and reports (or fails) subscriptions lagging past [stream].max_lag_retention.

#include <map>
#include <memory>
#include <optional>
#include <string>

#include "outbox/relay/config.hpp"
#include "outbox/relay/subscription_ops.hpp"

namespace outbox {
class LeaseManager;
class LeaseStore;
class Publisher;
class StreamStore;
class ChangeWatcher;
namespace sql {
class ConnectionPool;
}
namespace prometheus {
class PrometheusMetrics;
}
}  // namespace outbox

namespace outbox::relay {

/// Thread-safe. Needs schema version 4.
class StreamMode {
 public:
  /// `leases` spreads the subscriptions over the relays (started and closed by the caller);
  /// `watcher` (may be null) wakes the subscriptions when other connections commit.
  StreamMode(const RelayConfig& config, std::shared_ptr<sql::ConnectionPool> pool,
             std::shared_ptr<StreamStore> stream, std::shared_ptr<LeaseStore> lease_store,
             std::shared_ptr<LeaseManager> leases,
             const std::map<std::string, std::shared_ptr<Publisher>>& publishers,
             std::shared_ptr<prometheus::PrometheusMetrics> metrics,
             std::unique_ptr<ChangeWatcher> watcher = nullptr);
  ~StreamMode();

  /// Checks the stream (StreamError: e.g. a restored PostgreSQL database), creates or updates the
  /// configured subscriptions and starts them.
  void start();
  /// Stops after the batches in progress and hands the subscriptions' leases back. Idempotent.
  void close();
  /// Every subscription in the table (not only this relay's), with this relay's view of its own.
  StreamReport report(std::optional<std::string_view> name = std::nullopt) const;
  /// apply_subscription_action, then the subscription's report; nullopt when there is none.
  std::optional<SubscriptionReport> act(const std::string& name, const std::string& action,
                                        std::optional<std::string> to);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::relay
