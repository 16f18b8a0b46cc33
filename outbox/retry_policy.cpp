#include "outbox/retry_policy.hpp"

#include <algorithm>
#include <stdexcept>

namespace outbox {

ExponentialBackoffRetryPolicy::ExponentialBackoffRetryPolicy(std::chrono::milliseconds base,
                                                             std::chrono::milliseconds max,
                                                             bool jitter)
    : base_(base), max_(max), jitter_(jitter), rng_(std::random_device{}()) {
  if (base_.count() <= 0) {
    throw std::invalid_argument("ExponentialBackoffRetryPolicy: base must be positive");
  }
  if (max_ < base_) {
    throw std::invalid_argument("ExponentialBackoffRetryPolicy: max must be >= base");
  }
}

std::chrono::milliseconds ExponentialBackoffRetryPolicy::compute_delay(int attempts) const {
  const int exponent = std::clamp(attempts - 1, 0, 40);
  const double raw = static_cast<double>(base_.count()) * static_cast<double>(1LL << exponent);
  double delay = std::min(static_cast<double>(max_.count()), raw);
  if (jitter_) {
    std::uniform_real_distribution<double> dist(0.5, 1.5);
    std::lock_guard lock(rng_mutex_);
    // The cap holds with the jitter included: backoff_max is the longest any retry waits.
    delay = std::min(static_cast<double>(max_.count()), delay * dist(rng_));
  }
  return std::chrono::milliseconds(static_cast<std::int64_t>(delay));
}

}  // namespace outbox
