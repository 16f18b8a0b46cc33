#pragma once
// The in-process queue of a SQLite pool's writers for the database's single write lock.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <semaphore>
#include <thread>

namespace outbox::sqlite::internal {

// SQLite has one write lock per database and its waiters poll for it (the busy handler sleeps
// between tries), so the lock sits free while they sleep. The connections of one pool queue on
// here first: the next writer of the process gets the lock as soon as it is released.
class WriteGate {
 public:
  // False when the gate stayed taken for `timeout`; a thread that holds it already never waits.
  bool take(std::chrono::milliseconds timeout);
  // The background checkpointer's turn, before every writer's: behind the outbox's own writers
  // writing in a loop (a backlog) it waited seconds for its turn and the WAL grew by hundreds of
  // MB (internal/wal_checkpointer.hpp).
  bool take_for_checkpoint(std::chrono::milliseconds timeout) { return take(timeout, kCheckpoint); }
  void release();
  // Threads waiting for the gate now (tests): writers served first or passed over, checkpointers,
  // the others.
  int waiting_writers() const { return waiting_[kFirst].load() + waiting_[kPassedOver].load(); }
  int waiting_checkpoints() const { return waiting_[kCheckpoint].load(); }
  int waiting_others() const { return waiting_[kOthers].load(); }

 private:
  // Who goes first: a thread waits while one of a higher tier waits. A writer that releases the
  // gate takes it again before a woken waiter runs, so threads writing in a loop (a service's
  // request threads) kept it for seconds from the outbox's threads that write now and then
  // (SQLite, 4 writers in the poller's process: the DONE marks waited 3 s, and the poller stopped
  // with its queue full of unmarked events). Within a tier no queue in arrival order (it cost the
  // writers a third of their rate here), but a waiter passed over for kPassedOverAfter goes
  // before its tier: two threads of one tier writing in a loop gave a third 1 turn in 3 s against
  // their 1,496, and it failed after its busy timeout.
  static constexpr int kOthers = 0;
  static constexpr int kFirst = 1;       // WritesFirst threads
  static constexpr int kPassedOver = 2;  // waited kPassedOverAfter already
  static constexpr int kCheckpoint = 3;
  static constexpr std::chrono::milliseconds kPassedOverAfter{50};
  using Clock = std::chrono::steady_clock;

  // A thread's place in waiting_ while it waits.
  class Waiting {
   public:
    Waiting(WriteGate& gate, int tier) : gate_(gate), tier_(tier) { gate_.enter(tier_); }
    ~Waiting() { gate_.leave(tier_); }
    Waiting(const Waiting&) = delete;
    Waiting& operator=(const Waiting&) = delete;
    int tier() const { return tier_; }
    void move_to(int tier);

   private:
    WriteGate& gate_;
    int tier_;
  };

  bool take(std::chrono::milliseconds timeout, int tier);
  void enter(int tier) { waiting_[tier].fetch_add(1); }
  void leave(int tier);
  bool outranked(int tier) const;

  // A semaphore rather than a timed_mutex: ThreadSanitizer does not see the lock
  // pthread_mutex_clocklock takes (it reported every release as an unlock of an unlocked mutex),
  // and a mutex with a condition variable handed over a quarter slower (the business transaction
  // alone, 4 writers: 42,500/s against 53,500–56,500/s with this).
  std::binary_semaphore free_{1};
  std::atomic<int> waiting_[kCheckpoint + 1] = {};  // threads of each tier waiting for the gate
  std::mutex mutex_;                                // for changed_ only
  std::condition_variable changed_;                 // a tier's waiting count went down
  std::atomic<std::thread::id> owner_;
};

}  // namespace outbox::sqlite::internal
