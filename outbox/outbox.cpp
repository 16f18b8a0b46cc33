#include "outbox/outbox.hpp"

#include <mutex>
#include <stdexcept>

#include "outbox/dispatcher.hpp"
#include "outbox/dispatcher_writer_hook.hpp"
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
  }
  return *this;
}

Outbox::~Outbox() {
  close();
}

void Outbox::close() {
  if (purge_) {
    purge_->close();
  }
  if (poller_) {
    poller_->close();
  }
  if (dispatcher_) {
    dispatcher_->close();
  }
  if (claim_release_) {
    claim_release_->run();
  }
}

Outbox Outbox::build(Options o, Mode mode) {
  if (!o.tx_context) {
    throw std::invalid_argument("Outbox: tx_context is required");
  }
  if (!o.store) {
    throw std::invalid_argument("Outbox: store is required");
  }
  if (mode != Mode::WriterOnly) {
    if (!o.connection_provider) {
      throw std::invalid_argument("Outbox: connection_provider is required");
    }
    if (!o.listeners) {
      throw std::invalid_argument("Outbox: listeners is required");
    }
  } else if (o.purger && !o.connection_provider) {
    throw std::invalid_argument("Outbox: connection_provider is required when purger is set");
  }
  if (mode != Mode::WriterOnly && o.purger && o.purger->deletes_pending()) {
    throw std::invalid_argument(
        "Outbox: purger deletes rows by age whatever their status (events not yet delivered "
        "too); use a status-based purger, or writer_only mode for CDC tables");
  }
  if (mode == Mode::MultiNode && !o.claim_locking) {
    throw std::invalid_argument("Outbox::multi_node: claim_locking is required");
  }
  if (mode == Mode::Ordered) {
    if (o.claim_locking) {
      throw std::invalid_argument("Outbox::ordered: claim_locking is not supported (single node)");
    }
    o.worker_count = 1;
    o.max_attempts = 1;
    // A batch would hand later events of an aggregate over before an earlier one's outcome is
    // known; a keyset page would resume past an event whose status write failed.
    o.max_batch_size = 1;
    o.head_rescan_interval = std::chrono::milliseconds(0);
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

  Outbox outbox;
  std::shared_ptr<WriterHook> hook;
  if (mode != Mode::WriterOnly) {
    outbox.dispatcher_ = std::make_unique<OutboxDispatcher>(OutboxDispatcher::Options{
        .connection_provider = o.connection_provider,
        .store = o.store,
        .listeners = o.listeners,
        .in_flight_tracker = o.in_flight_tracker,
        .retry_policy = o.retry_policy,
        .max_attempts = o.max_attempts,
        .worker_count = o.worker_count,
        .hot_queue_capacity = o.hot_queue_capacity,
        .cold_queue_capacity = o.cold_queue_capacity,
        .metrics = o.metrics,
        .interceptors = o.interceptors,
        .drain_timeout = o.drain_timeout,
        .done_batch_window = o.done_batch_window,
        .done_batch_max = o.done_batch_max,
        .max_batch_size = o.max_batch_size,
        .clock = o.clock,
        .claim_owner = o.claim_locking ? o.claim_locking->owner : std::string(),
        .claim_timeout =
            o.claim_locking ? o.claim_locking->lock_timeout : std::chrono::milliseconds(0),
        .ordered = mode == Mode::Ordered,
    });
    // On failure from here on, `outbox` is destroyed, which closes the dispatcher.
    outbox.poller_ = std::make_unique<OutboxPoller>(OutboxPoller::Options{
        .connection_provider = o.connection_provider,
        .store = o.store,
        .handler = std::make_shared<DispatcherPollerHandler>(*outbox.dispatcher_),
        .skip_recent = o.skip_recent,
        .batch_size = o.poll_batch_size,
        .interval = o.poll_interval,
        .metrics = o.metrics,
        .claim_locking = o.claim_locking,
        .head_rescan_interval = o.head_rescan_interval,
        .json_codec = o.json_codec,
        .clock = o.clock,
    });
    if (o.claim_locking) {
      outbox.claim_release_ = std::make_unique<ClaimRelease>();
      outbox.claim_release_->provider = o.connection_provider;
      outbox.claim_release_->store = o.store;
      outbox.claim_release_->owner = o.claim_locking->owner;
    }
    if (mode != Mode::Ordered) {
      hook = std::make_shared<DispatcherWriterHook>(
          *outbox.dispatcher_, o.metrics, o.claim_locking ? o.claim_locking->owner : std::string());
    }
  }
  if (o.purger) {
    outbox.purge_ = std::make_unique<OutboxPurgeScheduler>(OutboxPurgeScheduler::Options{
        .connection_provider = o.connection_provider,
        .purger = o.purger,
        .retention = o.purge_retention,
        .batch_size = o.purge_batch_size,
        .interval = o.purge_interval,
        .clock = o.clock,
    });
  }
  outbox.writer_ = std::make_unique<OutboxWriter>(o.tx_context, o.store, std::move(hook));
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
  if (purge_) {
    purge_->start();
  }
}

}  // namespace outbox
