#include "outbox/internal/delivery_ledger.hpp"

#include "outbox/in_flight_tracker.hpp"

namespace outbox::internal {

bool DeliveryLedger::reserve(std::string_view event_id, TimePoint claimed_at) {
  if (!tracker_.try_acquire(event_id)) {
    return false;
  }
  if (track_claims_) {
    // The row's lease runs from its insert, however long the transaction stays open.
    reserved_at_.insert_or_assign(std::string(event_id), claimed_at);
  }
  return true;
}

void DeliveryLedger::release_reservation(std::string_view event_id) {
  reserved_at_.erase(std::string(event_id));
  tracker_.release(event_id);
}

std::optional<DeliveryLedger::TimePoint> DeliveryLedger::take_reservation(
    const std::string& event_id) {
  auto at = reserved_at_.find(event_id);
  if (at == reserved_at_.end()) {
    return std::nullopt;
  }
  const auto claimed_at = at->second;
  reserved_at_.erase(at);
  return claimed_at;
}

bool DeliveryLedger::acquire(std::string_view event_id) {
  return tracker_.try_acquire(event_id);
}

void DeliveryLedger::release(std::string_view event_id) {
  tracker_.release(event_id);
}

DeliveryLedger::ColdCheck DeliveryLedger::check_cold(
    const std::string& event_id, std::optional<std::uint64_t> scan_token,
    const std::optional<std::string>& group) const {
  if (completed_ids_.count(event_id) != 0) {
    return ColdCheck::CompletedDuringScan;  // its row may have been read while still pending
  }
  if (scan_token && *scan_token < scans_invalid_before_) {
    return ColdCheck::ScanInvalidated;
  }
  if (scan_token && group) {
    const auto it = groups_invalid_before_.find(*group);
    if (it != groups_invalid_before_.end() && *scan_token < it->second) {
      return ColdCheck::ScanInvalidated;
    }
  }
  return ColdCheck::Ok;
}

void DeliveryLedger::invalidate_group(const std::string& group) {
  if (!active_scans_.empty()) {
    groups_invalid_before_.insert_or_assign(group, completion_seq_);
  }
}

void DeliveryLedger::finish(const std::string& event_id) {
  running_.erase(event_id);
  ++completion_seq_;
  if (!active_scans_.empty()) {
    completed_log_.emplace_back(completion_seq_, event_id);
    completed_ids_.insert(event_id);
  }
  tracker_.release(event_id);
}

std::uint64_t DeliveryLedger::begin_scan() {
  active_scans_.insert(completion_seq_);
  return completion_seq_;
}

void DeliveryLedger::end_scan(std::uint64_t token) {
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
  std::erase_if(groups_invalid_before_, [&](const auto& g) { return g.second <= oldest; });
}

}  // namespace outbox::internal
