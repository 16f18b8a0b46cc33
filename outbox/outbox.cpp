#include "outbox/outbox.hpp"

#include <mutex>
#include <stdexcept>
#include <string>

#include "outbox/dispatcher.hpp"
#include "outbox/dispatcher_writer_hook.hpp"
#include "outbox/internal/group_partitions.hpp"
#include "outbox/internal/writer_hook_chain.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/purge.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"
#include "outbox/tx_context.hpp"

namespace outbox {

struct Outbox::ClaimRelease {
  std::shared_ptr<sql::ConnectionProvider> provider;
  std::shared_ptr<OutboxStore> store;
  std::string owner;
  std::once_flag once;

  void run() {
    std::call_once(once, [this] {
      try {
        auto conn = provider->acquire();
        const int freed = store->release_claims(*conn, owner);
        if (freed > 0) {
          log(LogLevel::Info, "released " + std::to_string(freed) + " claimed events of " + owner);
        }
      } catch (const std::exception& e) {  // the claims then expire after the lock timeout
        log(LogLevel::Warning,
            std::string("could not release claims of ") + owner + ": " + e.what());
      }
    });
  }
};

// The lease an Outbox acts under: kept from start(), released by close() once the dispatcher has
// drained, so a standby takes over at once. The poller is reached through a link close() cuts,
// since the manager (and its listener) may outlive this Outbox.
struct Outbox::LeaseLink {
  struct Poller {
    std::mutex mutex;
    OutboxPoller* poller = nullptr;
  };
  std::shared_ptr<LeaseManager> manager;
  std::string name;
  std::shared_ptr<Poller> poller;
  bool started = false;
  bool release = true;
  std::once_flag once;

  void close() {
    std::call_once(once, [this] {
      {
        std::lock_guard lock(poller->mutex);
        poller->poller = nullptr;
      }
      if (!started || !release) {
        return;
      }
      try {
        manager->release(name);
      } catch (const std::exception& e) {  // it then expires after its ttl
        log(LogLevel::Warning, "could not release lease '" + name + "': " + e.what());
      }
    });
  }
};

namespace {

std::function<bool()> holds_lease(const Outbox::Lease& lease) {
  return [manager = lease.manager, name = lease.name] { return manager->token(name).has_value(); };
}

}  // namespace

Outbox Outbox::single_node(Options options) {
  return build(std::move(options), Mode::SingleNode);
}
Outbox Outbox::multi_node(Options options) {
  return build(std::move(options), Mode::MultiNode);
}
Outbox Outbox::ordered(Options options) {
  return build(std::move(options), Mode::Ordered);
}
Outbox Outbox::writer_only(Options options) {
  return build(std::move(options), Mode::WriterOnly);
}

Outbox::Outbox(Outbox&&) noexcept = default;

Outbox& Outbox::operator=(Outbox&& other) noexcept {
  if (this != &other) {
    close();
    dispatcher_ = std::move(other.dispatcher_);
    poller_ = std::move(other.poller_);
    purge_ = std::move(other.purge_);
    writer_ = std::move(other.writer_);
    claim_release_ = std::move(other.claim_release_);
    lease_ = std::move(other.lease_);
    groups_ = std::move(other.groups_);
  }
  return *this;
}

Outbox::~Outbox() {
  close();
}

void Outbox::stop_polling() {
  if (purge_) {
    purge_->close();
  }
  if (poller_) {
    poller_->close();
  }
  if (groups_) {
    groups_->stop();
  }
}

void Outbox::close() {
  stop_polling();
  if (dispatcher_) {
    dispatcher_->close();
  }
  if (groups_) {
    groups_->release_all();  // after the drain: nothing of a partition is in flight here any more
  }
  if (claim_release_) {
    claim_release_->run();
  }
  if (lease_) {
    lease_->close();
  }
}

namespace {

// A field Outbox fills must be left unset in the nested options, so no setting is silently lost.
void require_unset(bool is_set, const char* field, const char* instead) {
  if (is_set) {
    throw std::invalid_argument(std::string("Outbox: leave ") + field + " unset; set " + instead +
                                " instead");
  }
}

void require_unset_filled_fields(const Outbox::Options& o) {
  const auto& d = o.dispatcher;
  require_unset(d.connection_provider != nullptr, "dispatcher.connection_provider",
                "connection_provider");
  require_unset(d.store != nullptr, "dispatcher.store", "store");
  require_unset(d.listeners != nullptr, "dispatcher.listeners", "listeners");
  require_unset(d.metrics != nullptr, "dispatcher.metrics", "metrics");
  require_unset(d.clock != nullptr, "dispatcher.clock", "clock");
  require_unset(!d.claim_owner.empty(), "dispatcher.claim_owner", "claim_locking");
  require_unset(d.claim_timeout.count() != 0, "dispatcher.claim_timeout", "claim_locking");
  require_unset(d.ordered, "dispatcher.ordered", "Outbox::ordered()");
  require_unset(o.lease && d.active, "dispatcher.active", "lease");
  require_unset(d.max_concurrent_groups != 0 || d.partition_lease || d.group_store ||
                    d.group_failure_policy || d.group_ended,
                "dispatcher's message-group fields", "groups");
  const auto& p = o.poller;
  require_unset(p.connection_provider != nullptr, "poller.connection_provider",
                "connection_provider");
  require_unset(p.store != nullptr, "poller.store", "store");
  require_unset(p.handler != nullptr, "poller.handler", "listeners");
  require_unset(p.metrics != nullptr, "poller.metrics", "metrics");
  require_unset(p.claim_locking.has_value(), "poller.claim_locking", "claim_locking");
  require_unset(p.clock != nullptr, "poller.clock", "clock");
  require_unset(o.lease && p.active, "poller.active", "lease");
  require_unset(static_cast<bool>(p.claim_groups), "poller.claim_groups", "groups");
  require_unset(o.purge.connection_provider != nullptr, "purge.connection_provider",
                "connection_provider");
  require_unset(o.purge.clock != nullptr, "purge.clock", "clock");
}

void require_valid_forced(const Outbox::Options& o) {
  if (o.dispatcher.worker_count < 1) {
    throw std::invalid_argument(
        "Outbox::ordered: dispatcher.worker_count must be >= 1 (it runs 1)");
  }
  if (o.dispatcher.max_attempts < 1) {
    throw std::invalid_argument(
        "Outbox::ordered: dispatcher.max_attempts must be >= 1 (it makes 1)");
  }
  if (o.dispatcher.max_batch_size < 1) {
    throw std::invalid_argument(
        "Outbox::ordered: dispatcher.max_batch_size must be >= 1 (it takes 1)");
  }
  if (o.poller.head_rescan_interval.count() < 0) {
    throw std::invalid_argument(
        "Outbox::ordered: poller.head_rescan_interval must be >= 0 (it rescans every cycle)");
  }
}

void validate_lease_gate(const Outbox::Options& o, bool single_or_ordered) {
  if (!single_or_ordered) {
    throw std::invalid_argument(
        "Outbox: lease is for single_node and ordered modes (multi_node spreads work by claims; "
        "writer_only delivers nothing)");
  }
  if (!o.lease->manager) {
    throw std::invalid_argument("Outbox: lease.manager is required");
  }
  validate_lease_name(o.lease->name);
  if (o.store->fence() == nullptr || !o.store->fence()->is_for(*o.lease->manager, o.lease->name)) {
    throw std::invalid_argument(
        "Outbox: with a lease the store's status writes must be fenced on it "
        "(StoreOptions::fence = lease.manager->fence(lease.name))");
  }
}

}  // namespace

Outbox Outbox::build(Options o, Mode mode) {
  require_unset_filled_fields(o);
  if (!o.tx_context) {
    throw std::invalid_argument("Outbox: tx_context is required");
  }
  if (!o.store) {
    throw std::invalid_argument("Outbox: store is required");
  }
  for (const auto& hook : o.writer_hooks) {
    if (!hook) {
      throw std::invalid_argument("Outbox: writer_hooks holds a null hook");
    }
  }
  if (mode != Mode::WriterOnly) {
    if (!o.connection_provider) {
      throw std::invalid_argument("Outbox: connection_provider is required");
    }
    if (!o.listeners) {
      throw std::invalid_argument("Outbox: listeners is required");
    }
  } else if (o.purge.purger && !o.connection_provider) {
    throw std::invalid_argument("Outbox: connection_provider is required when purge.purger is set");
  }
  if (mode != Mode::WriterOnly && o.purge.purger && o.purge.purger->deletes_pending()) {
    throw std::invalid_argument(
        "Outbox: purge.purger deletes rows by age whatever their status (events not yet "
        "delivered too); use a status-based purger, or writer_only mode for CDC tables");
  }
  if (mode == Mode::MultiNode) {
    if (!o.claim_locking) {
      throw std::invalid_argument("Outbox::multi_node: claim_locking is required");
    }
    if (o.claim_locking->lock_timeout.count() <= 0) {
      throw std::invalid_argument("Outbox::multi_node: claim_locking.lock_timeout must be > 0");
    }
  }
  if (o.lease) {
    validate_lease_gate(o, mode == Mode::SingleNode || mode == Mode::Ordered);
  }
  if (o.groups) {
    if (mode != Mode::MultiNode) {
      throw std::invalid_argument("Outbox: groups are for multi_node mode");
    }
    if (!o.groups->leases || !o.groups->store) {
      throw std::invalid_argument("Outbox: groups.leases and groups.store are required");
    }
    if (o.groups->max_concurrent_groups < 1) {
      throw std::invalid_argument("Outbox: groups.max_concurrent_groups must be >= 1");
    }
  }
  if (mode == Mode::Ordered) {
    if (o.claim_locking) {
      throw std::invalid_argument("Outbox::ordered: claim_locking is not supported (single node)");
    }
    // What ordered mode forces must still be a valid setting: a typo is not silently accepted.
    require_valid_forced(o);
    o.dispatcher.worker_count = 1;
    o.dispatcher.max_attempts = 1;
    // A batch would hand later events of an aggregate over before an earlier one's outcome is
    // known; a keyset page would resume past an event whose status write failed.
    o.dispatcher.max_batch_size = 1;
    o.poller.head_rescan_interval = std::chrono::milliseconds(0);
  }
  if (mode != Mode::MultiNode) {
    o.claim_locking.reset();
  } else if (o.claim_locking->owner.empty()) {
    o.claim_locking->owner = "node-" + new_ulid();  // one owner for writer and poller
  }
  if (!o.metrics) {
    o.metrics = MetricsExporter::noop();
  }
  if (!o.clock) {
    o.clock = Clock::system();
  }
  const std::string owner = o.claim_locking ? o.claim_locking->owner : std::string();

  Outbox outbox;
  if (o.groups) {
    outbox.groups_ = std::make_unique<internal::GroupPartitions>(internal::GroupPartitions::Options{
        .leases = o.groups->leases,
        .store = o.groups->store,
        .outbox_store = o.store,
        .owner = owner,
        .per_group = o.groups->per_group,
        .max_concurrent_groups = o.groups->max_concurrent_groups,
        .codec = o.poller.json_codec != nullptr ? o.poller.json_codec : &JsonCodec::default_codec(),
        .on_failure = o.groups->on_failure,
        .clock = o.clock});
  }
  std::shared_ptr<WriterHook> hook;
  if (mode != Mode::WriterOnly) {
    auto dispatcher = std::move(o.dispatcher);
    dispatcher.connection_provider = o.connection_provider;
    dispatcher.store = o.store;
    dispatcher.listeners = o.listeners;
    dispatcher.metrics = o.metrics;
    dispatcher.clock = o.clock;
    dispatcher.claim_owner = owner;
    dispatcher.claim_timeout =
        o.claim_locking ? o.claim_locking->lock_timeout : std::chrono::milliseconds(0);
    dispatcher.ordered = mode == Mode::Ordered;
    if (o.lease) {
      dispatcher.active = holds_lease(*o.lease);
    }
    if (o.groups) {
      dispatcher.max_concurrent_groups = o.groups->max_concurrent_groups;
      dispatcher.partition_lease = [groups = outbox.groups_.get()](int p) {
        return groups->lease(p);
      };
      dispatcher.group_store = o.groups->store;
      dispatcher.group_failure_policy = o.groups->on_failure;
      dispatcher.group_ended = [groups = outbox.groups_.get()] { groups->group_done(); };
    }
    outbox.dispatcher_ = std::make_unique<OutboxDispatcher>(std::move(dispatcher));
    // On failure from here on, `outbox` is destroyed, which closes the dispatcher.
    auto poller = std::move(o.poller);
    poller.connection_provider = o.connection_provider;
    poller.store = o.store;
    poller.handler = std::make_shared<DispatcherPollerHandler>(*outbox.dispatcher_);
    poller.metrics = o.metrics;
    poller.claim_locking = o.claim_locking;
    poller.clock = o.clock;
    if (o.lease) {
      poller.active = holds_lease(*o.lease);
    }
    if (o.groups) {
      poller.claim_groups = [groups = outbox.groups_.get()](sql::Connection& conn, int limit) {
        return groups->claim(conn, limit);
      };
    }
    outbox.poller_ = std::make_unique<OutboxPoller>(std::move(poller));
    if (outbox.groups_) {
      outbox.groups_->set_dispatcher(outbox.dispatcher_.get());
      outbox.groups_->set_wake([poller = outbox.poller_.get()] { poller->wake(); });
    }
    if (mode != Mode::Ordered) {
      hook = std::make_shared<DispatcherWriterHook>(*outbox.dispatcher_, o.metrics, owner);
    }
  }
  if (o.purge.purger) {
    auto purge = std::move(o.purge);
    purge.connection_provider = o.connection_provider;
    purge.clock = o.clock;
    outbox.purge_ = std::make_unique<OutboxPurgeScheduler>(std::move(purge));
  }
  if (!o.writer_hooks.empty()) {
    std::vector<std::shared_ptr<WriterHook>> hooks;
    if (hook) {
      hooks.push_back(std::move(hook));
    }
    hooks.insert(hooks.end(), o.writer_hooks.begin(), o.writer_hooks.end());
    hook = std::make_shared<internal::WriterHookChain>(std::move(hooks));
  }
  outbox.writer_ = std::make_unique<OutboxWriter>(o.tx_context, o.store, std::move(hook),
                                                  o.trace_context, o.metrics);
  // Last: nothing below can throw, so a factory that fails never releases claims (another
  // Outbox of the same owner may hold them).
  if (o.claim_locking) {
    outbox.claim_release_ = std::make_unique<ClaimRelease>();
    outbox.claim_release_->provider = o.connection_provider;
    outbox.claim_release_->store = o.store;
    outbox.claim_release_->owner = owner;
  }
  if (o.lease) {
    outbox.lease_ = std::make_unique<LeaseLink>();
    outbox.lease_->manager = o.lease->manager;
    outbox.lease_->name = o.lease->name;
    outbox.lease_->release = o.lease->release_on_close;
    outbox.lease_->poller = std::make_shared<LeaseLink::Poller>();
    outbox.lease_->poller->poller = outbox.poller_.get();
  }
  return outbox;
}

void Outbox::start() {
  // Workers first: what the poller hands over has somewhere to go.
  if (dispatcher_) {
    dispatcher_->start();
  }
  if (poller_) {
    poller_->start();
  }
  if (groups_) {
    groups_->start();
  }
  if (purge_) {
    purge_->start();
  }
  if (lease_ && !lease_->started) {
    lease_->started = true;
    // Gaining the lease starts a poll at once instead of after the interval.
    lease_->manager->add_listener(
        [name = lease_->name, link = lease_->poller](const LeaseToken& token, bool held) {
          if (held && token.name == name) {
            std::lock_guard lock(link->mutex);
            if (link->poller != nullptr) {
              link->poller->wake();
            }
          }
        });
    lease_->manager->keep(lease_->name);
    lease_->manager->start();
  }
}

}  // namespace outbox
