#include "outbox/subscription.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/internal/lease_balancer.hpp"
#include "outbox/internal/periodic_worker.hpp"
#include "outbox/internal/subscription_worker.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/writer.hpp"

namespace outbox {
namespace {

using std::chrono::milliseconds;

constexpr const char* kSequencerLease = "stream:sequencer";

}  // namespace

struct SubscriptionRunner::Background {
  std::unique_ptr<internal::PeriodicWorker> checker;
  std::unique_ptr<internal::PeriodicWorker> balancer;
  std::unique_ptr<internal::PeriodicWorker> sequencer;
  std::mutex mutex_;  // guards started, closed
  bool started = false;
  bool closed = false;
};

SubscriptionRunner::SubscriptionRunner(Options options) : options_(std::move(options)) {
  if (!options_.connection_provider) {
    throw std::invalid_argument("SubscriptionRunner: connection_provider is required");
  }
  if (!options_.store) {
    throw std::invalid_argument("SubscriptionRunner: store is required");
  }
  if (!options_.metrics) {
    options_.metrics = MetricsExporter::noop();
  }
  if (options_.codec == nullptr) {
    options_.codec = &JsonCodec::default_codec();
  }
  if (options_.sequencer_interval.count() <= 0 || options_.sequencer_batch < 1 ||
      options_.sequencer_batch > 10000) {
    throw std::invalid_argument(
        "SubscriptionRunner: sequencer_interval must be > 0, sequencer_batch 1 … 10000");
  }
  std::set<std::string, std::less<>> names;
  for (auto& sub : options_.subscriptions) {
    validate_subscription_name(sub.spec.name);
    sub.spec.filter.validate();
    const auto& s = sub.schedule;
    const std::string where = "SubscriptionRunner: subscription " + sub.spec.name + ": ";
    if (!names.insert(sub.spec.name).second) {
      throw std::invalid_argument(where + "defined twice");
    }
    if (!sub.publisher) {
      throw std::invalid_argument(where + "publisher is required");
    }
    if (s.poll_interval.count() <= 0 || s.batch_size < 1 || s.batch_size > 10000 ||
        s.backoff_threshold < 0 || s.backoff_multiplier < 1 || s.max_errors < 0 ||
        s.publish_chunk < 0 || s.retry_base.count() <= 0) {
      throw std::invalid_argument(where +
                                  "schedule: poll_interval and retry_base must be > 0, "
                                  "batch_size 1 … 10000, backoff_threshold and max_errors >= 0, "
                                  "backoff_multiplier >= 1, publish_chunk >= 0");
    }
  }
  background_ = std::make_unique<Background>();
  balancer_ = std::make_unique<internal::LeaseBalancer>();
  for (auto& sub : options_.subscriptions) {
    workers_.push_back(std::make_unique<Worker>(*this, sub));
  }
}

SubscriptionRunner::~SubscriptionRunner() {
  close();
}

void SubscriptionRunner::start() {
  {
    std::lock_guard lock(background_->mutex_);
    if (background_->closed) {
      throw std::logic_error("SubscriptionRunner: start() after close()");
    }
    if (background_->started) {
      return;
    }
    background_->started = true;
  }
  {
    auto conn = options_.connection_provider->acquire();
    options_.store->check(*conn);
    for (const auto& sub : options_.subscriptions) {
      const StreamPosition start =
          sub.start_at_end ? options_.store->head(*conn) : StreamPosition{};
      if (!options_.store->create(*conn, sub.spec, start)) {
        options_.store->update_spec(*conn, sub.spec);
      }
    }
  }
  background_->checker = std::make_unique<internal::PeriodicWorker>(
      "stream check", [this] { check_stream(); }, [] { return std::chrono::seconds(5); });
  background_->checker->start();
  if (options_.store->needs_sequencer()) {
    if (options_.leases) {
      options_.leases->keep(kSequencerLease);
    }
    background_->sequencer = std::make_unique<internal::PeriodicWorker>(
        "stream sequencer", [this] { sequence(); }, [this] { return sequencer_wait_; });
    background_->sequencer->start();
  }
  if (options_.leases) {
    options_.leases->keep(internal::LeaseBalancer::member_lease(options_.leases->owner()));
    background_->balancer = std::make_unique<internal::PeriodicWorker>(
        "subscription balancer", [this] { balance(); },
        [this] { return std::max(milliseconds(50), options_.leases->ttl() / 5); });
    background_->balancer->start();
  }
  for (auto& w : workers_) {
    w->start();
  }
}

void SubscriptionRunner::wake() {
  for (auto& w : workers_) {
    w->wake();
  }
  if (background_->sequencer) {
    background_->sequencer->wake();
  }
}

void SubscriptionRunner::poll_now() {
  for (auto& w : workers_) {
    w->poll_now();
  }
  if (background_->sequencer) {
    background_->sequencer->wake();
  }
}

std::shared_ptr<WriterHook> SubscriptionRunner::writer_hook() {
  class Wake final : public WriterHook {
   public:
    explicit Wake(SubscriptionRunner& runner) : runner_(runner) {}
    void after_commit(const std::vector<EventEnvelope>&) override { runner_.wake(); }

   private:
    SubscriptionRunner& runner_;
  };
  return std::make_shared<Wake>(*this);
}

void SubscriptionRunner::close() {
  {
    std::lock_guard lock(background_->mutex_);
    if (background_->closed) {
      return;
    }
    background_->closed = true;
  }
  if (background_->checker) {
    background_->checker->close();
  }
  if (background_->balancer) {
    background_->balancer->close();
  }
  if (background_->sequencer) {
    background_->sequencer->close();
  }
  for (auto& w : workers_) {
    w->close();
  }
  if (!options_.leases) {
    return;
  }
  // Handed back at once, so another process need not wait for the ttl; the manager may live on
  // (standby mode shares it), so the presence and sequencer leases are given back too.
  std::vector<std::string> names = {
      internal::LeaseBalancer::member_lease(options_.leases->owner())};
  if (options_.store->needs_sequencer()) {
    names.emplace_back(kSequencerLease);
  }
  for (const auto& name : names) {
    try {
      options_.leases->release(name);
    } catch (const std::exception& e) {
      log(LogLevel::Warning, "releasing lease '" + name + "' failed: " + e.what());
    }
  }
  for (auto& w : workers_) {
    try {
      if (w->held()) {
        options_.leases->release(w->lease());
      }
    } catch (const std::exception& e) {
      log(LogLevel::Warning, "subscription " + w->subscription().spec.name +
                                 ": releasing its lease failed: " + e.what());
    }
  }
}

std::vector<SubscriptionRunner::View> SubscriptionRunner::views() const {
  std::vector<View> out;
  for (const auto& w : workers_) {
    out.push_back(w->view());
  }
  return out;
}

void SubscriptionRunner::balance() {
  try {
    std::vector<internal::LeaseBalancer::Item*> items;
    for (auto& w : workers_) {
      items.push_back(w.get());
    }
    balancer_->balance(*options_.leases, items);
  } catch (const std::exception& e) {
    log(LogLevel::Warning, std::string("subscription balancer: ") + e.what());
  }
}

// A database restored under the relay (PostgreSQL) is refused while running too, not only at start:
// rows written since would sort before the cursors.
void SubscriptionRunner::check_stream() {
  std::string refusal;
  try {
    auto conn = options_.connection_provider->acquire();
    options_.store->check(*conn);
  } catch (const StreamError& e) {
    refusal = std::string("stream refused: ") + e.what();
  } catch (const std::exception& e) {
    log(LogLevel::Warning, std::string("stream check: ") + e.what());
    return;
  }
  std::lock_guard lock(refusal_mutex_);
  if (refusal != refusal_ && !refusal.empty()) {
    log(LogLevel::Error, "subscriptions stopped: " + refusal);
  }
  refusal_ = std::move(refusal);
}

std::string SubscriptionRunner::stream_refusal() const {
  std::lock_guard lock(refusal_mutex_);
  return refusal_;
}

void SubscriptionRunner::sequence() {
  sequencer_wait_ = options_.sequencer_interval;
  try {
    if (options_.leases && !options_.leases->token(kSequencerLease)) {
      return;
    }
    auto conn = options_.connection_provider->acquire();
    const int numbered = options_.store->sequence(*conn, options_.sequencer_batch);
    if (numbered > 0) {
      for (auto& w : workers_) {
        w->wake();
      }
    }
    if (numbered >= options_.sequencer_batch) {
      sequencer_wait_ = milliseconds(0);
    }
  } catch (const std::exception& e) {
    log(LogLevel::Warning, std::string("stream sequencer: ") + e.what());
  }
}

}  // namespace outbox
