// A message group's events against their partition's lease: whether one may still go out, and
// its failure written under that lease; and the dispatcher's count of the groups it holds.
#include <algorithm>
#include <exception>
#include <mutex>
#include <string>

#include "outbox/dispatcher.hpp"
#include "outbox/errors.hpp"
#include "outbox/groups.hpp"
#include "outbox/internal/delivery_ledger.hpp"
#include "outbox/internal/dispatch_queue.hpp"
#include "outbox/internal/outcome_policy.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox {

std::optional<LeaseToken> OutboxDispatcher::lease_for(const QueuedEvent& event) const {
  auto lease = options_.partition_lease(*event.partition);
  if (lease && event.lease_epoch && lease->epoch != *event.lease_epoch) {
    return std::nullopt;
  }
  return lease;
}

bool OutboxDispatcher::complete_grouped_failure(const QueuedEvent& queued,
                                                const internal::StatusChange& change) {
  using Outcome = internal::StatusChange::Outcome;
  const EventEnvelope& event = queued.envelope;
  const std::string& id = event.event_id();
  const bool dead = change.outcome == Outcome::Dead;
  GroupFailurePolicy policy = GroupFailurePolicy::Block;
  if (dead && options_.group_failure_policy) {
    try {
      policy = options_.group_failure_policy(event);
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("group_failure_policy threw (blocking): ") + e.what());
    }
  }
  // The row was read, not locked (GroupStore::claim): it is locked here under its partition's
  // lease and its failure written in the same transaction, the lease row share-locked by the
  // lock's fence until the commit, so no takeover lands in between: a relay deposed meanwhile
  // writes nothing (the new holder may be delivering the row already).
  bool written = false;
  int dead_letters = 0;
  bool failed = false;
  const auto write = [&](sql::Connection& conn, const LeaseToken& lease) {
    conn.begin();
    try {
      const auto now = options_.clock->now();
      if (options_.group_store->hold(conn, id, lease, options_.claim_owner, now)) {
        if (!dead) {
          status_writer_->write_in(conn, id, change);
          written = true;
        } else if (policy == GroupFailurePolicy::Skip) {
          written = options_.store->mark_dead(conn, id, now, change.message, true,
                                              options_.claim_owner) == 1;
        } else if (policy == GroupFailurePolicy::Block) {
          written = options_.group_store->block(conn, id, *event.message_group(), change.message,
                                                now, options_.claim_owner);
        } else {
          dead_letters = options_.group_store->dead_letter(
              conn, id, *event.message_group(), change.message, now, options_.claim_owner);
          written = dead_letters > 0;
        }
      }
      conn.commit();
    } catch (...) {
      written = false;
      dead_letters = 0;
      try {
        conn.rollback();
      } catch (const std::exception&) {
        // The original error is the one worth reporting.
      }
      throw;
    }
  };
  try {
    if (const auto lease = lease_for(queued)) {
      auto conn = options_.connection_provider->acquire();
      // A deadlock or serialization failure says nothing about the values: the transaction once
      // more (twice at most, as the status writer does for a single write).
      for (int attempt = 1;; ++attempt) {
        try {
          write(*conn, *lease);
          break;
        } catch (const StoreError& e) {
          const bool transient = e.sqlstate() == "40P01" || e.sqlstate() == "40001";
          if (attempt >= 3 || !transient || conn->is_broken()) {
            throw;
          }
        }
      }
    }
  } catch (const std::exception& e) {
    failed = true;
    options_.metrics->increment_status_update_failure();
    log(LogLevel::Error, "OutboxDispatcher: could not record the outcome of event " + id +
                             " of message group '" + *event.message_group() +
                             "' (the row stays pending): " + e.what());
  }
  if (!written && !failed) {
    log(LogLevel::Warning, "event " + id +
                               ": its partition was handed over (or the row settled) before its "
                               "failure was recorded; left to the partition's holder");
  }
  finish(id);
  if (!dead) {
    options_.metrics->increment_dispatch_failure();
    log(LogLevel::Warning,
        "event " + id + " (" + event.event_type() + ") failed, will retry: " + change.message);
    return false;
  }
  const std::string what = "event " + id + " (" + event.event_type() + ") of message group '" +
                           *event.message_group() + "' failed for good: " + change.message;
  switch (policy) {
    case GroupFailurePolicy::Skip:
      log(LogLevel::Error, what + "; DEAD, the group goes on (skip)");
      break;
    case GroupFailurePolicy::Block:
      log(LogLevel::Error, what +
                               "; the group is blocked until an operator acts (outbox "
                               "groups retry|skip-head|dead-letter)");
      break;
    case GroupFailurePolicy::DeadLetterGroup:
      log(LogLevel::Error, what + "; it and the group's " +
                               std::to_string(std::max(0, dead_letters - 1)) +
                               " pending events are DEAD (dead_letter_group)");
      break;
  }
  if (policy == GroupFailurePolicy::Block) {
    options_.metrics->increment_dispatch_failure();
  } else {
    options_.metrics->increment_dispatch_dead();
  }
  return written && policy == GroupFailurePolicy::Skip;
}

void OutboxDispatcher::end_group(const std::string& group, bool go_on) {
  {
    std::lock_guard lock(queue_mutex_);
    auto dropped = queue_->end_group(group, !go_on);
    for (const auto& e : dropped) {
      forget(e.envelope.event_id());
    }
    if (!go_on) {
      // A scan that read the rows behind the failed head before it failed must not queue them:
      // they wait in the table until the head is done.
      ledger_->invalidate_group(group);
    }
    if (queue_->empty()) {
      drained_.notify_all();
    }
  }
  work_ready_.notify_one();  // one more take is possible: the group again, or another group
  notify_group_freed();
}

void OutboxDispatcher::notify_group_freed() {
  if (options_.group_ended && group_freed_.exchange(false)) {
    options_.group_ended();
  }
}

bool OutboxDispatcher::group_busy(const std::string& group) const {
  std::lock_guard lock(queue_mutex_);
  return group_load_.contains(group);
}

std::size_t OutboxDispatcher::grouped_held() const {
  std::lock_guard lock(queue_mutex_);
  return grouped_.size();
}

std::size_t OutboxDispatcher::partition_load(int partition) const {
  std::lock_guard lock(queue_mutex_);
  const auto it = partition_load_.find(partition);
  return it == partition_load_.end() ? 0 : it->second;
}

void OutboxDispatcher::drop_partition(int partition) {
  std::lock_guard lock(queue_mutex_);
  for (const auto& e : queue_->drop_partition(partition)) {
    forget(e.envelope.event_id());
  }
  if (queue_->empty()) {
    drained_.notify_all();
  }
}

std::size_t OutboxDispatcher::active_groups() const {
  std::lock_guard lock(queue_mutex_);
  return queue_->active_groups();
}

std::size_t OutboxDispatcher::max_active_groups_seen() const {
  std::lock_guard lock(queue_mutex_);
  return max_active_groups_;
}

}  // namespace outbox
