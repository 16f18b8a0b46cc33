#include "outbox/dispatcher.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "outbox/clock.hpp"
#include "outbox/errors.hpp"
#include "outbox/groups.hpp"
#include "outbox/in_flight_tracker.hpp"
#include "outbox/interceptor.hpp"
#include "outbox/internal/claim_heartbeat.hpp"
#include "outbox/internal/delivery_ledger.hpp"
#include "outbox/internal/dispatch_queue.hpp"
#include "outbox/internal/dispatcher_link.hpp"
#include "outbox/internal/done_flusher.hpp"
#include "outbox/internal/outcome_policy.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox {
namespace {

constexpr std::chrono::milliseconds kMinOrderedPause{100};

}  // namespace

OutboxDispatcher::OutboxDispatcher(Options options) : options_(std::move(options)) {
  if (!options_.connection_provider) {
    throw std::invalid_argument("OutboxDispatcher: connection_provider is required");
  }
  if (!options_.store) {
    throw std::invalid_argument("OutboxDispatcher: store is required");
  }
  if (!options_.listeners) {
    throw std::invalid_argument("OutboxDispatcher: listeners is required");
  }
  if (options_.max_attempts < 1) {
    throw std::invalid_argument("OutboxDispatcher: max_attempts must be >= 1");
  }
  if (options_.worker_count < 1) {
    throw std::invalid_argument("OutboxDispatcher: worker_count must be >= 1");
  }
  if (options_.hot_queue_capacity < 1) {
    throw std::invalid_argument("OutboxDispatcher: hot_queue_capacity must be >= 1");
  }
  if (options_.cold_queue_capacity < 1) {
    throw std::invalid_argument("OutboxDispatcher: cold_queue_capacity must be >= 1");
  }
  if (options_.drain_timeout.count() < 0 || options_.drain_timeout > kMaxDuration) {
    throw std::invalid_argument("OutboxDispatcher: drain_timeout must be between 0 and 3650 days");
  }
  if (options_.done_batch_window.count() < 0 ||
      options_.done_batch_window > std::chrono::hours(1)) {
    throw std::invalid_argument("OutboxDispatcher: done_batch_window must be between 0 and 1 hour");
  }
  if (options_.done_batch_max < 1) {
    throw std::invalid_argument("OutboxDispatcher: done_batch_max must be >= 1");
  }
  if (options_.max_batch_size < 1) {
    throw std::invalid_argument("OutboxDispatcher: max_batch_size must be >= 1");
  }
  if (options_.claim_timeout.count() < 0 || options_.claim_timeout > kMaxDuration) {
    throw std::invalid_argument("OutboxDispatcher: claim_timeout must be between 0 and 3650 days");
  }
  if (!options_.claim_owner.empty() && options_.claim_timeout.count() == 0) {
    throw std::invalid_argument(
        "OutboxDispatcher: claim_timeout must be positive with claim_owner");
  }
  if (options_.max_concurrent_groups > 0 &&
      (options_.ordered || !options_.partition_lease || !options_.group_store)) {
    throw std::invalid_argument(
        "OutboxDispatcher: max_concurrent_groups needs partition_lease and group_store, and is "
        "not for ordered mode");
  }
  if (options_.ordered && (options_.worker_count != 1 || options_.max_batch_size != 1)) {
    throw std::invalid_argument(
        "OutboxDispatcher: ordered needs worker_count = 1 and max_batch_size = 1");
  }
  for (const auto& i : options_.interceptors) {
    if (!i) {
      throw std::invalid_argument("OutboxDispatcher: interceptors must not contain null");
    }
  }
  if (!options_.clock) {
    options_.clock = Clock::system();
  }
  if (!options_.in_flight_tracker) {
    options_.in_flight_tracker = std::make_shared<DefaultInFlightTracker>();
  }
  if (!options_.retry_policy) {
    options_.retry_policy = std::make_shared<ExponentialBackoffRetryPolicy>();
  }
  if (!options_.metrics) {
    options_.metrics = MetricsExporter::noop();
  }
  queue_ =
      options_.max_concurrent_groups > 0
          ? internal::make_keyed_scheduler(options_.hot_queue_capacity,
                                           options_.cold_queue_capacity,
                                           options_.max_concurrent_groups)
          : internal::make_fair_queues(options_.hot_queue_capacity, options_.cold_queue_capacity);
  ledger_ = std::make_unique<internal::DeliveryLedger>(*options_.in_flight_tracker,
                                                       !options_.claim_owner.empty());
  status_writer_ = std::make_unique<internal::StatusWriter>(options_.connection_provider,
                                                            options_.store, options_.clock,
                                                            options_.metrics, options_.claim_owner);
  link_ = std::make_shared<internal::DispatcherLink>();
  link_->dispatcher = this;
}

void OutboxDispatcher::start() {
  std::lock_guard close_lock(close_mutex_);
  {
    std::lock_guard lock(queue_mutex_);
    if (closing_) {
      throw std::logic_error("OutboxDispatcher: start() after close()");
    }
  }
  if (started_) {
    return;
  }
  started_ = true;
  flusher_ = std::make_unique<internal::DoneFlusher>(
      internal::DoneFlusher::Options{.provider = options_.connection_provider,
                                     .store = options_.store,
                                     .clock = options_.clock,
                                     .metrics = options_.metrics,
                                     .claim_owner = options_.claim_owner,
                                     .window = options_.done_batch_window,
                                     .max = options_.done_batch_max},
      [this](const std::vector<std::string>& ids, bool written) { on_done_batch(ids, written); });
  if (!options_.claim_owner.empty()) {
    heartbeat_ = std::make_unique<internal::ClaimHeartbeat>(
        internal::ClaimHeartbeat::Options{.provider = options_.connection_provider,
                                          .store = options_.store,
                                          .clock = options_.clock,
                                          .claim_owner = options_.claim_owner,
                                          .claim_timeout = options_.claim_timeout},
        [this] { return held_claims(); },
        [this](const std::unordered_set<std::string>& renewed,
               std::chrono::steady_clock::time_point at) {
          std::lock_guard lock(queue_mutex_);
          queue_->for_each([&](QueuedEvent& e) {
            if (e.claimed_at && renewed.count(e.envelope.event_id()) != 0) {
              e.claimed_at = at;
            }
          });
        });
  }
  workers_.reserve(static_cast<std::size_t>(options_.worker_count));
  for (int i = 0; i < options_.worker_count; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
  }
}

OutboxDispatcher::~OutboxDispatcher() {
  {
    // Hook calls in progress finish first; later ones find no dispatcher.
    std::unique_lock lock(link_->mutex);
    link_->dispatcher = nullptr;
  }
  close();
}

bool OutboxDispatcher::enqueue_hot(QueuedEvent event, bool reserved) {
  event.source = QueuedEvent::Source::Hot;
  return enqueue(std::move(event), reserved) != EnqueueResult::Refused;
}

bool OutboxDispatcher::enqueue_cold(QueuedEvent event) {
  return try_enqueue_cold(std::move(event)) != EnqueueResult::Refused;
}

OutboxDispatcher::EnqueueResult OutboxDispatcher::try_enqueue_cold(QueuedEvent event) {
  event.source = QueuedEvent::Source::Cold;
  return enqueue(std::move(event), false);
}

bool OutboxDispatcher::reserve(std::string_view event_id) {
  return reserve(event_id, std::chrono::steady_clock::now());
}

bool OutboxDispatcher::reserve(std::string_view event_id,
                               std::chrono::steady_clock::time_point claimed_at) {
  std::lock_guard lock(queue_mutex_);
  return ledger_->reserve(event_id, claimed_at);
}

void OutboxDispatcher::release_reservation(std::string_view event_id) {
  std::lock_guard lock(queue_mutex_);
  ledger_->release_reservation(event_id);
}

std::uint64_t OutboxDispatcher::inactive_dropped() const {
  std::lock_guard lock(queue_mutex_);
  return inactive_dropped_;
}

std::uint64_t OutboxDispatcher::expired_claims_dropped() const {
  std::lock_guard lock(queue_mutex_);
  return expired_dropped_;
}

bool OutboxDispatcher::claim_lapsed(const QueuedEvent& event) const {
  // Half the lease: the heartbeat renews every quarter, so only a heartbeat that failed (or a
  // transaction that stayed open that long) gets here, well before another node could take it.
  // A grouped event's row is held by its partition's lease, not by a claim (GroupStore::claim):
  // whether it may still go out is asked of the lease when it is taken.
  return !options_.claim_owner.empty() && event.claimed_at && !grouped(event) &&
         std::chrono::steady_clock::now() - *event.claimed_at >= options_.claim_timeout / 2;
}

void OutboxDispatcher::prepare(QueuedEvent& event) const {
  event.batchable = false;
  event.batch_key = nullptr;
  if (options_.max_batch_size > 1) {
    try {
      event.batch_key =
          options_.listeners
              ->batch_listener_for(event.envelope.aggregate_type(), event.envelope.event_type())
              .get();
      event.batchable = event.batch_key != nullptr;
    } catch (...) {
      event.batchable = false;  // process_batch logs the failure when it looks again
      event.batch_key = nullptr;
    }
  }
}

OutboxDispatcher::EnqueueResult OutboxDispatcher::admit(QueuedEvent event, bool reserved) {
  const bool hot = event.source == QueuedEvent::Source::Hot;
  const std::string id = event.envelope.event_id();
  if (reserved) {
    event.claimed_at = ledger_->take_reservation(id);
  }
  const std::size_t capacity = hot ? options_.hot_queue_capacity : options_.cold_queue_capacity;
  if (closing_ || queue_->size(event.source) >= capacity) {
    if (reserved) {
      ledger_->release(id);
    }
    return EnqueueResult::Refused;
  }
  if (!hot) {
    switch (ledger_->check_cold(id, event.scan_token, event.envelope.message_group())) {
      case internal::DeliveryLedger::ColdCheck::CompletedDuringScan:
        return EnqueueResult::Duplicate;  // its row was read while still pending
      case internal::DeliveryLedger::ColdCheck::ScanInvalidated:
        // Read before an ordered drop: the head event is pending again and must come first;
        // the next cycle reads from it.
        return EnqueueResult::Refused;
      case internal::DeliveryLedger::ColdCheck::Ok:
        break;
    }
  }
  if (!reserved && !ledger_->acquire(id)) {
    return EnqueueResult::Duplicate;  // already queued or being processed here
  }
  if (grouped(event)) {
    const std::string& group = event.envelope.message_group().value_or(std::string());
    grouped_.emplace(id, std::make_pair(*event.partition, group));
    ++partition_load_[*event.partition];
    ++group_load_[group];
  }
  queue_->push(std::move(event));
  return EnqueueResult::Queued;
}

OutboxDispatcher::EnqueueResult OutboxDispatcher::enqueue(QueuedEvent event, bool reserved) {
  const bool hot = event.source == QueuedEvent::Source::Hot;
  prepare(event);
  int hot_depth;
  int cold_depth;
  {
    std::lock_guard lock(queue_mutex_);
    const auto result = admit(std::move(event), reserved);
    if (result != EnqueueResult::Queued) {
      return result;
    }
    hot_depth = static_cast<int>(queue_->size(QueuedEvent::Source::Hot));
    cold_depth = static_cast<int>(queue_->size(QueuedEvent::Source::Cold));
  }
  work_ready_.notify_one();
  if (hot) {
    options_.metrics->increment_hot_enqueued();
  } else {
    options_.metrics->increment_cold_enqueued();
  }
  options_.metrics->record_queue_depths(hot_depth, cold_depth);
  return EnqueueResult::Queued;
}

OutboxDispatcher::BatchEnqueued OutboxDispatcher::enqueue_cold_all(
    std::vector<QueuedEvent> events) {
  for (auto& e : events) {
    e.source = QueuedEvent::Source::Cold;
    prepare(e);
  }
  BatchEnqueued done;
  int hot_depth;
  int cold_depth;
  {
    std::lock_guard lock(queue_mutex_);
    for (auto& e : events) {
      const auto result = admit(std::move(e), false);
      if (result == EnqueueResult::Refused) {
        break;
      }
      ++done.taken;
      done.queued += result == EnqueueResult::Queued ? 1 : 0;
    }
    hot_depth = static_cast<int>(queue_->size(QueuedEvent::Source::Hot));
    cold_depth = static_cast<int>(queue_->size(QueuedEvent::Source::Cold));
  }
  // One wake-up per event queued, up to every worker: a poll cycle's rows reach the workers
  // without a system call per row.
  if (done.queued >= static_cast<std::size_t>(options_.worker_count)) {
    work_ready_.notify_all();
  } else {
    for (std::size_t i = 0; i < done.queued; ++i) {
      work_ready_.notify_one();
    }
  }
  for (std::size_t i = 0; i < done.queued; ++i) {
    options_.metrics->increment_cold_enqueued();
  }
  if (done.queued > 0) {
    options_.metrics->record_queue_depths(hot_depth, cold_depth);
  }
  return done;
}

int OutboxDispatcher::in_memory() const {
  std::lock_guard lock(queue_mutex_);
  return static_cast<int>(
      queue_->size(QueuedEvent::Source::Hot) + queue_->size(QueuedEvent::Source::Cold) +
      options_.max_batch_size * static_cast<std::size_t>(options_.worker_count));
}

int OutboxDispatcher::cold_queue_remaining_capacity() const {
  std::lock_guard lock(queue_mutex_);
  return closing_ ? 0 : static_cast<int>(queue_->cold_remaining());
}

std::uint64_t OutboxDispatcher::begin_scan() {
  std::lock_guard lock(queue_mutex_);
  return ledger_->begin_scan();
}

void OutboxDispatcher::end_scan(std::uint64_t token) {
  std::lock_guard lock(queue_mutex_);
  ledger_->end_scan(token);
}

void OutboxDispatcher::close() {
  std::lock_guard close_lock(close_mutex_);
  std::unique_lock lock(queue_mutex_);
  if (closing_ && workers_.empty()) {
    return;
  }
  closing_ = true;
  work_ready_.notify_all();
  // With no drain time (or no workers: never started), abandon under the same lock hold so no
  // worker takes another event.
  const bool drained =
      started_ && options_.drain_timeout.count() > 0
          ? drained_.wait_for(lock, options_.drain_timeout, [&] { return queue_->empty(); })
          : queue_->empty();
  abandon_ = true;
  const auto left =
      queue_->size(QueuedEvent::Source::Hot) + queue_->size(QueuedEvent::Source::Cold);
  lock.unlock();
  work_ready_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) {
      t.join();
    }
  }
  workers_.clear();
  if (heartbeat_) {
    heartbeat_->stop();
  }
  if (flusher_) {
    flusher_->stop();  // it writes every DONE mark still waiting before it stops
  }
  lock.lock();
  for (auto& e : queue_->clear()) {
    ledger_->release(e.envelope.event_id());
  }
  grouped_.clear();
  partition_load_.clear();
  group_load_.clear();
  lock.unlock();
  if (!drained) {
    log(LogLevel::Warning, "OutboxDispatcher: drain timeout; " + std::to_string(left) +
                               " queued events left in the table for the poller");
  }
}

void OutboxDispatcher::worker_loop() {
  for (;;) {
    std::vector<QueuedEvent> events;
    std::vector<std::string> lapsed;
    std::vector<std::string> idle;
    std::vector<std::string> groups;          // the message groups taken, in order
    std::unordered_set<std::string> stopped;  // of those, the ones that may not go on
    int hot_depth;
    int cold_depth;
    {
      std::unique_lock lock(queue_mutex_);
      work_ready_.wait(
          lock, [&] { return abandon_ || (closing_ && queue_->empty()) || queue_->ready(); });
      if (abandon_ || !queue_->ready()) {
        if (closing_ && (abandon_ || queue_->empty())) {
          drained_.notify_all();
          return;
        }
        continue;
      }
      // Asked after the wait, not before: a worker that slept through the lease being gained
      // would drop the events it wakes up for. (The predicates only take the lease manager's own
      // lock, which is never held while calling into a dispatcher.)
      const bool act = acting();
      auto taken = queue_->take(options_.max_batch_size);
      for (auto& e : taken) {
        // A group's later events never run after one that was left.
        const auto& group = e.envelope.message_group();
        if (group && (groups.empty() || groups.back() != *group)) {
          groups.push_back(*group);
        }
        const bool stop = group && stopped.contains(*group);
        if (!act || stop || (grouped(e) && !lease_for(e))) {
          idle.push_back(e.envelope.event_id());
          if (group) {
            stopped.insert(*group);
          }
        } else if (claim_lapsed(e)) {
          lapsed.push_back(e.envelope.event_id());
          if (group) {
            stopped.insert(*group);
          }
        } else {
          ledger_->running(e.envelope.event_id());
          events.push_back(std::move(e));
        }
      }
      max_active_groups_ = std::max(max_active_groups_, queue_->active_groups());
      expired_dropped_ += lapsed.size();
      inactive_dropped_ += idle.size();
      hot_depth = static_cast<int>(queue_->size(QueuedEvent::Source::Hot));
      cold_depth = static_cast<int>(queue_->size(QueuedEvent::Source::Cold));
      if (queue_->empty()) {
        drained_.notify_all();
      }
    }
    options_.metrics->record_queue_depths(hot_depth, cold_depth);
    for (const auto& id : lapsed) {
      // The row stays claimed by this node until the lease ends; then any node (this one
      // included) claims and delivers it once.
      log(LogLevel::Warning, "OutboxDispatcher: claim of event " + id +
                                 " may have expired while it was queued; left for the poller");
      finish(id);
    }
    if (!idle.empty()) {
      // Another process holds the lease: it delivers these from the table.
      log(LogLevel::Info, "OutboxDispatcher: not acting (lease not held); " +
                              std::to_string(idle.size()) + " queued events left in the table");
      for (const auto& id : idle) {
        finish(id);
      }
    }
    if (events.size() == 1) {
      if (!process(events.front()) && events.front().envelope.message_group()) {
        stopped.insert(*events.front().envelope.message_group());
      }
    } else if (!events.empty()) {
      process_batch(events, stopped);
    }
    for (const auto& group : groups) {
      end_group(group, !stopped.contains(group));
    }
  }
}

void OutboxDispatcher::forget(const std::string& event_id) {
  ledger_->finish(event_id);
  const auto it = grouped_.find(event_id);
  if (it != grouped_.end()) {
    const auto& [partition, group] = it->second;
    if (--partition_load_[partition] == 0) {
      partition_load_.erase(partition);
    }
    if (--group_load_[group] == 0) {
      group_load_.erase(group);
      group_freed_ = true;
    }
    grouped_.erase(it);
  }
}

bool OutboxDispatcher::run_before(const EventEnvelope& event, DeliveryResult& failure) {
  try {
    for (const auto& interceptor : options_.interceptors) {
      interceptor->before_dispatch(event);
    }
    return true;
  } catch (...) {
    failure = DeliveryResult::from_exception(std::current_exception());
    return false;
  }
}

DeliveryResult OutboxDispatcher::run_listener(const EventEnvelope& event) {
  DeliveryResult result;
  if (!run_before(event, result)) {
    return result;
  }
  try {
    if (auto listener =
            options_.listeners->result_listener_for(event.aggregate_type(), event.event_type())) {
      return (*listener)(event);
    }
    auto listener = options_.listeners->listener_for(event.aggregate_type(), event.event_type());
    if (!listener) {
      return {.kind = DeliveryResult::Kind::Unroutable,
              .message = "no listener for aggregate type '" + event.aggregate_type() +
                         "' and event type '" + event.event_type() + "'"};
    }
    (*listener)(event);
    return DeliveryResult::delivered();
  } catch (...) {
    return DeliveryResult::from_exception(std::current_exception());
  }
}

bool OutboxDispatcher::process(QueuedEvent& queued) {
  const EventEnvelope& event = queued.envelope;
  for (;;) {
    DeliveryResult result = run_listener(event);
    if (options_.ordered && result.kind == DeliveryResult::Kind::RetryLater &&
        !result.count_attempt) {
      // Written as RETRY, the row would let the aggregate's next event (already due) overtake
      // it; held here, nothing later starts before it.
      log(LogLevel::Warning, "event " + event.event_id() + " deferred for " +
                                 std::to_string(result.delay.count()) +
                                 " ms; ordered mode holds the queue meanwhile");
      // At least a short pause: a listener deferring by 0 must not spin a core.
      const auto pause = std::max(clamp_delay(result.delay), kMinOrderedPause);
      std::unique_lock lock(queue_mutex_);
      const bool stopping = work_ready_.wait_for(lock, pause, [&] { return closing_; });
      lock.unlock();
      if (!stopping && acting()) {
        continue;
      }
      // Closing, or the lease went to another process meanwhile: this row and every later one
      // stay pending, to be delivered in order after a restart or by the lease's holder.
      drop_queued(event.event_id());
      return false;
    }
    return complete(queued, result);
  }
}

void OutboxDispatcher::drop_queued(const std::string& head_id) {
  // One lock hold: the head event and every queued one are released, and every poll cycle begun
  // so far is invalidated together, so no cycle can slip a later event in before the head's
  // redelivery (neither one that read the queue before, nor one that starts in between).
  std::lock_guard lock(queue_mutex_);
  for (auto& e : queue_->clear()) {
    forget(e.envelope.event_id());
  }
  forget(head_id);
  ledger_->invalidate_scans();
}

std::vector<std::string> OutboxDispatcher::held_claims() {
  std::vector<std::string> ids;
  std::lock_guard lock(queue_mutex_);
  queue_->for_each([&](QueuedEvent& e) {
    // A lapsed claim may belong to another node by now; a grouped row has no claim to renew.
    if (!claim_lapsed(e) && !grouped(e)) {
      ids.push_back(e.envelope.event_id());
    }
  });
  for (const auto& id : ledger_->running_ids()) {
    if (!grouped_.contains(id)) {
      ids.push_back(id);
    }
  }
  return ids;
}

void OutboxDispatcher::finish(const std::string& event_id) {
  std::lock_guard lock(queue_mutex_);
  forget(event_id);
}

}  // namespace outbox
