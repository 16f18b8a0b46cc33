#include "outbox/dispatcher.hpp"

#include <algorithm>
#include <optional>
#include <stdexcept>

#include "outbox/clock.hpp"
#include "outbox/errors.hpp"
#include "outbox/in_flight_tracker.hpp"
#include "outbox/interceptor.hpp"
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
  flusher_ = std::thread([this] { flusher_loop(); });
  if (!options_.claim_owner.empty()) {
    heartbeat_ = std::thread([this] { heartbeat_loop(); });
  }
  workers_.reserve(static_cast<std::size_t>(options_.worker_count));
  for (int i = 0; i < options_.worker_count; ++i) {
    workers_.emplace_back([this] { worker_loop(); });
  }
}

OutboxDispatcher::~OutboxDispatcher() {
  close();
}

bool OutboxDispatcher::enqueue_hot(QueuedEvent event, bool reserved) {
  event.source = QueuedEvent::Source::Hot;
  return enqueue(std::move(event), true, reserved) != EnqueueResult::Refused;
}

bool OutboxDispatcher::enqueue_cold(QueuedEvent event) {
  return try_enqueue_cold(std::move(event)) != EnqueueResult::Refused;
}

bool OutboxDispatcher::reserve(std::string_view event_id) {
  return reserve(event_id, std::chrono::steady_clock::now());
}

bool OutboxDispatcher::reserve(std::string_view event_id,
                               std::chrono::steady_clock::time_point claimed_at) {
  std::lock_guard lock(queue_mutex_);
  if (!options_.in_flight_tracker->try_acquire(event_id)) {
    return false;
  }
  if (!options_.claim_owner.empty()) {
    // The row's lease runs from its insert, however long the transaction stays open.
    reserved_at_.insert_or_assign(std::string(event_id), claimed_at);
  }
  return true;
}

void OutboxDispatcher::release_reservation(std::string_view event_id) {
  std::lock_guard lock(queue_mutex_);
  reserved_at_.erase(std::string(event_id));
  options_.in_flight_tracker->release(event_id);
}

std::uint64_t OutboxDispatcher::expired_claims_dropped() const {
  std::lock_guard lock(queue_mutex_);
  return expired_dropped_;
}

bool OutboxDispatcher::claim_lapsed(const QueuedEvent& event) const {
  // Half the lease: the heartbeat renews every quarter, so only a heartbeat that failed (or a
  // transaction that stayed open that long) gets here, well before another node could take it.
  return !options_.claim_owner.empty() && event.claimed_at &&
         std::chrono::steady_clock::now() - *event.claimed_at >= options_.claim_timeout / 2;
}

OutboxDispatcher::EnqueueResult OutboxDispatcher::try_enqueue_cold(QueuedEvent event) {
  event.source = QueuedEvent::Source::Cold;
  return enqueue(std::move(event), false, false);
}

OutboxDispatcher::EnqueueResult OutboxDispatcher::enqueue(QueuedEvent event, bool hot,
                                                          bool reserved) {
  event.batchable = false;
  if (options_.max_batch_size > 1) {
    try {  // looked up here, outside the queue lock: it is the caller's code
      event.batchable =
          options_.listeners->batch_listener_for(event.envelope.aggregate_type(),
                                                 event.envelope.event_type()) != nullptr;
    } catch (const std::exception&) {
      event.batchable = false;  // process_batch logs the failure when it looks again
    }
  }
  int hot_depth;
  int cold_depth;
  {
    std::lock_guard lock(queue_mutex_);
    auto& queue = hot ? hot_ : cold_;
    const auto capacity = hot ? options_.hot_queue_capacity : options_.cold_queue_capacity;
    const auto& id = event.envelope.event_id();
    if (reserved) {
      auto at = reserved_at_.find(id);
      if (at != reserved_at_.end()) {
        event.claimed_at = at->second;
        reserved_at_.erase(at);
      }
    }
    if (closing_ || queue.size() >= capacity) {
      if (reserved) {
        options_.in_flight_tracker->release(id);
      }
      return EnqueueResult::Refused;
    }
    if (!hot && completed_ids_.count(id) != 0) {
      return EnqueueResult::Duplicate;  // completed after this scan read it: no longer pending
    }
    if (!hot && event.scan_token && *event.scan_token < scans_invalid_before_) {
      // Read before an ordered drop: the head event is pending again and must come first; the
      // next cycle reads from it.
      return EnqueueResult::Refused;
    }
    if (!reserved && !options_.in_flight_tracker->try_acquire(id)) {
      return EnqueueResult::Duplicate;  // already queued or being processed here
    }
    queue.push_back(std::move(event));
    hot_depth = static_cast<int>(hot_.size());
    cold_depth = static_cast<int>(cold_.size());
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

int OutboxDispatcher::in_memory() const {
  std::lock_guard lock(queue_mutex_);
  return static_cast<int>(hot_.size() + cold_.size() +
                          options_.max_batch_size *
                              static_cast<std::size_t>(options_.worker_count));
}

int OutboxDispatcher::cold_queue_remaining_capacity() const {
  std::lock_guard lock(queue_mutex_);
  if (closing_) {
    return 0;
  }
  return static_cast<int>(options_.cold_queue_capacity - cold_.size());
}

std::uint64_t OutboxDispatcher::begin_scan() {
  std::lock_guard lock(queue_mutex_);
  active_scans_.insert(completion_seq_);
  return completion_seq_;
}

void OutboxDispatcher::end_scan(std::uint64_t token) {
  std::lock_guard lock(queue_mutex_);
  auto it = active_scans_.find(token);
  if (it != active_scans_.end()) {
    active_scans_.erase(it);
  }
  // Completions older than every remaining scan can no longer be stale reads of any scan.
  const std::uint64_t oldest = active_scans_.empty() ? completion_seq_ : *active_scans_.begin();
  while (!completed_log_.empty() && completed_log_.front().first <= oldest) {
    completed_ids_.erase(completed_log_.front().second);
    completed_log_.pop_front();
  }
}

void OutboxDispatcher::close() {
  std::lock_guard close_lock(close_mutex_);
  std::unique_lock lock(queue_mutex_);
  if (closing_ && workers_.empty() && !flusher_.joinable()) {
    return;
  }
  closing_ = true;
  work_ready_.notify_all();
  // With no drain time, abandon under the same lock hold so no worker takes another event.
  const bool drained = options_.drain_timeout.count() > 0
                           ? drained_.wait_for(lock, options_.drain_timeout,
                                               [&] { return hot_.empty() && cold_.empty(); })
                           : hot_.empty() && cold_.empty();
  abandon_ = true;
  const auto left = hot_.size() + cold_.size();
  lock.unlock();
  work_ready_.notify_all();
  for (auto& t : workers_) {
    if (t.joinable()) {
      t.join();
    }
  }
  workers_.clear();
  {
    std::lock_guard heartbeat_lock(heartbeat_mutex_);
    heartbeat_stop_ = true;
  }
  heartbeat_wake_.notify_all();
  if (heartbeat_.joinable()) {
    heartbeat_.join();
  }
  {
    std::lock_guard done_lock(done_mutex_);
    flusher_stop_ = true;
  }
  done_ready_.notify_all();
  if (flusher_.joinable()) {
    flusher_.join();  // it writes every DONE mark still waiting before it stops
  }
  lock.lock();
  for (auto* queue : {&hot_, &cold_}) {
    for (auto& e : *queue) {
      options_.in_flight_tracker->release(e.envelope.event_id());
    }
    queue->clear();
  }
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
    int hot_depth;
    int cold_depth;
    {
      std::unique_lock lock(queue_mutex_);
      work_ready_.wait(lock,
                       [&] { return abandon_ || closing_ || !hot_.empty() || !cold_.empty(); });
      if (abandon_ || (hot_.empty() && cold_.empty())) {
        if (closing_) {
          drained_.notify_all();
          return;
        }
        continue;
      }
      // 2:1 hot:cold when both have work, so a steady hot stream cannot starve the poller.
      const bool take_hot = !hot_.empty() && (cold_.empty() || fairness_tick_++ % 3 != 2);
      auto& queue = take_hot ? hot_ : cold_;
      // Events a batch listener takes travel together; any other goes alone, so a slow single
      // listener holds one worker for one event and idle workers take the next ones (a worker
      // once ran a whole batch of webhooks one after another, far past drain_timeout).
      while (!queue.empty() && events.size() < options_.max_batch_size) {
        if (!queue.front().batchable && !events.empty()) {
          break;
        }
        const bool alone = !queue.front().batchable;
        if (claim_lapsed(queue.front())) {
          lapsed.push_back(queue.front().envelope.event_id());
        } else {
          running_.insert(queue.front().envelope.event_id());
          events.push_back(std::move(queue.front()));
        }
        queue.pop_front();
        if (alone && !events.empty()) {
          break;
        }
      }
      expired_dropped_ += lapsed.size();
      hot_depth = static_cast<int>(hot_.size());
      cold_depth = static_cast<int>(cold_.size());
      if (hot_depth == 0 && cold_depth == 0) {
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
    if (events.empty()) {
      continue;
    }
    if (events.size() == 1) {
      process(events.front());
    } else {
      process_batch(events);
    }
  }
}

std::exception_ptr OutboxDispatcher::run_before(const EventEnvelope& event) {
  try {
    for (const auto& interceptor : options_.interceptors) {
      interceptor->before_dispatch(event);
    }
  } catch (...) {
    return std::current_exception();
  }
  return nullptr;
}

void OutboxDispatcher::process(QueuedEvent& queued) {
  const EventEnvelope& event = queued.envelope;
  for (;;) {
    std::exception_ptr error = run_before(event);
    if (!error) {
      try {
        auto listener =
            options_.listeners->listener_for(event.aggregate_type(), event.event_type());
        if (!listener) {
          throw UnroutableEventError("no listener for aggregate type '" + event.aggregate_type() +
                                     "' and event type '" + event.event_type() + "'");
        }
        (*listener)(event);
      } catch (...) {
        error = std::current_exception();
      }
    }
    if (options_.ordered && error) {
      std::optional<std::chrono::milliseconds> defer;
      try {
        std::rethrow_exception(error);
      } catch (const RetryLater& later) {
        if (!later.count_attempt()) {
          defer = later.delay();
        }
      } catch (...) {
      }
      if (defer) {
        // Written as RETRY, the row would let the aggregate's next event (already due) overtake
        // it; held here, nothing later starts before it.
        log(LogLevel::Warning, "event " + event.event_id() + " deferred for " +
                                   std::to_string(defer->count()) +
                                   " ms; ordered mode holds the queue meanwhile");
        // At least a short pause: a listener deferring by 0 must not spin a core.
        const auto pause = std::max(clamp_delay(*defer), kMinOrderedPause);
        std::unique_lock lock(queue_mutex_);
        const bool stopping = work_ready_.wait_for(lock, pause, [&] { return closing_; });
        if (!stopping) {
          continue;
        }
        lock.unlock();
        // Closing: this row and every later one stay pending, to be delivered in order after a
        // restart.
        drop_queued(event.event_id());
        return;
      }
    }
    complete(queued, error);
    return;
  }
}

void OutboxDispatcher::process_batch(std::vector<QueuedEvent>& events) {
  // Group by batch listener, keeping queue order within each group; events without one (or
  // whose lookup fails) go one by one.
  std::vector<std::pair<std::shared_ptr<const BatchEventListener>, std::vector<std::size_t>>>
      groups;
  std::vector<std::size_t> singles;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i].envelope;
    std::shared_ptr<const BatchEventListener> batch;
    try {
      batch = options_.listeners->batch_listener_for(e.aggregate_type(), e.event_type());
    } catch (const std::exception& ex) {
      log(LogLevel::Warning, std::string("batch_listener_for threw: ") + ex.what());
    }
    if (!batch) {
      singles.push_back(i);
      continue;
    }
    auto group =
        std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == batch; });
    if (group == groups.end()) {
      groups.emplace_back(batch, std::vector<std::size_t>{});
      group = groups.end() - 1;
    }
    group->second.push_back(i);
  }
  for (auto& [listener, members] : groups) {
    std::vector<std::exception_ptr> errors(members.size());
    std::vector<const EventEnvelope*> batch;
    std::vector<std::size_t> batch_members;  // positions in `members` of the events in `batch`
    for (std::size_t k = 0; k < members.size(); ++k) {
      errors[k] = run_before(events[members[k]].envelope);
      if (!errors[k]) {
        batch.push_back(&events[members[k]].envelope);
        batch_members.push_back(k);
      }
    }
    if (!batch.empty()) {
      std::vector<std::exception_ptr> results;
      try {
        results = (*listener)(batch);
        if (results.size() != batch.size()) {
          throw std::logic_error("batch listener returned " + std::to_string(results.size()) +
                                 " results for " + std::to_string(batch.size()) + " events");
        }
      } catch (...) {
        results.assign(batch.size(), std::current_exception());
      }
      for (std::size_t j = 0; j < batch.size(); ++j) {
        errors[batch_members[j]] = results[j];
      }
    }
    for (std::size_t k = 0; k < members.size(); ++k) {
      complete(events[members[k]], errors[k]);
    }
  }
  for (std::size_t i : singles) {
    process(events[i]);
  }
}

DispatcherWriterHook::DispatcherWriterHook(OutboxDispatcher& dispatcher,
                                           std::shared_ptr<MetricsExporter> metrics,
                                           std::string lock_owner)
    : dispatcher_(dispatcher),
      metrics_(metrics ? std::move(metrics) : MetricsExporter::noop()),
      lock_owner_(std::move(lock_owner)) {}

namespace {
// Delayed events go to the poller. Decided from the envelope alone so that after_write and
// after_commit always agree on which events were reserved.
bool takes_hot_path(const EventEnvelope& e) {
  return !e.available_at() || *e.available_at() <= e.occurred_at();
}
}  // namespace

namespace {
// When the current thread's write began: the database stamps the claim when the insert statement
// starts, which may be long before it returns (a lock wait, a large batch), so the lease is counted
// from before the statement was sent.
thread_local std::chrono::steady_clock::time_point tls_write_began;
}  // namespace

std::vector<EventEnvelope> DispatcherWriterHook::before_write(std::vector<EventEnvelope> events) {
  tls_write_began = std::chrono::steady_clock::now();
  return events;
}

void DispatcherWriterHook::after_write(const std::vector<EventEnvelope>& events) {
  for (const auto& e : events) {
    if (takes_hot_path(e)) {
      dispatcher_.reserve(e.event_id(), tls_write_began);
    }
  }
}

void DispatcherWriterHook::after_commit(const std::vector<EventEnvelope>& events) {
  for (const auto& e : events) {
    if (!takes_hot_path(e)) {
      continue;
    }
    if (!dispatcher_.enqueue_hot(QueuedEvent{e, QueuedEvent::Source::Hot, 0}, true)) {
      metrics_->increment_hot_dropped();
      log(LogLevel::Warning,
          "hot queue full or closed; event " + e.event_id() + " left for the poller");
    }
  }
}

void DispatcherWriterHook::after_rollback(const std::vector<EventEnvelope>& events) {
  for (const auto& e : events) {
    if (takes_hot_path(e)) {
      dispatcher_.release_reservation(e.event_id());
    }
  }
}

void DispatcherWriterHook::after_unknown_outcome(const std::vector<EventEnvelope>& events) {
  // A reservation kept would keep this node's poller from delivering a row that was committed.
  after_rollback(events);
}

}  // namespace outbox
