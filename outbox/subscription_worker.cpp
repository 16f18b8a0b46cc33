#include "outbox/internal/subscription_worker.hpp"

#include <algorithm>
#include <utility>

#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox {
namespace {

using std::chrono::milliseconds;

// How soon a woken subscription reads again while an open transaction holds the stream back.
constexpr milliseconds kHeldBackRetry{200};

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

SubscriptionRunner::Worker::Worker(SubscriptionRunner& runner, Subscription sub)
    : runner_(runner),
      sub_(std::move(sub)),
      lease_(lease_of(sub_.spec.name)),
      thread_(
          "subscription " + sub_.spec.name, [this] { tick(); }, [this] { return next_wait(); }) {
  if (runner_.options_.leases) {
    fence_ = runner_.options_.leases->fence(lease_);
  }
}

SubscriptionRunner::View SubscriptionRunner::Worker::view() const {
  std::lock_guard lock(mutex_);
  return View{sub_.spec.name, held(), waiting_, state_};
}

void SubscriptionRunner::Worker::tick() {
  milliseconds wait = sub_.schedule.poll_interval;
  std::string waiting;
  retrying_ = false;
  {
    std::lock_guard lock(mutex_);
    polled_now_ = false;  // from now on, a poll_now() comes during this attempt
  }
  try {
    wait = run_once(waiting);
  } catch (const std::exception& e) {
    waiting = std::string("error: ") + e.what();
    log(LogLevel::Warning, "subscription " + sub_.spec.name + ": " + e.what());
  }
  std::lock_guard lock(mutex_);
  waiting_ = std::move(waiting);
  wait_ = wait;
  // An operator's poll_now() during the attempt wins over its retry delay.
  const bool hold = retrying_ && !std::exchange(polled_now_, false);
  retry_at_ =
      hold ? std::chrono::steady_clock::now() + wait : std::chrono::steady_clock::time_point{};
  if (hold) {
    thread_.discard_wake();  // wake-ups during the failed attempt must not cut its delay
  }
}

milliseconds SubscriptionRunner::Worker::next_wait() {
  std::lock_guard lock(mutex_);
  return wait_;
}

void SubscriptionRunner::Worker::set_state(std::optional<SubscriptionState> state) {
  std::lock_guard lock(mutex_);
  state_ = std::move(state);
}

milliseconds SubscriptionRunner::Worker::idle() {
  const auto& s = sub_.schedule;
  ++empty_polls_;
  if (empty_polls_ <= s.backoff_threshold) {
    return s.poll_interval;
  }
  return doubled(s.poll_interval, empty_polls_ - s.backoff_threshold, s.backoff_multiplier,
                 std::max(s.backoff_max, s.poll_interval));
}

milliseconds SubscriptionRunner::Worker::run_once(std::string& waiting) {
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
  const LeaseToken* fenced = token ? &*token : nullptr;
  if (unsaved_) {
    // Only by the same holding of the lease and from the cursor it started at: after a rewind,
    // or once another process held the subscription, those events are due again.
    auto pending = std::exchange(unsaved_, std::nullopt);
    if (pending->token == token && pending->from == state->cursor) {
      unsaved_ = pending;  // kept while the write fails (it throws)
      const bool moved = opts.store->advance(*conn, sub_.spec.name, pending->from, pending->to,
                                             pending->delivered, fenced);
      unsaved_.reset();
      if (!moved) {
        if (fence_) {
          fence_->verify();
        }
        return milliseconds(0);
      }
      opts.metrics->increment_subscription_delivered(sub_.spec.name, pending->delivered);
      state->cursor = pending->to;
    }
  }
  if (!sub_.publisher->is_healthy()) {
    waiting = "publisher " + sub_.spec.publisher + " is not healthy";
    return s.poll_interval;
  }
  const bool woken = woken_.exchange(false);  // before the read: a later wake-up stays
  // Asked before the read as well as after: a transaction that hid the woken-for row and ended
  // between the read and a later question would leave the wake-up lost for a poll interval. One
  // that hides it was open before the read (it began before the row was written).
  auto held_before = woken ? opts.store->holdback(*conn) : std::nullopt;
  const auto events = opts.store->read(*conn, state->cursor, s.batch_size);
  if (events.empty()) {
    // Woken for a commit, nothing readable: an older transaction still open on the server
    // (PostgreSQL; any session's) holds the stream back. While it does, look again soon: the
    // wake-up must not wait a whole poll interval.
    if (woken) {
      if (const auto held = held_before ? held_before : opts.store->holdback(*conn)) {
        woken_ = true;
        waiting = "held back by an open transaction (pid " + std::to_string(held->pid) + ")";
        return std::min(s.poll_interval, kHeldBackRetry);
      }
    }
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
        const std::string reason = k >= results.size()         ? "the publisher returned no result"
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
  if (done > 0) {
    unsaved_ = UnsavedAdvance{state->cursor, events[done - 1].position, delivered, token};
    const bool moved = opts.store->advance(*conn, sub_.spec.name, state->cursor,
                                           events[done - 1].position, delivered, fenced);
    unsaved_.reset();
    if (moved) {
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
  retrying_ = true;
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

}  // namespace outbox
