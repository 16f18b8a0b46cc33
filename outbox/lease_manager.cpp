#include "outbox/lease_manager.hpp"

#include <unistd.h>
#include <stdexcept>

#include "outbox/envelope.hpp"
#include "outbox/errors.hpp"
#include "outbox/internal/periodic_worker.hpp"
#include "outbox/internal/writes_first.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox {
namespace {

using SteadyClock = std::chrono::steady_clock;

std::string default_owner() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0 || host[0] == '\0') {
    std::snprintf(host, sizeof host, "host");
  }
  std::string owner;
  for (const char* c = host; *c != '\0' && owner.size() < 120; ++c) {
    owner += (*c > 0x20 && *c < 0x7f) ? *c : '_';
  }
  return owner + "-" + std::to_string(::getpid()) + "-" + new_ulid();
}

}  // namespace

class LeaseManager::Fence final : public LeaseFence {
 public:
  Fence(LeaseManager& manager, std::string name) : manager_(manager), name_(std::move(name)) {}
  std::optional<LeaseToken> token() const override { return manager_.token(name_); }
  void verify() override {
    if (auto t = manager_.token(name_)) {
      manager_.verify(*t);
    }
  }
  bool is_for(const LeaseManager& manager, std::string_view name) const override {
    return &manager == &manager_ && name == name_;
  }

 private:
  LeaseManager& manager_;
  std::string name_;
};

LeaseManager::LeaseManager(Options options) : options_(std::move(options)) {
  if (!options_.connection_provider) {
    throw std::invalid_argument("LeaseManager: connection_provider is required");
  }
  if (!options_.store) {
    throw std::invalid_argument("LeaseManager: store is required");
  }
  if (options_.owner.empty()) {
    options_.owner = default_owner();
  }
  validate_lease_name(options_.owner);
  if (options_.ttl.count() <= 0 || options_.ttl > std::chrono::hours(24)) {
    throw std::invalid_argument("LeaseManager: ttl must be > 0 and at most a day");
  }
  if (!options_.margin) {
    options_.margin = options_.ttl / 5;
  }
  if (options_.margin->count() < 0 || *options_.margin > options_.ttl / 2) {
    throw std::invalid_argument("LeaseManager: margin must be 0 … ttl / 2");
  }
  if (options_.renew_interval.count() <= 0 ||
      options_.renew_interval > (options_.ttl - *options_.margin) / 2) {
    throw std::invalid_argument(
        "LeaseManager: renew_interval must be > 0 and at most (ttl - margin) / 2, so one renewal "
        "can fail without losing the lease");
  }
  if (!options_.metrics) {
    options_.metrics = MetricsExporter::noop();
  }
  worker_ = std::make_unique<internal::PeriodicWorker>(
      "LeaseManager", [this] { tick(); }, [this] { return next_wait(); });
}

LeaseManager::~LeaseManager() {
  close();
}

template <typename Work>
auto LeaseManager::with_connection(Work&& work) {
  if (!own_ || own_->is_broken()) {
    own_.reset();
    own_ = options_.connection_provider->open_dedicated();
  }
  if (!own_) {
    auto borrowed = options_.connection_provider->acquire();
    return work(borrowed.get());
  }
  try {
    return work(*own_);
  } catch (const StoreError& e) {
    if (!e.connection_usable()) {
      own_.reset();  // opened again by the next call
    }
    throw;
  }
}

std::optional<LeaseToken> LeaseManager::try_acquire(const std::string& name) {
  validate_lease_name(name);
  std::vector<Change> changes;
  std::optional<LeaseToken> result;
  try {
    std::lock_guard db(db_mutex_);
    result = acquire_now(name, changes);
  } catch (...) {
    notify(changes);
    throw;
  }
  notify(changes);
  return result;
}

std::optional<LeaseToken> LeaseManager::acquire_now(const std::string& name,
                                                    std::vector<Change>& changes) {
  {
    std::lock_guard lock(mutex_);
    if (held_.count(name) != 0) {
      if (!renew_holding(name, changes)) {
        return std::nullopt;
      }
      return held_.at(name).token;
    }
  }
  return with_connection([&](sql::Connection& conn) -> std::optional<LeaseToken> {
    const auto before = options_.store->find(conn, name);
    const auto sent = SteadyClock::now();
    auto token = options_.store->acquire(conn, name, options_.owner, options_.ttl);
    if (!token) {
      return std::nullopt;
    }
    {
      std::lock_guard lock(mutex_);
      held_[name] =
          Holding{*token, sent + options_.ttl - *options_.margin, sent + options_.renew_interval};
    }
    const bool takeover = before && before->owner && *before->owner != options_.owner;
    options_.metrics->increment_lease_acquired(name, takeover);
    options_.metrics->record_lease(name, true, token->epoch);
    log(LogLevel::Info, "lease '" + name + "' acquired by " + options_.owner + " (epoch " +
                            std::to_string(token->epoch) +
                            (takeover ? ", taken over from " + *before->owner + ")" : ")"));
    changes.emplace_back(*token, true);
    return token;
  });
}

bool LeaseManager::renew(const std::string& name) {
  std::vector<Change> changes;
  bool renewed = false;
  try {
    std::lock_guard db(db_mutex_);
    std::lock_guard lock(mutex_);
    renewed = held_.count(name) != 0 && renew_holding(name, changes);
  } catch (...) {
    notify(changes);
    throw;
  }
  notify(changes);
  return renewed;
}

// Called with db_mutex_ and mutex_ held; releases mutex_ around the statement.
bool LeaseManager::renew_holding(const std::string& name, std::vector<Change>& changes) {
  const LeaseToken token = held_.at(name).token;
  mutex_.unlock();
  bool renewed = false;
  try {
    const auto sent = SteadyClock::now();
    renewed = with_connection(
        [&](sql::Connection& conn) { return options_.store->renew(conn, token, options_.ttl); });
    mutex_.lock();
    auto it = held_.find(name);
    if (renewed && it != held_.end() && it->second.token == token) {
      it->second.trusted_until = sent + options_.ttl - *options_.margin;
      it->second.next_renew = sent + options_.renew_interval;
      return true;
    }
  } catch (...) {
    mutex_.lock();
    throw;
  }
  if (!renewed) {
    log(LogLevel::Warning, "lease '" + name + "' (epoch " + std::to_string(token.epoch) +
                               ") could not be renewed: another owner holds it, or it expired");
    drop(name, changes, true);
  }
  return false;
}

// Called with mutex_ held.
// `name` by value: callers pass the key of the entry this erases.
void LeaseManager::drop(std::string name, std::vector<Change>& changes, bool lost) {
  auto it = held_.find(name);
  if (it == held_.end()) {
    return;
  }
  changes.emplace_back(it->second.token, false);
  held_.erase(it);
  if (lost) {
    options_.metrics->increment_lease_lost(name);
  }
  options_.metrics->record_lease(name, false, changes.back().first.epoch);
}

void LeaseManager::release(const std::string& name) {
  // The database lock first: an acquisition the thread has in flight ends before, so what it
  // took is released here instead of being kept (and renewed) after this call.
  std::lock_guard db(db_mutex_);
  std::vector<Change> changes;
  std::optional<LeaseToken> token;
  {
    std::lock_guard lock(mutex_);
    kept_.erase(name);
    if (auto it = held_.find(name); it != held_.end()) {
      token = it->second.token;
      drop(name, changes, false);
    }
  }
  notify(changes);  // stop acting first: the database may hand it over as soon as it is released
  if (token) {
    with_connection([&](sql::Connection& conn) { return options_.store->release(conn, *token); });
  }
}

std::optional<LeaseToken> LeaseManager::token(const std::string& name) const {
  std::lock_guard lock(mutex_);
  auto it = held_.find(name);
  if (it == held_.end() || SteadyClock::now() >= it->second.trusted_until) {
    return std::nullopt;
  }
  return it->second.token;
}

std::optional<LeaseInfo> LeaseManager::holder(const std::string& name) {
  validate_lease_name(name);
  std::lock_guard db(db_mutex_);
  return with_connection([&](sql::Connection& conn) { return options_.store->find(conn, name); });
}

std::vector<LeaseInfo> LeaseManager::leases() {
  std::lock_guard db(db_mutex_);
  return with_connection([&](sql::Connection& conn) { return options_.store->list(conn); });
}

void LeaseManager::keep(const std::string& name) {
  validate_lease_name(name);
  std::lock_guard lock(mutex_);
  kept_.insert(name);
}

std::shared_ptr<LeaseFence> LeaseManager::fence(const std::string& name) {
  validate_lease_name(name);
  return std::make_shared<Fence>(*this, name);
}

void LeaseManager::add_listener(Listener listener) {
  std::lock_guard lock(mutex_);
  listeners_.push_back(std::move(listener));
}

bool LeaseManager::verify(const LeaseToken& token) {
  std::vector<Change> changes;
  bool held = true;
  try {
    std::lock_guard db(db_mutex_);
    held =
        with_connection([&](sql::Connection& conn) { return options_.store->holds(conn, token); });
    if (!held) {
      std::lock_guard lock(mutex_);
      if (auto it = held_.find(token.name); it != held_.end() && it->second.token == token) {
        log(LogLevel::Warning, "lease '" + token.name + "' (epoch " + std::to_string(token.epoch) +
                                   ") is gone: a fenced write changed nothing");
        drop(token.name, changes, true);
      }
    }
  } catch (const StoreError& e) {
    // Undecided: the holding stays trusted until its deadline, as when a renewal fails.
    log(LogLevel::Warning, "lease '" + token.name + "' could not be verified: " + e.what());
  }
  notify(changes);
  return held;
}

void LeaseManager::expire_untrusted(std::vector<Change>& changes) {
  std::lock_guard lock(mutex_);
  const auto now = SteadyClock::now();
  std::vector<std::string> expired;
  for (const auto& [name, holding] : held_) {
    if (now >= holding.trusted_until) {
      expired.push_back(name);
    }
  }
  for (const auto& name : expired) {
    log(LogLevel::Warning, "lease '" + name + "' not renewed in time: no longer acting for it");
    drop(name, changes, true);
  }
}

void LeaseManager::tick() {
  const outbox::internal::WritesFirst first;  // a renewal held back past the ttl loses the lease
  std::vector<Change> changes;
  {
    std::lock_guard db(db_mutex_);
    expire_untrusted(changes);
    std::vector<std::string> due;
    std::vector<std::string> wanted;
    {
      std::lock_guard lock(mutex_);
      const auto now = SteadyClock::now();
      for (const auto& [name, holding] : held_) {
        if (now >= holding.next_renew) {
          due.push_back(name);
        }
      }
      for (const auto& name : kept_) {
        if (held_.count(name) == 0) {
          wanted.push_back(name);
        }
      }
    }
    for (const auto& name : due) {
      try {
        std::lock_guard lock(mutex_);
        if (held_.count(name) != 0) {
          renew_holding(name, changes);
        }
      } catch (const std::exception& e) {
        log(LogLevel::Warning, "lease '" + name + "' renewal failed: " + e.what());
        std::lock_guard lock(mutex_);
        if (auto it = held_.find(name); it != held_.end()) {
          // Try again soon: the holding is trusted only until its deadline.
          it->second.next_renew =
              SteadyClock::now() + std::max<std::chrono::milliseconds>(
                                       options_.renew_interval / 4, std::chrono::milliseconds(10));
        }
      }
    }
    for (const auto& name : wanted) {
      try {
        acquire_now(name, changes);
      } catch (const std::exception& e) {
        log(LogLevel::Warning, "lease '" + name + "' could not be acquired: " + e.what());
      }
    }
    expire_untrusted(changes);
  }
  notify(changes);
}

std::chrono::milliseconds LeaseManager::next_wait() const {
  std::lock_guard lock(mutex_);
  const auto now = SteadyClock::now();
  auto next = now + options_.renew_interval;
  for (const auto& [name, holding] : held_) {
    next = std::min({next, holding.next_renew, holding.trusted_until});
  }
  if (next <= now) {
    return std::chrono::milliseconds(0);
  }
  return std::chrono::ceil<std::chrono::milliseconds>(next - now);
}

void LeaseManager::notify(const std::vector<Change>& changes) {
  if (changes.empty()) {
    return;
  }
  std::vector<Listener> listeners;
  {
    std::lock_guard lock(mutex_);
    listeners = listeners_;
  }
  for (const auto& [token, held] : changes) {
    for (const auto& listener : listeners) {
      try {
        listener(token, held);
      } catch (const std::exception& e) {
        log(LogLevel::Warning, std::string("lease listener threw: ") + e.what());
      }
    }
  }
}

void LeaseManager::start() {
  {
    std::lock_guard lock(mutex_);
    if (closed_) {
      throw std::logic_error("LeaseManager: start() after close()");
    }
  }
  worker_->start();
}

void LeaseManager::close() {
  {
    std::lock_guard lock(mutex_);
    if (closed_) {
      return;
    }
    closed_ = true;
  }
  worker_->close();
  std::vector<Change> changes;
  std::vector<LeaseToken> tokens;
  {
    std::lock_guard lock(mutex_);
    kept_.clear();
    while (!held_.empty()) {
      tokens.push_back(held_.begin()->second.token);
      drop(held_.begin()->first, changes, false);
    }
  }
  notify(changes);
  std::lock_guard db(db_mutex_);
  for (const auto& token : tokens) {
    try {
      with_connection([&](sql::Connection& conn) { return options_.store->release(conn, token); });
    } catch (const std::exception& e) {
      log(LogLevel::Warning,
          "lease '" + token.name + "' not released (it expires after its ttl): " + e.what());
    }
  }
  own_.reset();
}

}  // namespace outbox
