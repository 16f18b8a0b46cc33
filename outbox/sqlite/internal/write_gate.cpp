#include "outbox/sqlite/internal/write_gate.hpp"

#include <algorithm>

#include "outbox/internal/writes_first.hpp"

namespace outbox::sqlite::internal {

bool WriteGate::take(std::chrono::milliseconds timeout) {
  return take(timeout, outbox::internal::WritesFirst::active() ? kFirst : kOthers);
}

void WriteGate::release() {
  owner_ = std::thread::id();
  free_.release();
}

bool WriteGate::take(std::chrono::milliseconds timeout, int tier) {
  if (owner_.load() == std::this_thread::get_id()) {
    return false;  // held through another connection: that one releases it
  }
  if (!outranked(tier) && free_.try_acquire()) {
    owner_ = std::this_thread::get_id();
    return true;
  }
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  // Only a wait that lasts longer: a take that gives up by then (timeout 0) never is.
  const auto passed_over = start + kPassedOverAfter;
  // Counted as waiting in its tier for the whole wait, not only while it tries the semaphore:
  // otherwise, while it waits behind a higher tier, a lower one passes it when that tier leaves.
  Waiting waiting(*this, tier);
  for (;;) {
    if (waiting.tier() < kPassedOver && timeout > kPassedOverAfter && Clock::now() >= passed_over) {
      waiting.move_to(kPassedOver);
    }
    // Woken at the deadline, or when it is passed over (to wait again in the higher tier).
    const auto until = waiting.tier() < kPassedOver ? std::min(deadline, passed_over) : deadline;
    if (outranked(waiting.tier())) {
      std::unique_lock lock(mutex_);
      if (!changed_.wait_until(lock, until, [&] { return !outranked(waiting.tier()); })) {
        if (Clock::now() >= deadline) {
          return false;
        }
        continue;
      }
    }
    if (!free_.try_acquire_until(until)) {
      if (Clock::now() >= deadline) {
        return false;
      }
      continue;
    }
    if (!outranked(waiting.tier())) {
      owner_ = std::this_thread::get_id();
      return true;
    }
    // One of a higher tier began waiting while this thread did: the semaphore woke this one, the
    // turn is theirs.
    free_.release();
  }
}

void WriteGate::Waiting::move_to(int tier) {
  gate_.enter(tier);
  gate_.leave(tier_);
  tier_ = tier;
}

void WriteGate::leave(int tier) {
  waiting_[tier].fetch_sub(1);
  if (tier > kOthers) {  // nobody waits for the lowest tier to leave
    {
      std::lock_guard lock(mutex_);  // the others check waiting_ under it, then wait
    }
    changed_.notify_all();
  }
}

bool WriteGate::outranked(int tier) const {
  for (int t = tier + 1; t <= kCheckpoint; ++t) {
    if (waiting_[t].load() != 0) {
      return true;
    }
  }
  return false;
}

}  // namespace outbox::sqlite::internal
