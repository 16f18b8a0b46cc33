#include "outbox/subscription.hpp"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <set>
#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/internal/periodic_worker.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/writer.hpp"

namespace outbox {
namespace {

using std::chrono::milliseconds;

constexpr std::string_view kMemberPrefix = "member:";
constexpr const char* kSequencerLease = "stream:sequencer";

std::string lease_of(const std::string& subscription) {
  return "sub:" + subscription;
}

milliseconds doubled(milliseconds base, int times, int multiplier, milliseconds max) {
  milliseconds d = base;
  for (int i = 0; i < times && d < max; ++i) {
    d *= multiplier;
  }
  return std::min(d, max);
}

}  // namespace

// One subscription's thread and what it last saw.
class SubscriptionRunner::Worker {
 public:
  Worker(SubscriptionRunner& runner, Subscription sub)
      : runner_(runner),
        sub_(std::move(sub)),
        lease_(lease_of(sub_.spec.name)),
        thread_(
            "subscription " + sub_.spec.name, [this] { tick(); }, [this] { return next_wait(); }) {
    if (runner_.options_.leases) {
      fence_ = runner_.options_.leases->fence(lease_);
    }
  }

  const Subscription& subscription() const { return sub_; }
  const std::string& lease() const { return lease_; }
  void start() { thread_.start(); }
  void wake() { thread_.wake(); }
  void close() { thread_.close(); }
  bool held() const { return !fence_ || fence_->token().has_value(); }
  /// Asks the thread to give the lease back after the batch in progress.
  void yield() {
    yield_ = true;
    thread_.wake();
  }

  View view() const {
    std::lock_guard lock(mutex_);
    return View{sub_.spec.name, held(), waiting_, state_};
  }

 private:
  void tick() {
    milliseconds wait = sub_.schedule.poll_interval;
    std::string waiting;
    try {
      wait = run_once(waiting);
    } catch (const std::exception& e) {
      waiting = std::string("error: ") + e.what();
      log(LogLevel::Warning, "subscription " + sub_.spec.name + ": " + e.what());
    }
    std::lock_guard lock(mutex_);
    waiting_ = std::move(waiting);
    wait_ = wait;
  }

  milliseconds next_wait() {
    std::lock_guard lock(mutex_);
    return wait_;
  }

  void set_state(std::optional<SubscriptionState> state) {
    std::lock_guard lock(mutex_);
    state_ = std::move(state);
  }

  milliseconds idle() {
    const auto& s = sub_.schedule;
    ++empty_polls_;
    if (empty_polls_ <= s.backoff_threshold) {
      return s.poll_interval;
    }
    return doubled(s.poll_interval, empty_polls_ - s.backoff_threshold, s.backoff_multiplier,
                   std::max(s.backoff_max, s.poll_interval));
  }

  milliseconds run_once(std::string& waiting) {
    const auto& opts = runner_.options_;
    const auto& s = sub_.schedule;
    std::optional<LeaseToken> token;
    if (fence_) {
      if (yield_.exchange(false)) {
        opts.leases->release(lease_);
        waiting = "handed over to another process";
        return s.poll_interval;
      }
      token = fence_->token();
      if (!token) {
        waiting = "run by another process";
        return s.poll_interval;
      }
    }
    if (auto refusal = runner_.stream_refusal(); !refusal.empty()) {
      waiting = refusal;
      return s.poll_interval;
    }
    auto conn = opts.connection_provider->acquire();
    auto state = opts.store->find(*conn, sub_.spec.name);
    set_state(state);
    if (!state) {
      waiting = "removed from the subscription table";
      return s.poll_interval;
    }
    if (state->status != SubscriptionStatus::Active) {
      waiting = state->status == SubscriptionStatus::Paused ? "paused" : "failed";
      return s.poll_interval;
    }
    if (state->problem) {
      waiting = "its row cannot be used: " + *state->problem;
      return s.poll_interval;
    }
    if (!sub_.publisher->is_healthy()) {
      waiting = "publisher " + sub_.spec.publisher + " is not healthy";
      return s.poll_interval;
    }
    const auto events = opts.store->read(*conn, state->cursor, s.batch_size);
    if (events.empty()) {
      return idle();
    }
    empty_polls_ = 0;

    // Decode and filter; a row that cannot be decoded stops the batch there (it is reported and
    // retried like a failed publication: the cursor never passes an event silently).
    // A target that cannot be built for an event fails the same way.
    std::vector<EventEnvelope> envelopes;
    std::vector<std::string> targets;
    std::vector<std::size_t> index;  // event index of each request
    envelopes.reserve(events.size());
    // The first event that failed (its index; events.size(): none) and why.
    std::size_t fail_at = events.size();
    std::string fail_reason;
    for (std::size_t i = 0; i < events.size(); ++i) {
      try {
        auto envelope = to_envelope(events[i].row, *opts.codec);
        // The row's filter: changed with SQL, it applies from the next poll.
        if (state->spec.filter.matches(envelope)) {
          targets.push_back(sub_.target ? sub_.target(envelope) : sub_.spec.target);
          envelopes.push_back(std::move(envelope));
          index.push_back(i);
        }
      } catch (const std::exception& e) {
        fail_at = i;
        fail_reason = "event " + events[i].row.event_id + " at " + events[i].position.to_string() +
                      " cannot be published: " + e.what();
        break;
      }
    }
    std::vector<PublishRequest> requests;
    requests.reserve(envelopes.size());
    for (std::size_t r = 0; r < envelopes.size(); ++r) {
      requests.push_back({&envelopes[r], std::move(targets[r])});
    }
    // In chunks of publish_chunk, the lease checked before each (a process paused past its ttl
    // must not go on publishing a batch the new holder publishes too), stopping at a failure.
    std::optional<milliseconds> retry_after;
    std::optional<std::size_t> halted;  // the first event left unpublished: the lease ended
    const std::size_t chunk =
        s.publish_chunk == 0 ? requests.size() : static_cast<std::size_t>(s.publish_chunk);
    for (std::size_t from = 0; from < requests.size(); from += chunk) {
      if (from > 0 && fence_ && fence_->token() != token) {
        halted = index[from];
        break;
      }
      const std::size_t n = std::min(chunk, requests.size() - from);
      const auto results =
          sub_.publisher->publish(std::span<const PublishRequest>(requests).subspan(from, n));
      bool stop = false;
      for (std::size_t k = 0; k < n; ++k) {
        const std::size_t r = from + k;
        // A request without a result is not delivered.
        const bool ok = k < results.size() && results[k].is_ok();
        if (!ok && index[r] < fail_at) {
          const std::string reason = k >= results.size() ? "the publisher returned no result"
                                     : results[k].reason.empty() ? "failed"
                                                                 : results[k].reason;
          fail_at = index[r];
          fail_reason = "event " + events[index[r]].row.event_id + ": " + reason;
          retry_after = k < results.size() ? results[k].retry_after : std::nullopt;
          stop = true;
          break;
        }
      }
      if (stop) {
        break;
      }
    }
    // An event not published because the lease ended is no failure of the subscription's.
    if (halted && *halted < fail_at) {
      fail_at = events.size();
    } else {
      halted.reset();
    }
    const std::size_t done = halted.value_or(fail_at);
    const auto delivered = static_cast<std::int64_t>(
        std::count_if(index.begin(), index.end(), [&](std::size_t i) { return i < done; }));
    const LeaseToken* fenced = token ? &*token : nullptr;
    if (done > 0) {
      if (opts.store->advance(*conn, sub_.spec.name, state->cursor, events[done - 1].position,
                              delivered, fenced)) {
        opts.metrics->increment_subscription_delivered(sub_.spec.name, delivered);
      } else {
        // Rewound meanwhile (the rewind wins), or the lease is gone: check which, read again.
        if (fence_) {
          fence_->verify();
        }
        return milliseconds(0);
      }
    }
    if (halted) {
      waiting = "lease lost while publishing";
      return milliseconds(0);
    }
    if (fail_at == events.size()) {
      return events.size() == static_cast<std::size_t>(s.batch_size) ? milliseconds(0)
                                                                     : s.poll_interval;
    }
    opts.metrics->increment_subscription_failure(sub_.spec.name);
    if (retry_after) {
      waiting = "publisher asked to retry later";
      return *retry_after;
    }
    const auto status =
        opts.store->record_error(*conn, sub_.spec.name, fail_reason, s.max_errors, fenced);
    const int errors = state->error_count + 1;
    if (status == SubscriptionStatus::Failed) {
      log(LogLevel::Error, "subscription " + sub_.spec.name + " FAILED after " +
                               std::to_string(errors) + " errors in a row: " + fail_reason +
                               " (reset it once the cause is fixed)");
    } else {
      log(LogLevel::Warning, "subscription " + sub_.spec.name + ": " + fail_reason);
    }
    waiting = "retrying: " + fail_reason;
    return doubled(s.retry_base, errors - 1, 2, std::max(s.retry_max, s.retry_base));
  }

  SubscriptionRunner& runner_;
  Subscription sub_;
  std::string lease_;
  std::shared_ptr<LeaseFence> fence_;
  std::atomic<bool> yield_{false};
  int empty_polls_ = 0;       // the thread's own
  mutable std::mutex mutex_;  // guards waiting_, state_, wait_
  std::string waiting_ = "starting";
  std::optional<SubscriptionState> state_;
  milliseconds wait_{0};
  internal::PeriodicWorker thread_;  // last: stopped first
};

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
    options_.leases->keep(std::string(kMemberPrefix) + options_.leases->owner());
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
  std::vector<std::string> names = {std::string(kMemberPrefix) + options_.leases->owner()};
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

// Spreads the subscriptions over the live members: each takes up to its share of those nobody
// holds, and hands back what it holds beyond its share.
void SubscriptionRunner::balance() {
  try {
    const auto infos = options_.leases->leases();
    std::size_t members = 0;
    std::set<std::string, std::less<>> live;
    for (const auto& info : infos) {
      if (info.live) {
        live.insert(info.name);
        members += info.name.starts_with(kMemberPrefix) ? 1 : 0;
      }
    }
    // Relays may name different subscriptions, so a share is a target, never a reason to leave
    // one unrun: a subscription nobody took for a whole round is taken regardless (and kept:
    // nobody else wants it) until the members change.
    std::set<std::string, std::less<>> member_names;
    for (const auto& name : live) {
      if (name.starts_with(kMemberPrefix)) {
        member_names.insert(name);
      }
    }
    if (member_names != balance_.members) {
      balance_.members = std::move(member_names);
      balance_.kept.clear();
    }
    const std::size_t share = (workers_.size() + std::max<std::size_t>(members, 1) - 1) /
                              std::max<std::size_t>(members, 1);
    std::size_t held = 0;
    for (const auto& w : workers_) {
      held += w->held() ? 1 : 0;
    }
    std::set<std::string, std::less<>> free_now;
    for (auto& w : workers_) {
      if (w->held() || live.contains(w->lease())) {
        continue;
      }
      const bool unwanted = balance_.free.contains(w->lease());
      if ((held < share || unwanted) && options_.leases->try_acquire(w->lease())) {
        if (++held > share) {
          balance_.kept.insert(w->lease());
        }
        w->wake();
      } else {
        free_now.insert(w->lease());
      }
    }
    balance_.free = std::move(free_now);
    for (auto it = workers_.rbegin(); it != workers_.rend() && held > share; ++it) {
      if ((*it)->held() && !balance_.kept.contains((*it)->lease())) {
        (*it)->yield();
        --held;
      }
    }
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
