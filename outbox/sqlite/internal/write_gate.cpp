#include "outbox/sqlite/internal/write_gate.hpp"

#include <algorithm>

#include "outbox/internal/writes_first.hpp"

namespace outbox::sqlite::internal {

bool WriteGate::take(std::chrono::milliseconds timeout) {
  return take(timeout, outbox::internal::WritesFirst::active() ? kFirst : kOthers);
}

void WriteGate::release() {
  owner_ = std::thread::id();
  // A waiter is woken after a long hold, and whenever one above the lowest tier waits: the
  // threads of the lowest tier cannot take the gate before it then, so it would sit free until
  // that waiter's next look.
  const auto held = Clock::now().time_since_epoch().count() - taken_at_;
  hand_on(held >= Clock::duration(kPollFor).count() || outranked(kOthers));
}

bool WriteGate::take(std::chrono::milliseconds timeout, int tier) {
  if (owner_.load() == std::this_thread::get_id()) {
    return false;  // held through another connection: that one releases it
  }
  if (!outranked(tier) && free_.try_acquire()) {
    taken();
    return true;
  }
  const auto start = Clock::now();
  const auto deadline = start + timeout;
  // Only a wait that lasted that long: a take that gives up sooner (timeout 0) never is.
  const auto passed_over = start + kPassedOverAfter;
  // Counted as waiting in its tier for the whole wait, not only while it tries the semaphore:
  // otherwise, while it waits behind a higher tier, a lower one passes it when that tier leaves.
  Waiting waiting(*this, tier);
  for (;;) {
    if (waiting.tier() < kPassedOver && Clock::now() >= passed_over) {
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
    if (!acquire_until(until)) {
      if (Clock::now() >= deadline) {
        return false;
      }
      continue;
    }
    if (!outranked(waiting.tier())) {
      taken();
      return true;
    }
    // One of a higher tier began waiting while this thread did: the semaphore woke this one, the
    // turn is theirs.
    hand_on(true);
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

void WriteGate::taken() {
  owner_ = std::this_thread::get_id();
  taken_at_ = Clock::now().time_since_epoch().count();
}

void WriteGate::hand_on(bool wake) {
  // Without `wake` a sleeping waiter sees the gate free at its next look, within kPollFor.
  // Waking one on every release cost the writers' hot path its p99 (4 writers of one event a
  // transaction, SQLite: 220 → 420–500 µs from commit to listener): most woke to find the gate
  // taken again by the releaser's next transaction.
  free_.release();
  if (!wake) {
    return;
  }
  {
    // Under the lock a waiter holds from counting itself to its wait: it either saw the gate
    // free or is asleep by now.
    std::lock_guard lock(mutex_);
    if (sleepers_ == 0) {
      return;
    }
  }
  released_.notify_one();
}

bool WriteGate::acquire_until(Clock::time_point until) {
  // Not the semaphore's own timed wait: libstdc++ 12's sleeps half the time waited so far between
  // looks (up to 64 ms), so after a hold of 100–240 ms the gate sat free for 20 ms (median) and up
  // to 52 ms before the waiter took it, and among 12 threads the longest waiters looked least
  // often.
  if (free_.try_acquire()) {
    return true;
  }
  std::unique_lock lock(mutex_);
  ++sleepers_;
  bool got = false;
  while (!(got = free_.try_acquire())) {
    const auto now = Clock::now();
    if (now >= until) {
      break;
    }
    released_.wait_until(lock, std::min(until, now + Clock::duration(kPollFor)));
  }
  --sleepers_;
  return got;
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
