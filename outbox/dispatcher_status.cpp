// The outcome of a delivery recorded: interceptors told, DONE marks handed to the flusher (and
// their bookkeeping once written), RETRY / DEAD written by the status writer.
#include <algorithm>
#include <exception>
#include <mutex>
#include <string>

#include "outbox/dispatcher.hpp"
#include "outbox/interceptor.hpp"
#include "outbox/internal/done_flusher.hpp"
#include "outbox/internal/outcome_policy.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/retry_policy.hpp"

namespace outbox {

bool OutboxDispatcher::complete(QueuedEvent& queued, const DeliveryResult& result) {
  const EventEnvelope& event = queued.envelope;
  for (auto it = options_.interceptors.rbegin(); it != options_.interceptors.rend(); ++it) {
    try {
      (*it)->after_dispatch(event, result);
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("after_dispatch threw: ") + e.what());
    } catch (...) {
      log(LogLevel::Warning, "after_dispatch threw a non-standard exception");
    }
  }
  // Decide the outcome first, then write it once: a failed status write is logged and counted,
  // never turned into a listener retry (the row stays pending and the poller brings it back).
  const auto change = internal::decide_status(result, queued.attempts, options_.max_attempts,
                                              *options_.retry_policy);
  using Outcome = internal::StatusChange::Outcome;
  // Metrics are counted after the event is released, so an observer that sees a count can
  // queue the same event again.
  if (change.outcome == Outcome::Done && !options_.ordered) {
    flusher_->add(event.event_id());  // counted as a success once its DONE mark is written
    return true;
  }
  if (grouped(queued)) {
    return complete_grouped_failure(queued, change);
  }
  const bool written = status_writer_->write(event.event_id(), change);
  if (!written && options_.ordered) {
    drop_queued(event.event_id());
  } else {
    finish(event.event_id());
  }
  switch (change.outcome) {
    case Outcome::Done:
      if (written) {
        options_.metrics->increment_dispatch_success();
      }
      break;
    case Outcome::Retry:
    case Outcome::Deferred:
      options_.metrics->increment_dispatch_failure();
      log(LogLevel::Warning, "event " + event.event_id() + " (" + event.event_type() +
                                 ") failed, will retry: " + change.message);
      break;
    case Outcome::Dead:
      options_.metrics->increment_dispatch_dead();
      log(LogLevel::Error,
          "event " + event.event_id() + " (" + event.event_type() + ") is DEAD: " + change.message);
      break;
  }
  return change.outcome == Outcome::Done && written;
}

void OutboxDispatcher::write_done_marks(sql::Connection& conn) {
  if (flusher_) {
    flusher_->write_waiting(conn);
  }
}

void OutboxDispatcher::expect_done_writer(bool at_once) {
  if (flusher_) {
    flusher_->expect_writer(at_once);
  }
}

void OutboxDispatcher::on_done_batch(const std::vector<std::string>& ids, bool written) {
  // On SQLite the poller runs this between its DONE marks and its claim, on the drain's critical
  // path: a lock hold per id (against the workers) took 290–360 ms of its 2.4 s for 200,000
  // events, chunks 210–230 ms. Chunks, not one hold: the workers wait for the queue meanwhile.
  constexpr std::size_t kChunk = 64;
  std::size_t forgotten = 0;
  // Written marks are counted even when an in-flight tracker throws partway, as they were when
  // each id took the lock alone.
  const auto count = [&] {
    for (std::size_t i = 0; written && i < forgotten; ++i) {
      options_.metrics->increment_dispatch_success();
    }
  };
  try {
    for (std::size_t i = 0; i < ids.size(); i += kChunk) {
      std::lock_guard lock(queue_mutex_);
      for (std::size_t j = i; j < std::min(ids.size(), i + kChunk); ++j) {
        forget(ids[j]);
        ++forgotten;
      }
    }
  } catch (...) {
    count();
    throw;
  }
  count();
  notify_group_freed();  // a group whose last DONE mark this was may be claimed again
}

}  // namespace outbox
