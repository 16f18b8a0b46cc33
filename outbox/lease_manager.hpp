#pragma once
// Holds named leases for one process: acquires them when free, renews them in the background,
// knows without asking the database when a holding can no longer be trusted, and tells listeners
// when a lease is gained or lost.

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "outbox/lease.hpp"

namespace outbox {

namespace sql {
class Connection;
class ConnectionProvider;
}  // namespace sql
namespace internal {
class PeriodicWorker;
}
class MetricsExporter;
class LeaseManager;

/// What a store conditions its ownership-dependent writes on: one lease of one LeaseManager.
class LeaseFence {
 public:
  virtual ~LeaseFence() = default;
  /// The holding to condition writes on; nullopt while not held (writes are then refused).
  virtual std::optional<LeaseToken> token() const = 0;
  /// A fenced write changed fewer rows than it meant to: the holding is checked at once and, if
  /// the database no longer has it, given up (listeners learn it is lost).
  virtual void verify() = 0;
  /// True when this fence is lease `name` of `manager`.
  virtual bool is_for(const LeaseManager& manager, std::string_view name) const = 0;
};

/// Acquires, renews and releases leases for one owner through a LeaseStore. A holding is trusted
/// until (the monotonic time its last successful acquire or renew was sent) + ttl − margin, so a
/// process that cannot reach the database stops before another may take over, whatever the
/// clocks say. Nothing runs before start(); start() runs the thread that renews every held lease
/// each renew_interval and tries to take every kept one. Thread-safe.
class LeaseManager {
 public:
  struct Options {
    std::shared_ptr<sql::ConnectionProvider> connection_provider;  ///< required
    std::shared_ptr<LeaseStore> store;                             ///< required
    /// Unique per process: default "<host>-<pid>-<ulid>". Printable ASCII, no spaces.
    std::string owner;
    std::chrono::milliseconds ttl{15000};            ///< how long a holding lasts unrenewed
    std::chrono::milliseconds renew_interval{5000};  ///< > 0, at most (ttl − margin) / 2
    /// Stop trusting a holding this long before the database may hand it over. 0 … ttl / 2;
    /// default ttl / 5.
    std::optional<std::chrono::milliseconds> margin;
    std::shared_ptr<MetricsExporter> metrics;  ///< default: MetricsExporter::noop()
  };
  /// Gained (held = true, the new token) or lost (held = false, the token that ended).
  using Listener = std::function<void(const LeaseToken& token, bool held)>;

  /// Validates (std::invalid_argument naming the field). Starts no thread.
  explicit LeaseManager(Options options);
  /// Calls close().
  ~LeaseManager();
  LeaseManager(const LeaseManager&) = delete;
  LeaseManager& operator=(const LeaseManager&) = delete;

  const std::string& owner() const noexcept { return options_.owner; }
  std::chrono::milliseconds ttl() const noexcept { return options_.ttl; }

  /// Takes `name` now if it is free or expired, or renews it if this manager holds it; the token
  /// while held, nullopt while another owner holds it. Throws StoreError.
  std::optional<LeaseToken> try_acquire(const std::string& name);
  /// Renews `name` now; false (and the lease is lost) when the holding ended or none was held.
  /// Throws StoreError (the holding stays trusted until its deadline).
  bool renew(const std::string& name);
  /// Gives `name` up (another owner may take it at once) and stops keeping it. Throws StoreError.
  void release(const std::string& name);
  /// The holding of `name` while it can be trusted; nullopt otherwise. No database access.
  std::optional<LeaseToken> token(const std::string& name) const;
  /// The database's row for `name` (who holds it, epoch, since when). Throws StoreError.
  std::optional<LeaseInfo> holder(const std::string& name);
  /// Every row of the lease table. Throws StoreError.
  std::vector<LeaseInfo> leases();
  /// Keeps `name`: from start() on the thread takes it whenever it is free and renews it.
  void keep(const std::string& name);
  /// A fence on `name` for a store (LeaseFence). The manager must outlive its use.
  std::shared_ptr<LeaseFence> fence(const std::string& name);
  /// Called on the manager's thread (or the caller's, for try_acquire / renew / release) after
  /// each change. Listeners must not call back into the manager's blocking functions.
  void add_listener(Listener listener);

  /// Starts the renewing thread. Idempotent; throws std::logic_error after close().
  void start();
  /// Stops the thread and releases every held lease (errors are logged). Idempotent.
  void close();

 private:
  struct Holding {
    LeaseToken token;
    std::chrono::steady_clock::time_point trusted_until;
    std::chrono::steady_clock::time_point next_renew;
  };
  using Change = std::pair<LeaseToken, bool>;
  class Fence;

  template <typename Work>
  auto with_connection(Work&& work);
  void tick();
  std::chrono::milliseconds next_wait() const;
  bool renew_holding(const std::string& name, std::vector<Change>& changes);
  std::optional<LeaseToken> acquire_now(const std::string& name, std::vector<Change>& changes);
  void drop(std::string name, std::vector<Change>& changes, bool lost);
  void expire_untrusted(std::vector<Change>& changes);
  void notify(const std::vector<Change>& changes);
  bool verify(const LeaseToken& token);

  Options options_;
  std::mutex db_mutex_;  // one statement at a time on own_; taken before mutex_, never inside it
  std::unique_ptr<sql::Connection> own_;  // dedicated, so renewals never wait for the pool
  mutable std::mutex mutex_;              // guards held_, kept_, listeners_, closed_
  std::map<std::string, Holding, std::less<>> held_;
  std::set<std::string, std::less<>> kept_;
  std::vector<Listener> listeners_;
  bool closed_ = false;
  std::unique_ptr<internal::PeriodicWorker> worker_;  // last: stopped before the rest goes
};

}  // namespace outbox
