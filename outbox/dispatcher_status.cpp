// How the dispatcher records what happened to an event: the outcome of each event, the DONE
// flusher that batches success marks, and the heartbeat that keeps this node's claims alive.

#include <algorithm>
#include <optional>
#include <stdexcept>
#include <unordered_set>

#include "outbox/dispatcher.hpp"
#include "outbox/errors.hpp"
#include "outbox/in_flight_tracker.hpp"
#include "outbox/interceptor.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox {
namespace {

std::string describe(std::exception_ptr error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "non-standard exception";
  }
}

}  // namespace

void OutboxDispatcher::complete(QueuedEvent& queued, std::exception_ptr error) {
  const EventEnvelope& event = queued.envelope;
  for (auto it = options_.interceptors.rbegin(); it != options_.interceptors.rend(); ++it) {
    try {
      (*it)->after_dispatch(event, error);
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("after_dispatch threw: ") + e.what());
    } catch (...) {
      log(LogLevel::Warning, "after_dispatch threw a non-standard exception");
    }
  }

  // Decide the outcome first, then write it once: a failed status write is logged and counted,
  // never turned into a listener retry (the row stays pending and the poller brings it back).
  Outcome outcome = Outcome::Done;
  std::string message;
  std::chrono::milliseconds delay{0};
  bool count_attempt = true;
  if (error) {
    message = describe(error);
    const int attempts = queued.attempts + 1;
    try {
      std::rethrow_exception(error);
    } catch (const UnroutableEventError&) {
      outcome = Outcome::Dead;
      count_attempt = false;
    } catch (const PermanentFailure&) {
      outcome = Outcome::Dead;
    } catch (const RetryLater& later) {
      delay = clamp_delay(later.delay());
      if (delay.count() <= 0) {
        // No wait is no hint: without the policy's backoff and a counted attempt, a receiver
        // answering "Retry-After: 0" would be called in a tight loop forever.
        outcome = attempts >= options_.max_attempts ? Outcome::Dead : Outcome::Retry;
        delay = options_.retry_policy->compute_delay(attempts);
      } else if (!later.count_attempt()) {
        outcome = Outcome::Deferred;
      } else {
        outcome = attempts >= options_.max_attempts ? Outcome::Dead : Outcome::Retry;
      }
    } catch (...) {
      if (attempts >= options_.max_attempts) {
        outcome = Outcome::Dead;
      } else {
        outcome = Outcome::Retry;
        delay = options_.retry_policy->compute_delay(attempts);
      }
    }
  }

  // Metrics are counted after the event is released, so an observer that sees a count can
  // queue the same event again.
  if (outcome == Outcome::Done && !options_.ordered) {
    complete_done(event.event_id());  // counted as a success once its DONE mark is written
    return;
  }
  const bool written = write_outcome(queued, outcome, delay, message, count_attempt);
  if (!written && options_.ordered) {
    drop_queued(event.event_id());
  } else {
    finish(event.event_id());
  }
  switch (outcome) {
    case Outcome::Done:
      if (written) {
        options_.metrics->increment_dispatch_success();
      }
      break;
    case Outcome::Retry:
    case Outcome::Deferred:
      options_.metrics->increment_dispatch_failure();
      log(LogLevel::Warning, "event " + event.event_id() + " (" + event.event_type() +
                                 ") failed, will retry: " + message);
      break;
    case Outcome::Dead:
      options_.metrics->increment_dispatch_dead();
      log(LogLevel::Error,
          "event " + event.event_id() + " (" + event.event_type() + ") is DEAD: " + message);
      break;
  }
}

bool OutboxDispatcher::write_outcome(const QueuedEvent& queued, Outcome outcome,
                                     std::chrono::milliseconds delay, const std::string& message,
                                     bool count_attempt) {
  const auto& id = queued.envelope.event_id();
  const auto& owner = options_.claim_owner;
  auto write = [&](sql::Connection& conn, const std::string& text) {
    auto& store = *options_.store;
    const auto now = options_.clock->now();
    switch (outcome) {
      case Outcome::Done:
        store.mark_done(conn, id, now, owner);
        break;
      case Outcome::Retry:
        store.mark_retry(conn, id, now, delay, text, owner);
        break;
      case Outcome::Deferred:
        store.mark_deferred(conn, id, now, delay, text, owner);
        break;
      case Outcome::Dead:
        store.mark_dead(conn, id, now, text, count_attempt, owner);
        break;
    }
  };
  try {
    auto conn = options_.connection_provider->acquire();
    try {
      write(*conn, message);
      return true;
    } catch (const StoreError& first) {
      if (conn->is_broken() || conn->in_transaction()) {
        throw;
      }
      // Not the link: something in the row's new values (an error text the engine refuses).
      // Once more with a message that any engine stores, rather than leave the row pending
      // forever.
      log(LogLevel::Warning,
          "OutboxDispatcher: outcome of event " + id +
              " refused, writing it again with a plain message: " + first.what());
      std::string plain;
      for (char c : message.substr(0, 200)) {
        const auto u = static_cast<unsigned char>(c);
        plain.push_back(u >= 0x20 && u < 0x7F ? c : '?');
      }
      write(*conn, "(message not storable) " + plain);
      return true;
    }
  } catch (const std::exception& e) {
    options_.metrics->increment_status_update_failure();
    log(LogLevel::Error, "OutboxDispatcher: could not record the outcome of event " + id +
                             " (the poller will retry it): " + e.what());
    return false;
  }
}

void OutboxDispatcher::drop_queued(const std::string& head_id) {
  // One lock hold: the head event and every queued one are released, and every poll cycle begun
  // so far is invalidated together, so no cycle can slip a later event in before the head's
  // redelivery (neither one that read the queue before, nor one that starts in between).
  std::lock_guard lock(queue_mutex_);
  for (auto* queue : {&hot_, &cold_}) {
    for (auto& e : *queue) {
      finish_locked(e.envelope.event_id());
    }
    queue->clear();
  }
  finish_locked(head_id);
  scans_invalid_before_ = completion_seq_;
}

void OutboxDispatcher::heartbeat_loop() {
  const auto period =
      std::max<std::chrono::milliseconds>(options_.claim_timeout / 4, std::chrono::milliseconds(1));
  // A connection of its own where the provider can make one: borrowing from a pool that busy
  // listeners exhaust would let the lease of a running event run out.
  std::unique_ptr<sql::Connection> own;
  std::unique_lock wait_lock(heartbeat_mutex_);
  for (;;) {
    if (heartbeat_wake_.wait_for(wait_lock, period, [&] { return heartbeat_stop_; })) {
      return;
    }
    wait_lock.unlock();
    std::vector<std::string> ids;
    const auto stamped = std::chrono::steady_clock::now();  // before the statement: conservative
    {
      std::lock_guard lock(queue_mutex_);
      for (const auto* queue : {&hot_, &cold_}) {
        for (const auto& e : *queue) {
          if (!claim_lapsed(e)) {  // a lapsed claim may belong to another node by now
            ids.push_back(e.envelope.event_id());
          }
        }
      }
      ids.insert(ids.end(), running_.begin(), running_.end());
    }
    if (!ids.empty()) {
      try {
        if (!own || own->is_broken()) {
          own.reset();
          own = options_.connection_provider->open_dedicated();
        }
        std::optional<sql::PooledConnection> borrowed;
        if (!own) {
          borrowed.emplace(options_.connection_provider->acquire());
        }
        sql::Connection& conn = own ? *own : borrowed->get();
        std::vector<std::string> renewed_ids;
        try {
          renewed_ids =
              options_.store->renew_claims(conn, options_.claim_owner, ids, options_.clock->now());
        } catch (...) {
          own.reset();  // opened again at the next beat
          throw;
        }
        if (std::chrono::steady_clock::now() - stamped > options_.claim_timeout / 4) {
          // Too slow to be sure the renewal came before another node could take a lapsing claim:
          // the queued events keep their old claim time (and are dropped when it lapses).
          throw std::runtime_error("renewal took longer than a quarter lease");
        }
        // Only the rows really renewed: one skipped (locked right now) or taken by another node
        // keeps its old claim time here and is dropped if that lapses.
        std::unordered_set<std::string> renewed(renewed_ids.begin(), renewed_ids.end());
        std::lock_guard lock(queue_mutex_);
        for (auto* queue : {&hot_, &cold_}) {
          for (auto& e : *queue) {
            if (e.claimed_at && renewed.count(e.envelope.event_id()) != 0) {
              e.claimed_at = stamped;
            }
          }
        }
      } catch (const std::exception& e) {
        log(LogLevel::Warning,
            std::string("OutboxDispatcher: could not renew claims (queued events whose claim "
                        "lapses are left for the poller): ") +
                e.what());
      }
    }
    wait_lock.lock();
  }
}

void OutboxDispatcher::complete_done(std::string event_id) {
  bool wake;
  {
    std::lock_guard lock(done_mutex_);
    if (pending_done_.empty()) {
      first_done_at_ = std::chrono::steady_clock::now();
    }
    pending_done_.push_back(std::move(event_id));
    // Wake the flusher for the first id of a window (it then sleeps until the window ends) and
    // when the batch is full.
    wake = pending_done_.size() == 1 || pending_done_.size() >= options_.done_batch_max;
  }
  if (wake) {
    done_ready_.notify_one();
  }
}

void OutboxDispatcher::flusher_loop() {
  std::unique_lock lock(done_mutex_);
  for (;;) {
    done_ready_.wait(lock, [&] { return flusher_stop_ || !pending_done_.empty(); });
    if (pending_done_.empty()) {
      return;  // stopping with nothing left to write
    }
    // Gather for the rest of the window, unless the batch fills up or the dispatcher closes.
    done_ready_.wait_until(lock, first_done_at_ + options_.done_batch_window, [&] {
      return flusher_stop_ || pending_done_.size() >= options_.done_batch_max;
    });
    std::vector<std::string> batch;
    if (pending_done_.size() <= options_.done_batch_max) {
      batch.swap(pending_done_);
    } else {
      batch.assign(std::make_move_iterator(pending_done_.begin()),
                   std::make_move_iterator(pending_done_.begin() +
                                           static_cast<long>(options_.done_batch_max)));
      pending_done_.erase(pending_done_.begin(),
                          pending_done_.begin() + static_cast<long>(options_.done_batch_max));
    }
    lock.unlock();
    bool written = true;
    try {
      auto conn = options_.connection_provider->acquire();
      // A deadlock or serialization failure is transient: a batch not written means every event
      // in it is delivered again, so it is worth two more tries on a healthy connection.
      for (int attempt = 1;; ++attempt) {
        try {
          const int marked = options_.store->mark_done_batch(*conn, batch, options_.clock->now(),
                                                             options_.claim_owner);
          if (!options_.claim_owner.empty() && marked < static_cast<int>(batch.size())) {
            // Rows another node claimed meanwhile (this node's lease ran out while it worked):
            // that node delivers them too.
            log(LogLevel::Warning,
                "OutboxDispatcher: " +
                    std::to_string(batch.size() - static_cast<std::size_t>(marked)) +
                    " delivered events were no longer pending under the claim of " +
                    options_.claim_owner + " when marked DONE");
          }
          break;
        } catch (const StoreError& e) {
          const bool transient = e.sqlstate() == "40P01" || e.sqlstate() == "40001";
          if (attempt >= 3 || !transient || conn->is_broken()) {
            throw;
          }
        }
      }
    } catch (const std::exception& e) {
      written = false;
      for (std::size_t i = 0; i < batch.size(); ++i) {
        options_.metrics->increment_status_update_failure();
      }
      log(LogLevel::Error, "OutboxDispatcher: could not mark " + std::to_string(batch.size()) +
                               " events DONE (the poller will deliver them again): " + e.what());
    }
    for (const auto& id : batch) {
      finish(id);
      if (written) {
        options_.metrics->increment_dispatch_success();
      }
    }
    lock.lock();
  }
}

void OutboxDispatcher::finish(const std::string& event_id) {
  std::lock_guard lock(queue_mutex_);
  finish_locked(event_id);
}

void OutboxDispatcher::finish_locked(const std::string& event_id) {
  running_.erase(event_id);
  ++completion_seq_;
  if (!active_scans_.empty()) {
    completed_log_.emplace_back(completion_seq_, event_id);
    completed_ids_.insert(event_id);
  }
  options_.in_flight_tracker->release(event_id);
}

}  // namespace outbox
