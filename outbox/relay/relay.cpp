#include "outbox/relay/relay.hpp"

#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "outbox/dead_event_manager.hpp"
#include "outbox/detect/detect.hpp"
#include "outbox/errors.hpp"
#include "outbox/http/publisher.hpp"
#include "outbox/kafka/publisher.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"
#include "outbox/outbox.hpp"
#include "outbox/prometheus/metrics.hpp"
#include "outbox/purge.hpp"
#include "outbox/relay/admin_server.hpp"
#include "outbox/relay/dead_groups.hpp"
#include "outbox/relay/group_ops.hpp"
#include "outbox/relay/internal/routing_registry.hpp"
#include "outbox/relay/internal/table_metrics.hpp"
#include "outbox/relay/log_publisher.hpp"
#include "outbox/relay/operations.hpp"
#include "outbox/relay/router.hpp"
#include "outbox/relay/statistics_publisher.hpp"
#include "outbox/relay/stream_mode.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/sql/sql_store.hpp"
#include "outbox/transaction.hpp"

namespace outbox::relay {
namespace {

// poller.wakeup = "adaptive": the first wait after a cycle that found work. Doubling back to a
// 500 ms interval takes 6 cycles, so an idle relay costs little more than plain polling.
constexpr std::chrono::milliseconds kAdaptiveFloor{10};

std::shared_ptr<Publisher> make_publisher(const PublisherConfig& p,
                                          std::shared_ptr<prometheus::PrometheusMetrics> metrics) {
  switch (p.type) {
    case PublisherConfig::Type::Kafka:
      return std::make_shared<kafka::KafkaPublisher>(
          kafka::KafkaPublisher::Options{.brokers = p.brokers,
                                         .properties = p.properties,
                                         .delivery_timeout = p.delivery_timeout});
    case PublisherConfig::Type::Http: {
      return std::make_shared<http::HttpPublisher>(http::HttpPublisher::Options{
          .mode = p.batch ? http::HttpPublisher::Mode::Batch : http::HttpPublisher::Mode::Webhook,
          .max_batch = p.batch_size,
          .bearer_token = p.bearer_token,
          .connect_timeout = p.connect_timeout,
          .request_timeout = p.request_timeout,
          .hmac_secret = p.hmac_secret,
          .signature_header = p.signature_header,
          .headers = p.headers});
    }
    case PublisherConfig::Type::Log:
      return std::make_shared<LogPublisher>(p.path);
    case PublisherConfig::Type::Statistics:
      return std::make_shared<StatisticsPublisher>(p.name, p.log_interval, std::move(metrics));
  }
  throw std::invalid_argument("unknown publisher type");
}

bool is_loopback(const std::string& host) {
  return host == "localhost" || host == "::1" || host.rfind("127.", 0) == 0;
}

std::string default_owner() {
  char host[256] = "";
  gethostname(host, sizeof host - 1);
  // The random part keeps two containers apart that share a host name and both run as PID 1:
  // with equal owners each would renew and mark the other's claims.
  // Printable ASCII without spaces: the owner is also the lease owner in standby mode.
  std::string name = std::string(host[0] ? host : "relay").substr(0, 64);
  for (char& c : name) {
    if (c < 0x21 || c > 0x7e) {
      c = '_';
    }
  }
  return name + "-" + std::to_string(getpid()) + "-" + new_ulid().substr(16);
}

// Rows of a table only subscriptions read stay NEW: they go by age, once every live
// subscription has read them.
class StreamOnlyPurger final : public sql::SqlAgeBasedPurger {
 public:
  StreamOnlyPurger(const sql::Dialect& dialect, std::string table)
      : SqlAgeBasedPurger(dialect, std::move(table)) {}
};

// Throws StoreError naming the table when it is missing or older than schema version 5.
void check_table(sql::Connection& conn, OutboxStore& store, const std::string& table) {
  try {
    store.oldest_pending(conn);  // cheap (indexed) proof that the table is there
    // and that it has the columns of schema version 5 (every read selects them).
    conn.query("SELECT tags, stream_seq, message_group, partition_no FROM " + table +
               " WHERE 1 = 0");
  } catch (const StoreError& e) {
    throw StoreError("outbox table '" + table + "' is not usable (run `outbox migrate --table " +
                         table + "` first?): " + e.what(),
                     e.sqlstate());
  }
}

// One outbox table the relay delivers: the routes that name it, its store, its message groups
// (their partitions leased in the table's own lease table) and its Outbox.
struct Drain {
  std::string table;
  std::vector<RouteConfig> routes;
  std::shared_ptr<OutboxStore> store;
  std::shared_ptr<GroupStore> groups;
  std::shared_ptr<internal::TableMetrics> metrics;
  std::shared_ptr<LeaseManager> group_leases;  // none in standby or ordered mode or groups off
  std::unique_ptr<Outbox> outbox;
};

}  // namespace

struct Relay::Impl {
  RelayConfig config;
  std::shared_ptr<sql::ConnectionPool> pool;
  std::shared_ptr<OutboxStore> store;  // database.table: status, readiness, subscriptions
  std::shared_ptr<GroupStore> groups;  // database.table's message groups, for status
  std::shared_ptr<prometheus::PrometheusMetrics> metrics =
      std::make_shared<prometheus::PrometheusMetrics>();
  std::shared_ptr<internal::TableGauges> gauges = std::make_shared<internal::TableGauges>(metrics);
  std::map<std::string, std::shared_ptr<Publisher>> publishers;
  std::shared_ptr<PublishSpanHook> spans;
  std::string owner;                                   // claims (active) or the lease (standby)
  std::shared_ptr<LeaseStore> lease_store;             // database.table's lease table
  std::shared_ptr<LeaseManager> leases;                // standby mode
  std::vector<std::unique_ptr<Drain>> drains;          // one per table [[routes]] name
  std::shared_ptr<LeaseManager> stream_leases;         // subscriptions: `leases` in standby mode
  std::unique_ptr<StreamMode> stream_mode;             // none without [[subscriptions]]
  std::unique_ptr<OutboxPurgeScheduler> stream_purge;  // purge without [[routes]]
  std::unique_ptr<AdminServer> admin;
  const sql::Engine* engine = nullptr;                                    // database.url's
  RelayConfig::Poller::Wakeup wakeup = RelayConfig::Poller::Wakeup::Off;  // poller.wakeup resolved
  std::mutex lifecycle_mutex;  // guards started/stopped transitions
  bool started = false, stopped = false;

  std::shared_ptr<LeaseManager> make_leases(std::shared_ptr<LeaseStore> store,
                                            std::shared_ptr<MetricsExporter> exporter) const {
    return std::make_shared<LeaseManager>(
        LeaseManager::Options{.connection_provider = pool,
                              .store = std::move(store),
                              .owner = owner,
                              .ttl = config.relay.lease_ttl,
                              .renew_interval = config.relay.lease_renew,
                              .metrics = std::move(exporter)});
  }

  // The drains in the order the routes first name their tables.
  void make_drains(sql::Connection& conn) {
    for (const auto& route : config.routes) {
      auto it = std::find_if(drains.begin(), drains.end(),
                             [&](const auto& d) { return d->table == route.table; });
      if (it == drains.end()) {
        auto d = std::make_unique<Drain>();
        d->table = route.table;
        d->metrics = std::make_shared<internal::TableMetrics>(
            gauges, route.table == config.database.table ? "" : route.table + "/");
        sql::StoreOptions store_options{.table = route.table};
        if (leases) {
          store_options.fence = leases->fence("leader");
          store_options.fence_table = config.database.table;  // where the lease "leader" is
        }
        d->store = engine_for(conn.dialect()).make_store(store_options);
        check_table(conn, *d->store, d->table);
        // database.table's store is made already: made again, it said its warnings twice.
        d->groups = groups && d->table == config.database.table
                        ? groups
                        : detect_group_store(conn, d->table);
        if (config.groups.enabled && !config.relay.standby && !config.dispatcher.ordered) {
          auto lease_table = detect_lease_store(conn, d->table);
          try {  // its side tables too: without them its groups would never move
            lease_table->find(conn, partition_lease_name(0));
            d->groups->stats(conn);
          } catch (const StoreError& e) {
            throw StoreError("the lease or group-block table of '" + d->table +
                                 "' is not usable (run `outbox migrate --table " + d->table +
                                 "`?): " + e.what(),
                             e.sqlstate());
          }
          d->group_leases = make_leases(std::move(lease_table), d->metrics);
        }
        drains.push_back(std::move(d));
        it = drains.end() - 1;
      }
      (*it)->routes.push_back(route);
    }
  }

  void build_outbox(Drain& d) {
    Outbox::Options o{
        .connection_provider = pool,
        .tx_context = std::make_shared<ThreadLocalTxContext>(),  // the relay never writes
        .store = d.store,
        .listeners = internal::make_routing_registry(d.routes, config.publishers, publishers,
                                                     metrics, spans),
        .metrics = d.metrics,
        .dispatcher = {.retry_policy = std::make_shared<ExponentialBackoffRetryPolicy>(
                           config.dispatcher.backoff_base, config.dispatcher.backoff_max),
                       .max_attempts = config.dispatcher.max_attempts,
                       .worker_count = config.dispatcher.workers,
                       .hot_queue_capacity = 1,
                       .cold_queue_capacity = config.dispatcher.queue,
                       .drain_timeout = config.dispatcher.drain_timeout,
                       .max_batch_size = static_cast<std::size_t>(config.dispatcher.batch)},
        .poller = {.batch_size = config.poller.batch, .interval = config.poller.interval},
    };
    o.poller.change_watcher = change_watcher(d.table);
    if (wakeup == RelayConfig::Poller::Wakeup::Adaptive) {
      o.poller.adaptive_floor = std::min(kAdaptiveFloor, config.poller.interval);
    }
    if (config.purge.enabled) {
      auto conn = pool->acquire();
      o.purge.purger = detect_purger(*conn, d.table);
      o.purge.retention = std::chrono::duration_cast<std::chrono::seconds>(config.purge.retention);
      o.purge.interval = config.purge.interval;
    }
    if (leases) {
      // stop() closes the first table's Outbox last: it alone hands the lease over, once every
      // table has drained (an earlier release would refuse the others' last status writes).
      o.lease = Outbox::Lease{.manager = leases, .release_on_close = &d == drains.front().get()};
    }
    if (config.dispatcher.ordered) {
      d.outbox = std::make_unique<Outbox>(Outbox::ordered(std::move(o)));
    } else if (leases) {
      d.outbox = std::make_unique<Outbox>(Outbox::single_node(std::move(o)));
    } else {
      o.claim_locking = ClaimLocking{.owner = owner, .lock_timeout = config.poller.lock_expiry};
      if (d.group_leases) {
        o.groups = Outbox::Groups{
            .leases = d.group_leases,
            .store = d.groups,
            .max_concurrent_groups = static_cast<std::size_t>(config.groups.max_concurrent_groups),
            .per_group = config.groups.per_group,
            .on_failure = failure_policies(d.routes)};
      }
      d.outbox = std::make_unique<Outbox>(Outbox::multi_node(std::move(o)));
    }
  }

  // poller.wakeup for this engine: Auto becomes what the engine has; one it lacks is refused.
  void resolve_wakeup() {
    using W = RelayConfig::Poller::Wakeup;
    const bool postgres = engine->name == "postgres", sqlite = engine->name == "sqlite";
    wakeup = config.poller.wakeup;
    if (wakeup == W::Auto) {
      wakeup = postgres ? W::Listen : sqlite ? W::DataVersion : W::Adaptive;
    }
    if ((wakeup == W::Listen && !postgres) || (wakeup == W::DataVersion && !sqlite)) {
      throw ConfigError(
          std::string("poller.wakeup = \"") +
          (wakeup == W::Listen ? "listen\" needs PostgreSQL" : "data_version\" needs SQLite") +
          "; this database is " + std::string(engine->name) +
          " (use \"auto\", \"adaptive\" or \"off\")");
    }
  }

  // A watcher of `table` when poller.wakeup asks for one (each poller and the subscriptions get
  // their own: a watcher wakes one component).
  std::unique_ptr<ChangeWatcher> change_watcher(const std::string& table) const {
    using W = RelayConfig::Poller::Wakeup;
    if ((wakeup != W::Listen && wakeup != W::DataVersion) || !engine->make_change_watcher) {
      return nullptr;
    }
    return engine->make_change_watcher(
        config.database.url, table,
        sql::NetworkTimeouts{.connect = config.database.connect_timeout,
                             .keepalive_idle = config.database.keepalive_idle,
                             .io = config.database.io_timeout});
  }

  bool delivers_groups() const {
    return std::any_of(drains.begin(), drains.end(),
                       [](const auto& d) { return d->group_leases != nullptr; });
  }

  // Read when scraped: blocked groups from the tables, the rest from this process.
  void refresh_group_gauges() {
    try {
      auto conn = pool->acquire();
      const auto now = Clock::system()->now();
      std::int64_t blocked = 0, active = 0, held = 0;
      double oldest = 0.0;
      for (const auto& d : drains) {
        if (!d->group_leases) {
          continue;
        }
        const auto stats = d->groups->stats(*conn);
        blocked += stats.blocked;
        if (stats.oldest_blocked_at) {
          oldest = std::max(oldest,
                            std::chrono::duration<double>(now - *stats.oldest_blocked_at).count());
        }
        for (int p = 0; p < kMessageGroupPartitions; ++p) {
          held += d->group_leases->token(partition_lease_name(p)) ? 1 : 0;
        }
        const auto* dispatcher = d->outbox ? d->outbox->dispatcher() : nullptr;
        active += dispatcher ? static_cast<std::int64_t>(dispatcher->active_groups()) : 0;
      }
      metrics->record_groups(blocked, oldest, active, held);
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("message group gauges: ") + e.what());
    }
  }

  // The policy of the route an event takes (block when none matches: the event goes DEAD as
  // unroutable before any policy applies).
  static std::function<GroupFailurePolicy(const EventEnvelope&)> failure_policies(
      const std::vector<RouteConfig>& routes) {
    auto router = std::make_shared<Router>(routes);
    return [router](const EventEnvelope& e) {
      const auto route = router->match(e.aggregate_type(), e.event_type());
      return route ? parse_group_failure_policy(router->routes()[*route].on_failure)
                   : GroupFailurePolicy::Block;
    };
  }

  std::string table_names() const {
    std::string names = config.database.table;
    for (const auto& d : drains) {
      if (d->table != config.database.table) {
        names += ", " + d->table;
      }
    }
    return names;
  }

  // Table names as SQLite and PostgreSQL take them: in any case (the configuration refuses two
  // spellings of one name).
  static bool same_table(std::string_view a, std::string_view b) {
    return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
             return std::tolower(static_cast<unsigned char>(x)) ==
                    std::tolower(static_cast<unsigned char>(y));
           });
  }

  // The store of a table this relay knows (empty: database.table). Throws std::invalid_argument.
  std::shared_ptr<OutboxStore> store_of(const std::string& table) const {
    if (table.empty() || same_table(table, config.database.table)) {
      return store;
    }
    for (const auto& d : drains) {
      if (same_table(d->table, table)) {
        return d->store;
      }
    }
    throw std::invalid_argument("this relay does not deliver table '" + table.substr(0, 100) +
                                "' (its tables: " + table_names() + ")");
  }

  // The drain delivering message groups of `table` (empty: database.table). Throws
  // std::invalid_argument.
  Drain& group_drain(const std::string& table) const {
    const std::string& name = table.empty() ? config.database.table : table;
    for (const auto& d : drains) {
      if (same_table(d->table, name) && d->group_leases) {
        return *d;
      }
    }
    std::string names;
    for (const auto& d : drains) {
      if (d->group_leases) {
        names += (names.empty() ? "" : ", ") + d->table;
      }
    }
    throw std::invalid_argument("this relay delivers no message groups of table '" +
                                name.substr(0, 100) + "' (use ?table=" + names + ")");
  }

  // This relay as the status report shows it: mode, routes, publishers and their health.
  StatusReport::RelayView relay_view() const {
    StatusReport::RelayView v{
        .mode = leases ? "standby" : "active",
        .owner = owner,
        .leader = leases && leases->token("leader").has_value(),
        .alert_oldest_pending =
            std::chrono::duration_cast<std::chrono::seconds>(config.admin.alert_oldest_pending)};
    for (const auto& r : config.routes) {
      v.routes.push_back({r.table.empty() ? config.database.table : r.table, r.event_type,
                          r.aggregate_type, r.publisher, r.target});
    }
    for (const auto& p : config.publishers) {
      static constexpr const char* kTypes[] = {"kafka", "http", "log", "statistics"};
      const auto it = publishers.find(p.name);
      v.publishers.push_back({p.name, kTypes[static_cast<int>(p.type)],
                              it == publishers.end() || it->second->is_healthy()});
    }
    return v;
  }

  void build_admin() {
    AdminHandlers h;
    // Probed every few seconds: reads no row (the oldest pending grouped row is found by walking
    // the created_at index past every older DONE row: 16 ms per 100,000 on PostgreSQL).
    h.check_ready = [this] {
      auto conn = pool->acquire();
      std::vector<std::string> tables{config.database.table};
      for (const auto& d : drains) {
        tables.push_back(d->table);
      }
      for (const auto& table : tables) {
        try {
          conn->query("SELECT event_id FROM " + table + " WHERE 1 = 0");
        } catch (const StoreError& e) {
          throw StoreError("table " + table + ": " + e.what(), e.sqlstate());
        }
      }
    };
    h.metrics = [this] {
      if (delivers_groups()) {
        refresh_group_gauges();
      }
      return metrics->serialize();
    };
    h.status_json = [this] {
      auto conn = pool->acquire();
      const auto now = Clock::system()->now();
      auto report = read_status(*conn, *store, now, lease_store.get(), groups.get());
      report.relay = relay_view();
      if (stream_mode) {
        report.stream = stream_mode->report();
      }
      const bool several = std::any_of(drains.begin(), drains.end(), [this](const auto& d) {
        return d->table != config.database.table;
      });
      for (const auto& d : drains) {
        if (!several) {
          break;
        }
        StatusReport table;
        try {
          table = read_status(*conn, *d->store, now, nullptr, d->groups.get());
        } catch (const StoreError& e) {  // the other tables are still worth showing
          table.error = e.what();
        }
        report.tables.push_back({d->table, std::move(table)});
      }
      return to_json(report);
    };
    h.dead_json = [this](const std::string& table, std::optional<std::string> type,
                         std::optional<std::string> aggregate, int limit) {
      std::optional<std::string_view> t, a;
      if (type)
        t = *type;
      if (aggregate)
        a = *aggregate;
      return dead_to_json(DeadEventManager(pool, store_of(table)).query(t, a, limit, false));
    };
    h.replay = [this](const std::string& table, const std::string& id) {
      if (!table.empty()) {
        return DeadEventManager(pool, store_of(table)).replay(id) ? 1 : 0;
      }
      // Without a table: in every table where an event of that id is DEAD.
      int replayed = DeadEventManager(pool, store).replay(id) ? 1 : 0;
      for (const auto& d : drains) {
        if (!same_table(d->table, config.database.table) &&
            DeadEventManager(pool, d->store).replay(id)) {
          ++replayed;
        }
      }
      return replayed;
    };
    h.dead_groups_json = [this](const std::string& table, int limit, int top) {
      auto store = store_of(table);
      DeadEventManager manager(pool, store);
      return dead_groups_to_json(
          read_dead_groups(manager, *store, *pool, limit, static_cast<std::size_t>(top)));
    };
    h.dead_group_action = [this](const std::string& table, const std::string& fingerprint,
                                 const std::string& action) -> std::optional<std::string> {
      DeadEventManager manager(pool, store_of(table));
      const auto result = action == "replay" ? manager.replay_group(fingerprint)
                                             : manager.discard_group(fingerprint);
      if (result.changed == 0 && result.skipped == 0) {
        return std::nullopt;
      }
      return group_action_to_json(fingerprint, action, result);
    };
    if (stream_mode) {
      h.subscriptions_json = [this](const std::string& name) -> std::optional<std::string> {
        if (name.empty()) {
          return to_json(stream_mode->report());
        }
        auto report = stream_mode->report(name);
        if (report.subscriptions.empty()) {
          return std::nullopt;
        }
        return to_json(report.subscriptions.front(), Clock::system()->now());
      };
      h.subscription_action = [this](const std::string& name, const std::string& action,
                                     std::optional<std::string> to) -> std::optional<std::string> {
        auto r = stream_mode->act(name, action, std::move(to));
        if (!r) {
          return std::nullopt;
        }
        return to_json(*r, Clock::system()->now());
      };
    }
    if (delivers_groups()) {
      h.groups_json = [this](const std::string& table,
                             const std::string& group) -> std::optional<std::string> {
        auto& d = group_drain(table);
        auto conn = pool->acquire();
        const auto now = Clock::system()->now();
        if (group.empty()) {
          return groups_to_json(d.groups->list(*conn, 1000), d.groups->stats(*conn), now);
        }
        const auto info = d.groups->find(*conn, group);
        return info ? std::optional<std::string>(group_to_json(*info, now)) : std::nullopt;
      };
      h.group_action = [this](const std::string& table, const std::string& group,
                              const std::string& action) -> std::optional<std::string> {
        auto& d = group_drain(table);
        auto conn = pool->acquire();
        const auto done = apply_group_action(*d.groups, *conn, group, parse_group_action(action));
        if (!done) {
          return std::nullopt;
        }
        std::string out = "{\"table\":";
        append_json_string(out, d.table);
        out += ",\"group\":";
        append_json_string(out, group);
        out += ",\"action\":";
        append_json_string(out, action);
        out += ",\"result\":";
        append_json_string(out, *done);
        return out + "}";
      };
    }
    admin = std::make_unique<AdminServer>(config.admin.host, config.admin.port, config.admin.token,
                                          std::move(h));
  }
};

Relay::Relay(RelayConfig config, std::shared_ptr<PublishSpanHook> spans)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = std::move(config);
  impl_->spans = std::move(spans);
  auto& c = impl_->config;
  for (auto& route : c.routes) {
    if (route.table.empty()) {  // a RelayConfig built in code, not read by parse_config
      route.table = c.database.table;
    }
  }
  // Workers write statuses, the poller claims, the DONE flusher and admin requests read.
  impl_->pool = open_pool(c.database.url, static_cast<std::size_t>(c.database.pool_size), false,
                          sql::NetworkTimeouts{.connect = c.database.connect_timeout,
                                               .keepalive_idle = c.database.keepalive_idle,
                                               .io = c.database.io_timeout});
  impl_->owner = c.poller.owner.empty() ? default_owner() : c.poller.owner;
  {
    auto conn = impl_->pool->acquire();
    impl_->lease_store = detect_lease_store(*conn, c.database.table);
    sql::StoreOptions store_options{.table = c.database.table};
    if (c.relay.standby) {
      impl_->leases = impl_->make_leases(impl_->lease_store, impl_->metrics);
      store_options.fence = impl_->leases->fence("leader");
    }
    impl_->engine = &engine_for(conn->dialect());
    impl_->resolve_wakeup();
    impl_->store = impl_->engine->make_store(store_options);
    check_table(*conn, *impl_->store, c.database.table);
    if (impl_->leases) {
      try {
        impl_->lease_store->find(*conn, "leader");  // its lease table (schema version 3)
      } catch (const StoreError& e) {
        throw StoreError("the lease table of '" + c.database.table +
                             "' is not usable (run `outbox migrate` first?): " + e.what(),
                         e.sqlstate());
      }
    }
    impl_->groups = detect_group_store(*conn, c.database.table);
    impl_->make_drains(*conn);
  }
  for (const auto& p : c.publishers) {
    try {
      impl_->publishers[p.name] = make_publisher(p, impl_->metrics);
    } catch (const std::invalid_argument& e) {
      throw ConfigError("publishers." + p.name + ": " + e.what());
    }
  }
  for (auto& d : impl_->drains) {
    impl_->build_outbox(*d);
  }
  const bool routes_on_main = std::any_of(
      c.routes.begin(), c.routes.end(), [&](const auto& r) { return r.table == c.database.table; });
  if (!routes_on_main && c.purge.enabled) {
    auto conn = impl_->pool->acquire();
    if (!c.purge.include_pending) {
      log(LogLevel::Warning,
          "purge.enabled without [[routes]] on " + c.database.table +
              " deletes only its DONE and DEAD rows: rows only subscriptions read stay NEW; set "
              "purge.include_pending = true when no process delivers this table in claim mode");
    }
    impl_->stream_purge = std::make_unique<OutboxPurgeScheduler>(OutboxPurgeScheduler::Options{
        .connection_provider = impl_->pool,
        .purger = c.purge.include_pending
                      ? std::shared_ptr<EventPurger>(std::make_shared<StreamOnlyPurger>(
                            engine_for(conn->dialect()).dialect(), c.database.table))
                      : detect_purger(*conn, c.database.table),
        .retention = std::chrono::duration_cast<std::chrono::seconds>(c.purge.retention),
        .interval = c.purge.interval});
  }
  if (!c.subscriptions.empty()) {
    auto conn = impl_->pool->acquire();
    // One lease manager per lease table: the subscriptions' leases are in database.table's.
    std::shared_ptr<LeaseManager> same_table;
    for (const auto& d : impl_->drains) {
      if (d->table == c.database.table) {
        same_table = d->group_leases;
      }
    }
    impl_->stream_leases = impl_->leases ? impl_->leases
                           : same_table  ? same_table
                                         : impl_->make_leases(impl_->lease_store, impl_->metrics);
    impl_->stream_mode =
        std::make_unique<StreamMode>(c, impl_->pool, detect_stream_store(*conn, c.database.table),
                                     impl_->lease_store, impl_->stream_leases, impl_->publishers,
                                     impl_->metrics, impl_->change_watcher(c.database.table));
  }
  if (c.admin.enabled) {
    impl_->build_admin();
    if (c.admin.token.empty() && !is_loopback(c.admin.host)) {
      log(LogLevel::Warning, "admin.host " + c.admin.host +
                                 " is reachable from other machines and admin.token is not set: "
                                 "anyone who reaches it can read /api/status and /api/dead");
    }
  }
}

Relay::~Relay() {
  if (impl_) {
    stop();
  }
}
Relay::Relay(Relay&&) noexcept = default;
Relay& Relay::operator=(Relay&&) noexcept = default;

void Relay::start() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  if (impl_->started || impl_->stopped) {
    return;
  }
  impl_->started = true;
  if (impl_->admin) {
    impl_->admin->start();
  }
  // Subscriptions first: a new one must exist (and hold its rows) before any purge runs.
  if (impl_->stream_mode) {
    impl_->stream_leases->start();
    impl_->stream_mode->start();
  }
  for (auto& d : impl_->drains) {
    d->outbox->start();
  }
  if (impl_->stream_purge) {
    impl_->stream_purge->start();
  }
  log(LogLevel::Info,
      "relay started: " + std::to_string(impl_->config.routes.size()) + " routes" +
          (impl_->drains.size() > 1 ? " over " + std::to_string(impl_->drains.size()) + " tables"
                                    : std::string()) +
          ", " + std::to_string(impl_->config.subscriptions.size()) + " subscriptions, " +
          std::to_string(impl_->publishers.size()) + " publishers" +
          (impl_->admin ? ", admin on " + impl_->config.admin.host + ":" +
                              std::to_string(impl_->admin->port())
                        : std::string()));
}

void Relay::stop() {
  std::lock_guard lock(impl_->lifecycle_mutex);
  if (impl_->stopped) {
    return;
  }
  impl_->stopped = true;
  // drain_timeout bounds the whole drain: publishes still running when it passes are cancelled
  // (their events are retried by the next relay), so a stalled receiver cannot hold the stop.
  std::mutex watchdog_mutex;
  std::condition_variable watchdog_wake;
  bool closed = false;
  std::thread watchdog([&] {
    std::unique_lock lock(watchdog_mutex);
    if (!watchdog_wake.wait_for(lock, impl_->config.dispatcher.drain_timeout,
                                [&] { return closed; })) {
      log(LogLevel::Warning,
          "dispatcher.drain_timeout passed: cancelling publishes still in progress");
      for (auto& [name, publisher] : impl_->publishers) {
        publisher->cancel();
      }
    }
  });
  if (impl_->stream_purge) {
    impl_->stream_purge->close();
  }
  if (impl_->stream_mode) {
    impl_->stream_mode->close();  // after the batches in progress; hands the leases back
  }
  // Every table stops taking work at once; then each dispatcher drains, the first table's last
  // (it hands over the standby lease).
  for (auto& d : impl_->drains) {
    d->outbox->stop_polling();
  }
  for (auto it = impl_->drains.rbegin(); it != impl_->drains.rend(); ++it) {
    (*it)->outbox->close();
  }
  if (impl_->stream_leases && impl_->stream_leases != impl_->leases) {
    impl_->stream_leases->close();
  }
  for (auto& d : impl_->drains) {
    if (d->group_leases && d->group_leases != impl_->stream_leases) {
      d->group_leases->close();
    }
  }
  {
    std::lock_guard lock(watchdog_mutex);
    closed = true;
  }
  watchdog_wake.notify_all();
  watchdog.join();
  if (impl_->admin) {
    impl_->admin->stop();
  }
  // The listeners own the last references to the publishers: Kafka flushes here.
  impl_->drains.clear();
  impl_->stream_mode.reset();
  impl_->publishers.clear();
  log(LogLevel::Info, "relay stopped");
}

int Relay::admin_port() const {
  return impl_->admin ? impl_->admin->port() : 0;
}

prometheus::PrometheusMetrics& Relay::metrics() {
  return *impl_->metrics;
}

}  // namespace outbox::relay
