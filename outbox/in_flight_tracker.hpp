#pragma once
// In-memory deduplication of events queued or being processed in this process.

#include <chrono>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "outbox/clock.hpp"

namespace outbox {

/// Implementations must be thread-safe.
class InFlightTracker {
 public:
  virtual ~InFlightTracker() = default;
  /// False when `event_id` is already tracked.
  virtual bool try_acquire(std::string_view event_id) = 0;
  virtual void release(std::string_view event_id) = 0;
  /// True when `event_id` is tracked.
  virtual bool contains(std::string_view event_id) const = 0;
};

/// Hash-map tracker; with a TTL an entry older than it may be acquired again (recovery from a stuck
/// worker). Thread-safe.
class DefaultInFlightTracker final : public InFlightTracker {
 public:
  explicit DefaultInFlightTracker(std::optional<std::chrono::milliseconds> ttl = std::nullopt,
                                  std::shared_ptr<Clock> clock = Clock::system());
  bool try_acquire(std::string_view event_id) override;
  void release(std::string_view event_id) override;
  bool contains(std::string_view event_id) const override;
  std::size_t size() const;

 private:
  struct Hash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::optional<std::chrono::milliseconds> ttl_;
  std::shared_ptr<Clock> clock_;
  mutable std::mutex entries_mutex_;  // guards entries_
  std::unordered_map<std::string, Timestamp, Hash, std::equal_to<>> entries_;
};

}  // namespace outbox
