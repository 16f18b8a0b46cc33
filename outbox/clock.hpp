#pragma once
// Time seam: every component reads the time through a Clock so tests can control it.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

namespace outbox {

using Timestamp = std::chrono::system_clock::time_point;

/// Source of wall-clock time. Implementations must be thread-safe.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual Timestamp now() const = 0;
  /// The system clock, shared.
  static std::shared_ptr<Clock> system();
};

/// The longest duration any option accepts (3650 days): beyond it, arithmetic with nanosecond
/// time points would wrap (a retention that wraps deletes everything, a wait that wraps spins).
inline constexpr std::chrono::milliseconds kMaxDuration{std::chrono::hours(24 * 3650)};

/// Microseconds since the Unix epoch, the unit timestamps are stored in.
inline std::int64_t to_micros(Timestamp t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(t.time_since_epoch()).count();
}

/// Inverse of to_micros.
inline Timestamp from_micros(std::int64_t us) {
  return Timestamp(std::chrono::duration_cast<Timestamp::duration>(std::chrono::microseconds(us)));
}

/// RFC 3339 in UTC with microseconds, e.g. "2026-11-22T14:15:45.123456Z".
std::string format_rfc3339(Timestamp t);

}  // namespace outbox
