#pragma once
// Delay before the next attempt of a failed event.

#include <chrono>
#include <mutex>
#include <random>

namespace outbox {

/// Computes the delay after `attempts` failed attempts (1-based). Implementations must be
/// thread-safe.
class RetryPolicy {
 public:
  virtual ~RetryPolicy() = default;
  virtual std::chrono::milliseconds compute_delay(int attempts) const = 0;
};

/// min(max, base * 2^(attempts-1)) * jitter, jitter uniform in [0.5, 1.5), and never more than
/// max (the cap includes the jitter). Thread-safe.
class ExponentialBackoffRetryPolicy final : public RetryPolicy {
 public:
  /// Throws std::invalid_argument if base <= 0 or max < base.
  ExponentialBackoffRetryPolicy(std::chrono::milliseconds base = std::chrono::milliseconds(200),
                                std::chrono::milliseconds max = std::chrono::milliseconds(60000),
                                bool jitter = true);
  std::chrono::milliseconds compute_delay(int attempts) const override;

 private:
  std::chrono::milliseconds base_;
  std::chrono::milliseconds max_;
  bool jitter_;
  mutable std::mutex rng_mutex_;  // guards rng_
  mutable std::minstd_rand rng_;
};

}  // namespace outbox
