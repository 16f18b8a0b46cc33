#include "outbox/relay/stream_mode.hpp"

#include <mutex>
#include <set>
#include <utility>

#include "outbox/change_watcher.hpp"
#include "outbox/internal/periodic_worker.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/log.hpp"
#include "outbox/prometheus/metrics.hpp"
#include "outbox/relay/router.hpp"
#include "outbox/sql/pool.hpp"
#include "outbox/subscription.hpp"

namespace outbox::relay {
namespace {

constexpr std::chrono::seconds kMonitorInterval{5};

}  // namespace

struct StreamMode::Impl {
  RelayConfig config;
  std::shared_ptr<sql::ConnectionPool> pool;
  std::shared_ptr<StreamStore> stream;
  std::shared_ptr<LeaseStore> lease_store;
  std::shared_ptr<prometheus::PrometheusMetrics> metrics;
  std::unique_ptr<SubscriptionRunner> runner;
  std::unique_ptr<ChangeWatcher> watcher;  // none: the subscriptions poll on their schedule
  mutable std::mutex lagging_mutex;        // guards lagging
  std::set<std::string, std::less<>> lagging;
  std::set<std::string, std::less<>> exported;        // the monitor thread's own: names with gauges
  std::unique_ptr<internal::PeriodicWorker> monitor;  // last: stopped first

  void fill(StreamReport& report) const {
    std::map<std::string, std::string, std::less<>> waiting;
    for (const auto& v : runner->views()) {
      if (v.running_here) {
        waiting[v.name] = v.waiting;
      }
    }
    std::lock_guard lock(lagging_mutex);
    for (auto& r : report.subscriptions) {
      if (auto it = waiting.find(r.state.spec.name); it != waiting.end()) {
        r.waiting = it->second;
      }
      r.lagging = lagging.contains(r.state.spec.name);
    }
  }

  void check() {
    try {
      auto conn = pool->acquire();
      const auto report = read_stream(*conn, *stream, nullptr);
      const auto now = Clock::system()->now();
      metrics->record_stream_holdback(
          report.holdback ? std::chrono::duration<double>(report.holdback->age).count() : 0.0);
      std::set<std::string, std::less<>> late, seen;
      for (const auto& r : report.subscriptions) {
        seen.insert(r.state.spec.name);
        const auto& name = r.state.spec.name;
        const double lag_seconds =
            r.lag.oldest_unread
                ? std::max(0.0, std::chrono::duration<double>(now - *r.lag.oldest_unread).count())
                : 0.0;
        metrics->record_subscription(name, to_string(r.state.status), r.lag.events, lag_seconds);
        const auto limit = config.stream.max_lag_retention;
        if (limit.count() == 0 || r.state.released_at || !r.lag.oldest_unread ||
            now - *r.lag.oldest_unread <= limit) {
          continue;
        }
        late.insert(name);
        const std::string message = "subscription " + name + " is " +
                                    std::to_string(static_cast<long long>(lag_seconds)) +
                                    " s behind, past stream.max_lag_retention (" +
                                    format_duration(limit) + "): it keeps rows from purge";
        if (config.stream.fail_lagging &&
            stream->release_retention(*conn, name,
                                      message + "; FAILED, its unread rows may be purged")) {
          log(LogLevel::Error,
              message + "; FAILED, its unread rows may be purged (stream.fail_lagging)");
        } else {
          log(LogLevel::Warning, message);
        }
      }
      for (const auto& gone : exported) {
        if (!seen.contains(gone)) {
          metrics->forget_subscription(gone);  // removed: its gauges go with it
        }
      }
      exported = std::move(seen);
      std::lock_guard lock(lagging_mutex);
      lagging = std::move(late);
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("stream monitor: ") + e.what());
    }
  }
};

StreamMode::StreamMode(const RelayConfig& config, std::shared_ptr<sql::ConnectionPool> pool,
                       std::shared_ptr<StreamStore> stream, std::shared_ptr<LeaseStore> lease_store,
                       std::shared_ptr<LeaseManager> leases,
                       const std::map<std::string, std::shared_ptr<Publisher>>& publishers,
                       std::shared_ptr<prometheus::PrometheusMetrics> metrics,
                       std::unique_ptr<ChangeWatcher> watcher)
    : impl_(std::make_unique<Impl>()) {
  impl_->watcher = std::move(watcher);
  impl_->config = config;
  impl_->pool = pool;
  impl_->stream = stream;
  impl_->lease_store = std::move(lease_store);
  impl_->metrics = metrics;
  SubscriptionRunner::Options o{.connection_provider = pool,
                                .store = stream,
                                .leases = std::move(leases),
                                .metrics = metrics};
  for (const auto& s : config.subscriptions) {
    // Publishers that send one event after another get them one at a time, so the lease is checked
    // before each send and a failure stops the batch before later events go out (order kept).
    int chunk = 0;
    for (const auto& p : config.publishers) {
      if (p.name == s.publisher && p.type == PublisherConfig::Type::Http) {
        chunk = p.batch ? static_cast<int>(p.batch_size) : 1;
      }
    }
    SubscriptionRunner::Subscription sub{
        .spec = {.name = s.name,
                 .filter = {s.event_types, s.aggregate_types, s.required_tags, s.any_of_tags},
                 .publisher = s.publisher,
                 .target = s.target},
        .publisher = publishers.at(s.publisher),
        .schedule = {.poll_interval = s.interval,
                     .batch_size = s.batch,
                     .backoff_threshold = s.backoff_threshold,
                     .backoff_multiplier = s.backoff_multiplier,
                     .backoff_max = s.backoff_max,
                     .max_errors = s.max_errors,
                     .retry_base = s.retry_base,
                     .retry_max = s.retry_max,
                     .publish_chunk = chunk},
        .start_at_end = s.start_at_end,
        .target = [target = s.target](const EventEnvelope& e) { return expand_target(target, e); },
    };
    o.subscriptions.push_back(std::move(sub));
  }
  impl_->runner = std::make_unique<SubscriptionRunner>(std::move(o));
  Impl* impl = impl_.get();
  impl_->monitor = std::make_unique<internal::PeriodicWorker>(
      "stream monitor", [impl] { impl->check(); }, [] { return kMonitorInterval; });
}

StreamMode::~StreamMode() {
  close();
}

void StreamMode::start() {
  impl_->runner->start();
  impl_->monitor->start();
  if (impl_->watcher) {
    impl_->watcher->start([impl = impl_.get(), first = true](ChangeWatcher::Signal s) mutable {
      if (s == ChangeWatcher::Signal::Changed) {
        impl->metrics->increment_wakeup();
      } else if (!std::exchange(first, false)) {
        impl->metrics->increment_wakeup_reconnect();
      }
      impl->runner->wake();
    });
  }
}

void StreamMode::close() {
  if (impl_->watcher) {
    impl_->watcher->close();  // first: it wakes the runner
  }
  impl_->monitor->close();
  impl_->runner->close();
}

StreamReport StreamMode::report(std::optional<std::string_view> name) const {
  auto conn = impl_->pool->acquire();
  auto report = read_stream(*conn, *impl_->stream, impl_->lease_store.get(), name);
  impl_->fill(report);
  return report;
}

std::optional<SubscriptionReport> StreamMode::act(const std::string& name,
                                                  const std::string& action,
                                                  std::optional<std::string> to) {
  {
    auto conn = impl_->pool->acquire();
    if (!apply_subscription_action(*conn, *impl_->stream, name, action, to)) {
      return std::nullopt;
    }
  }
  impl_->runner->poll_now();
  auto r = report(name);
  if (r.subscriptions.empty()) {
    return std::nullopt;
  }
  return std::move(r.subscriptions.front());
}

}  // namespace outbox::relay
