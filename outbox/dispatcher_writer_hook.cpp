#include "outbox/dispatcher_writer_hook.hpp"

#include <mutex>

#include "outbox/dispatcher.hpp"
#include "outbox/internal/dispatcher_link.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"

namespace outbox {

DispatcherWriterHook::DispatcherWriterHook(OutboxDispatcher& dispatcher,
                                           std::shared_ptr<MetricsExporter> metrics,
                                           std::string lock_owner)
    : link_(dispatcher.link_),
      metrics_(metrics ? std::move(metrics) : MetricsExporter::noop()),
      lock_owner_(std::move(lock_owner)) {}

namespace {
// Delayed events go to the poller, and so do events of message groups (only a poll sees whether
// an earlier event of the group is still pending). Decided from the envelope alone so that
// after_write and after_commit always agree on which events were reserved.
bool takes_hot_path(const EventEnvelope& e) {
  return (!e.available_at() || *e.available_at() <= e.occurred_at()) && !e.message_group();
}
}  // namespace

namespace {
// When the current thread's write began: the database stamps the claim when the insert statement
// starts, which may be long before it returns (a lock wait, a large batch), so the lease is counted
// from before the statement was sent.
thread_local std::chrono::steady_clock::time_point tls_write_began;
}  // namespace

template <typename Fn>
bool DispatcherWriterHook::with_dispatcher(Fn&& fn) const {
  std::shared_lock lock(link_->mutex);
  if (link_->dispatcher == nullptr) {
    return false;  // the Outbox is gone: its rows wait for the next process's poller
  }
  fn(*link_->dispatcher);
  return true;
}

std::vector<EventEnvelope> DispatcherWriterHook::before_write(std::vector<EventEnvelope> events) {
  tls_write_began = std::chrono::steady_clock::now();
  return events;
}

void DispatcherWriterHook::after_write(const std::vector<EventEnvelope>& events) {
  with_dispatcher([&](OutboxDispatcher& dispatcher) {
    for (const auto& e : events) {
      if (takes_hot_path(e)) {
        dispatcher.reserve(e.event_id(), tls_write_began);
      }
    }
  });
}

void DispatcherWriterHook::after_commit(const std::vector<EventEnvelope>& events) {
  const bool linked = with_dispatcher([&](OutboxDispatcher& dispatcher) {
    const bool acting = dispatcher.acting();  // without the lease, the holder's poller delivers
    for (const auto& e : events) {
      if (!takes_hot_path(e)) {
        continue;
      }
      if (!acting) {
        dispatcher.release_reservation(e.event_id());
      } else if (!dispatcher.enqueue_hot(QueuedEvent{e, QueuedEvent::Source::Hot, 0}, true)) {
        metrics_->increment_hot_dropped();
        log(LogLevel::Warning,
            "hot queue full or closed; event " + e.event_id() + " left for the poller");
      }
    }
  });
  if (!linked) {
    log(LogLevel::Warning, std::to_string(events.size()) +
                               " events committed after their Outbox was destroyed; left for "
                               "the poller");
  }
}

void DispatcherWriterHook::after_rollback(const std::vector<EventEnvelope>& events) {
  with_dispatcher([&](OutboxDispatcher& dispatcher) {
    for (const auto& e : events) {
      if (takes_hot_path(e)) {
        dispatcher.release_reservation(e.event_id());
      }
    }
  });
}

void DispatcherWriterHook::after_unknown_outcome(const std::vector<EventEnvelope>& events) {
  // A reservation kept would keep this node's poller from delivering a row that was committed.
  after_rollback(events);
}

}  // namespace outbox
