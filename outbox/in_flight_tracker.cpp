#include "outbox/in_flight_tracker.hpp"

#include <stdexcept>

namespace outbox {

DefaultInFlightTracker::DefaultInFlightTracker(std::optional<std::chrono::milliseconds> ttl,
                                               std::shared_ptr<Clock> clock)
    : ttl_(ttl), clock_(std::move(clock)) {
  if (ttl_ && ttl_->count() <= 0) {
    throw std::invalid_argument("DefaultInFlightTracker: ttl must be positive");
  }
  if (!clock_) {
    throw std::invalid_argument("DefaultInFlightTracker: clock is required");
  }
}

bool DefaultInFlightTracker::try_acquire(std::string_view event_id) {
  const auto now = ttl_ ? clock_->now() : Timestamp{};
  std::lock_guard lock(entries_mutex_);
  auto it = entries_.find(event_id);
  if (it == entries_.end()) {
    entries_.emplace(std::string(event_id), now);
    return true;
  }
  if (ttl_ && now - it->second >= *ttl_) {
    it->second = now;
    return true;
  }
  return false;
}

void DefaultInFlightTracker::release(std::string_view event_id) {
  std::lock_guard lock(entries_mutex_);
  auto it = entries_.find(event_id);
  if (it != entries_.end()) {
    entries_.erase(it);
  }
}

bool DefaultInFlightTracker::contains(std::string_view event_id) const {
  std::lock_guard lock(entries_mutex_);
  return entries_.find(event_id) != entries_.end();
}

std::size_t DefaultInFlightTracker::size() const {
  std::lock_guard lock(entries_mutex_);
  return entries_.size();
}

}  // namespace outbox
