#pragma once
// Which events a dispatcher holds (reserved before commit, queued, running) and which completed
// while a poll cycle was reading: what keeps one node from delivering an event twice at once.
// Not thread-safe: the dispatcher calls it under its queue lock.

#include <chrono>
#include <cstdint>
#include <deque>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace outbox {
class InFlightTracker;
}

namespace outbox::internal {

class DeliveryLedger {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;

  /// `tracker` must outlive the ledger. With `track_claims`, reservations keep the time their
  /// row's claim was stamped (multi-node).
  DeliveryLedger(InFlightTracker& tracker, bool track_claims)
      : tracker_(tracker), track_claims_(track_claims) {}

  /// Reserves an event about to be committed; false if it is already held.
  bool reserve(std::string_view event_id, TimePoint claimed_at);
  /// Drops a reservation (its transaction rolled back).
  void release_reservation(std::string_view event_id);
  /// Consumes a reservation's claim time (the event is being queued).
  std::optional<TimePoint> take_reservation(const std::string& event_id);
  /// Holds an event that was not reserved; false if it is already held.
  bool acquire(std::string_view event_id);
  /// Lets go of an event that was never queued (refused after reservation or acquire).
  void release(std::string_view event_id);

  /// Why a polled event cannot be queued: nothing, completed since its scan began, or read by a
  /// scan that an ordered drop invalidated.
  enum class ColdCheck { Ok, CompletedDuringScan, ScanInvalidated };
  /// `group`: the event's message group, whose invalidation (invalidate_group) counts too.
  ColdCheck check_cold(const std::string& event_id, std::optional<std::uint64_t> scan_token,
                       const std::optional<std::string>& group = std::nullopt) const;

  /// A worker started running the event.
  void running(const std::string& event_id) { running_.insert(event_id); }
  /// The ids workers are running now.
  const std::unordered_set<std::string>& running_ids() const { return running_; }
  /// The event's status is written (or given up): it is no longer held, and scans that began
  /// before now must not queue it from a stale read.
  void finish(const std::string& event_id);

  /// Marks the start of a poll cycle; the token is for end_scan().
  std::uint64_t begin_scan();
  void end_scan(std::uint64_t token);
  /// Every scan begun so far read a queue that was dropped: what they still hand over is refused.
  void invalidate_scans() { scans_invalid_before_ = completion_seq_; }
  /// Every scan begun so far read a group whose waiting events were dropped (its head failed):
  /// what they still hand over of that group is refused. Call after finishing the dropped events.
  void invalidate_group(const std::string& group);

 private:
  InFlightTracker& tracker_;
  bool track_claims_;
  // When each reserved (written, not yet committed) event's claim was stamped (multi-node).
  std::unordered_map<std::string, TimePoint> reserved_at_;
  std::unordered_set<std::string> running_;
  std::uint64_t completion_seq_ = 0;
  std::multiset<std::uint64_t> active_scans_;
  std::deque<std::pair<std::uint64_t, std::string>> completed_log_;
  std::unordered_set<std::string> completed_ids_;
  std::uint64_t scans_invalid_before_ = 0;
  std::unordered_map<std::string, std::uint64_t> groups_invalid_before_;
};

}  // namespace outbox::internal
