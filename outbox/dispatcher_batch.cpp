// The dispatcher's batches: events taken together go to their batch listener in one call per run
// of events with one listener, the rest one by one, all in queue order; each is re-checked
// against acting() and a grouped one against its partition's lease.

#include <chrono>
#include <unordered_set>

#include "outbox/dispatcher.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"

namespace outbox {

bool OutboxDispatcher::left_for_holder(const QueuedEvent& queued) {
  if (acting() && (!grouped(queued) || lease_for(queued))) {
    return false;
  }
  {
    std::lock_guard lock(queue_mutex_);
    ++inactive_dropped_;
  }
  finish(queued.envelope.event_id());
  return true;
}

void OutboxDispatcher::process_batch(std::vector<QueuedEvent>& events,
                                     std::unordered_set<std::string>& stopped) {
  // A take holds events queued for one batch listener, but the registry is asked again here: an
  // event whose lookup now fails or finds none goes one by one. The take is delivered in queue
  // order all the same, a batch call per run of events with one listener: delivering the batch
  // first would put a group's later events before an earlier one that went one by one.
  std::vector<std::shared_ptr<const BatchEventListener>> listener_of(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i].envelope;
    try {
      listener_of[i] = options_.listeners->batch_listener_for(e.aggregate_type(), e.event_type());
    } catch (const std::exception& ex) {
      log(LogLevel::Warning, std::string("batch_listener_for threw: ") + ex.what());
    } catch (...) {
      log(LogLevel::Warning, "batch_listener_for threw a non-standard exception");
    }
  }
  std::size_t left = 0;
  // Leaves an event in the table: its holder (or this process, later) delivers it. A message
  // group's later events in this take stay with it.
  const auto leave = [&](const QueuedEvent& queued) {
    finish(queued.envelope.event_id());
    ++left;
    if (const auto& group = queued.envelope.message_group()) {
      stopped.insert(*group);
    }
  };
  // A batch takes a while: before each call it is asked again whether this process may still
  // deliver. One that lost its lease midway (paused, cut off) leaves the rest to the new holder;
  // one that handed a group's partition over leaves that group's events.
  const auto deliver_batch = [&](const BatchEventListener& listener,
                                 const std::vector<std::size_t>& members) {
    const bool act = acting();
    std::vector<std::size_t> live;  // positions in `events` still to be delivered here
    for (std::size_t m : members) {
      const auto& queued = events[m];
      const auto& group = queued.envelope.message_group();
      if (!act || (group && stopped.contains(*group)) || (grouped(queued) && !lease_for(queued))) {
        leave(queued);
        std::lock_guard lock(queue_mutex_);
        ++inactive_dropped_;
      } else {
        live.push_back(m);
      }
    }
    std::vector<DeliveryResult> results(live.size());
    std::vector<const EventEnvelope*> batch;
    std::vector<std::size_t> batch_members;  // positions in `live` of the events in `batch`
    // An event an interceptor refused keeps its group's later events out of the call: they stay
    // in the table behind it, as a single's would.
    std::unordered_set<std::string> refused;
    std::vector<bool> held_back(live.size(), false);
    for (std::size_t k = 0; k < live.size(); ++k) {
      const auto& envelope = events[live[k]].envelope;
      const auto& group = envelope.message_group();
      if (group && refused.contains(*group)) {
        held_back[k] = true;
      } else if (run_before(envelope, results[k])) {
        batch.push_back(&envelope);
        batch_members.push_back(k);
      } else if (group) {
        refused.insert(*group);
      }
    }
    if (!batch.empty()) {
      std::vector<DeliveryResult> returned;
      try {
        returned = listener(batch);
        if (returned.size() != batch.size()) {
          throw std::logic_error("batch listener returned " + std::to_string(returned.size()) +
                                 " results for " + std::to_string(batch.size()) + " events");
        }
      } catch (...) {
        returned.assign(batch.size(), DeliveryResult::from_exception(std::current_exception()));
      }
      for (std::size_t j = 0; j < batch.size(); ++j) {
        results[batch_members[j]] = std::move(returned[j]);
      }
    }
    for (std::size_t k = 0; k < live.size(); ++k) {
      auto& queued = events[live[k]];
      const auto& group = queued.envelope.message_group();
      if (held_back[k]) {
        finish(queued.envelope.event_id());
        stopped.insert(*group);
        continue;
      }
      if (group && stopped.contains(*group) && !results[k].ok()) {
        // It failed behind its group's failure in this call (as a broker fails a key's later
        // events): no attempt of its own, so it can never block the group in its head's place
        // (nor re-block it after an operator's retry); it waits behind the head.
        results[k] = DeliveryResult::retry_later(
            std::chrono::milliseconds(1), "not delivered: an earlier event of message group '" +
                                              *group +
                                              "' failed in the same call: " + results[k].message);
      }
      if (!complete(queued, results[k]) && group) {
        stopped.insert(*group);
      }
    }
  };
  const auto deliver_single = [&](std::size_t i) {
    const auto& group = events[i].envelope.message_group();
    if (group && stopped.contains(*group)) {
      leave(events[i]);  // a group's events never run after one left or failed
    } else if (left_for_holder(events[i])) {
      ++left;
      if (group) {
        stopped.insert(*group);
      }
    } else if (!process(events[i]) && group) {
      stopped.insert(*group);
    }
  };
  for (std::size_t i = 0; i < events.size();) {
    if (!listener_of[i]) {
      deliver_single(i++);
      continue;
    }
    std::vector<std::size_t> members;
    const auto& listener = listener_of[i];
    for (; i < events.size() && listener_of[i] == listener; ++i) {
      members.push_back(i);
    }
    deliver_batch(*listener, members);
  }
  if (left > 0) {
    log(LogLevel::Info, "OutboxDispatcher: not acting (lease lost or partition handed over); " +
                            std::to_string(left) + " taken events left in the table");
  }
}

}  // namespace outbox
