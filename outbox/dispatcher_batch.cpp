// The dispatcher's batches: events taken together go to their batch listener in one call (per
// listener, queue order kept), the rest one by one; a batch is re-checked against acting().

#include <algorithm>

#include "outbox/dispatcher.hpp"
#include "outbox/listener.hpp"
#include "outbox/log.hpp"

namespace outbox {

bool OutboxDispatcher::left_for_holder(const QueuedEvent& queued) {
  if (acting()) {
    return false;
  }
  {
    std::lock_guard lock(queue_mutex_);
    ++inactive_dropped_;
  }
  finish(queued.envelope.event_id());
  return true;
}

bool OutboxDispatcher::process_batch(std::vector<QueuedEvent>& events) {
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
  // A batch takes a while: before each call it is asked again whether this process may still
  // deliver. One that lost its lease midway (paused, cut off) leaves the rest to the new holder.
  std::size_t left = 0;
  bool go_on = true;
  for (auto& [listener, members] : groups) {
    const auto& first = events[members.front()];
    if (!acting() || (first.partition && !options_.partition_held(*first.partition))) {
      for (std::size_t m : members) {
        finish(events[m].envelope.event_id());
        ++left;
      }
      std::lock_guard lock(queue_mutex_);
      inactive_dropped_ += members.size();
      continue;
    }
    std::vector<DeliveryResult> results(members.size());
    std::vector<const EventEnvelope*> batch;
    std::vector<std::size_t> batch_members;  // positions in `members` of the events in `batch`
    for (std::size_t k = 0; k < members.size(); ++k) {
      if (run_before(events[members[k]].envelope, results[k])) {
        batch.push_back(&events[members[k]].envelope);
        batch_members.push_back(k);
      }
    }
    if (!batch.empty()) {
      std::vector<DeliveryResult> returned;
      try {
        returned = (*listener)(batch);
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
    for (std::size_t k = 0; k < members.size(); ++k) {
      go_on = complete(events[members[k]], results[k]) && go_on;
    }
  }
  for (std::size_t i : singles) {
    if (left > 0 && events[i].envelope.message_group()) {
      finish(events[i].envelope.event_id());  // a group's events never run after one left
      ++left;
    } else if (left_for_holder(events[i])) {
      ++left;
    } else {
      go_on = process(events[i]) && go_on;
    }
  }
  if (left > 0) {
    log(LogLevel::Info, "OutboxDispatcher: not acting (lease lost); " + std::to_string(left) +
                            " taken events left in the table");
  }
  return go_on && left == 0;
}

}  // namespace outbox
