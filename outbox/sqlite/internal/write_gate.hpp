#pragma once
// The in-process queue of a SQLite pool's writers for the database's single write lock.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <semaphore>
#include <thread>

#include "outbox/internal/writes_first.hpp"

namespace outbox::sqlite::internal {

// SQLite has one write lock per database and its waiters poll for it (the busy handler sleeps
// between tries), so the lock sits free while they sleep. The connections of one pool queue on
// here first: the next writer of the process gets the lock as soon as it is released.
class WriteGate {
 public:
  // False when the gate stayed taken for `timeout`; a thread that holds it already never waits.
  bool take(std::chrono::milliseconds timeout) {
    if (owner_.load() == std::this_thread::get_id()) {
      return false;  // held through another connection: that one releases it
    }
    const bool first = outbox::internal::WritesFirst::active();
    if ((first || waiting_first_.load() == 0) && free_.try_acquire()) {
      owner_ = std::this_thread::get_id();
      return true;
    }
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    bool taken;
    if (first) {
      waiting_first_.fetch_add(1);
      taken = free_.try_acquire_until(deadline);
      waiting_first_.fetch_sub(1);
      {
        std::lock_guard lock(mutex_);  // the others check waiting_first_ under it, then wait
      }
      served_.notify_all();
    } else {
      // A writer that releases the gate takes it again before a woken waiter runs, so threads
      // writing in a loop (a service's request threads) kept it for seconds from the outbox's
      // threads that write now and then (SQLite, 4 writers in the poller's process: the DONE
      // marks waited 3 s, and the poller stopped with its queue full of unmarked events). They
      // go first: the others wait until none of them waits. Fairness between the others is
      // not sought: a queue in arrival order cost the writers a third of their rate here.
      if (waiting_first_.load() != 0) {
        std::unique_lock lock(mutex_);
        if (!served_.wait_until(lock, deadline, [&] { return waiting_first_.load() == 0; })) {
          return false;
        }
      }
      taken = free_.try_acquire_until(deadline);
    }
    if (taken) {
      owner_ = std::this_thread::get_id();
    }
    return taken;
  }
  void release() {
    owner_ = std::thread::id();
    free_.release();
  }

 private:
  // A semaphore rather than a timed_mutex: ThreadSanitizer does not see the lock
  // pthread_mutex_clocklock takes (it reported every release as an unlock of an unlocked mutex),
  // and a mutex with a condition variable handed over a quarter slower (the business transaction
  // alone, 4 writers: 42,500/s against 53,500–56,500/s with this).
  std::binary_semaphore free_{1};
  std::atomic<int> waiting_first_{0};  // WritesFirst threads waiting for the gate
  std::mutex mutex_;                   // for served_ only
  std::condition_variable served_;     // waiting_first_ went down
  std::atomic<std::thread::id> owner_;
};

}  // namespace outbox::sqlite::internal
