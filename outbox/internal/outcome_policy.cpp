#include "outbox/internal/outcome_policy.hpp"

#include "outbox/errors.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox::internal {

StatusChange decide_status(const DeliveryResult& result, int attempts, int max_attempts,
                           const RetryPolicy& policy) {
  using Kind = DeliveryResult::Kind;
  using Outcome = StatusChange::Outcome;
  StatusChange change{.message = result.message};
  const int after = attempts + 1;
  switch (result.kind) {
    case Kind::Delivered:
      change.outcome = Outcome::Done;
      break;
    case Kind::Unroutable:
      change.outcome = Outcome::Dead;
      change.count_attempt = false;
      break;
    case Kind::Permanent:
      change.outcome = Outcome::Dead;
      break;
    case Kind::RetryLater:
      change.delay = clamp_delay(result.delay);
      if (change.delay.count() <= 0) {
        // No wait is no hint: without the policy's backoff and a counted attempt, a receiver
        // answering "Retry-After: 0" would be called in a tight loop forever.
        change.outcome = after >= max_attempts ? Outcome::Dead : Outcome::Retry;
        change.delay = policy.compute_delay(after);
      } else if (!result.count_attempt) {
        change.outcome = Outcome::Deferred;
      } else {
        change.outcome = after >= max_attempts ? Outcome::Dead : Outcome::Retry;
      }
      break;
    case Kind::Failed:
      if (after >= max_attempts) {
        change.outcome = Outcome::Dead;
      } else {
        change.outcome = Outcome::Retry;
        change.delay = policy.compute_delay(after);
      }
      break;
  }
  return change;
}

void StatusWriter::write_once(sql::Connection& conn, const std::string& event_id,
                              const StatusChange& change, const std::string& message) {
  const auto now = clock_->now();
  switch (change.outcome) {
    case StatusChange::Outcome::Done:
      store_->mark_done(conn, event_id, now, owner_);
      break;
    case StatusChange::Outcome::Retry:
      store_->mark_retry(conn, event_id, now, change.delay, message, owner_);
      break;
    case StatusChange::Outcome::Deferred:
      store_->mark_deferred(conn, event_id, now, change.delay, message, owner_);
      break;
    case StatusChange::Outcome::Dead:
      store_->mark_dead(conn, event_id, now, message, change.count_attempt, owner_);
      break;
  }
}

bool StatusWriter::write(const std::string& event_id, const StatusChange& change) {
  try {
    auto conn = provider_->acquire();
    try {
      write_once(*conn, event_id, change, change.message);
      return true;
    } catch (const StoreError& first) {
      if (conn->is_broken() || conn->in_transaction()) {
        throw;
      }
      // A deadlock or serialization failure says nothing about the values: the same write
      // again, with the listener's own message (twice at most, as the DONE flusher does).
      if (first.sqlstate() == "40P01" || first.sqlstate() == "40001") {
        for (int attempt = 2;; ++attempt) {
          try {
            write_once(*conn, event_id, change, change.message);
            return true;
          } catch (const StoreError& again) {
            const bool transient = again.sqlstate() == "40P01" || again.sqlstate() == "40001";
            if (attempt >= 3 || !transient || conn->is_broken()) {
              throw;
            }
          }
        }
      }
      // Not the link: something in the row's new values (an error text the engine refuses).
      // Once more with a message that any engine stores, rather than leave the row pending
      // forever.
      log(LogLevel::Warning,
          "OutboxDispatcher: outcome of event " + event_id +
              " refused, writing it again with a plain message: " + first.what());
      std::string plain;
      for (char c : change.message.substr(0, 200)) {
        const auto u = static_cast<unsigned char>(c);
        plain.push_back(u >= 0x20 && u < 0x7F ? c : '?');
      }
      write_once(*conn, event_id, change, "(message not storable) " + plain);
      return true;
    }
  } catch (const std::exception& e) {
    metrics_->increment_status_update_failure();
    log(LogLevel::Error, "OutboxDispatcher: could not record the outcome of event " + event_id +
                             " (the poller will retry it): " + e.what());
    return false;
  }
}

}  // namespace outbox::internal
