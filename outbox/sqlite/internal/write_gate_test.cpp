#include "outbox/sqlite/internal/write_gate.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "outbox/internal/writes_first.hpp"
#include "tests/support/test_support.hpp"

namespace {

using namespace std::chrono_literals;
using outbox::sqlite::internal::WriteGate;

// Threads that each take the gate once (30 s at most) and note their turn.
class Turns {
 public:
  enum class Kind { Other, OutboxWriter, Checkpointer };
  explicit Turns(WriteGate& gate) : gate_(gate) {}
  std::thread start(const std::string& name, Kind kind) {
    return std::thread([this, name, kind] {
      std::optional<outbox::internal::WritesFirst> first;
      if (kind == Kind::OutboxWriter) {
        first.emplace();
      }
      const bool taken =
          kind == Kind::Checkpointer ? gate_.take_for_checkpoint(30s) : gate_.take(30s);
      if (taken) {
        {
          std::lock_guard lock(mutex_);
          order_.push_back(name);
        }
        gate_.release();
      }
    });
  }
  std::vector<std::string> order() {
    std::lock_guard lock(mutex_);
    return order_;
  }

 private:
  WriteGate& gate_;
  std::mutex mutex_;
  std::vector<std::string> order_;
};

TEST(SqliteWriteGate, TheCheckpointerGoesBeforeWritersServedFirst) {
  // Found breaking the guarded checkpointer: it queued with the outbox's own writers for the
  // pool's gate, and two of them writing in a loop (a backlog), with readers that never pause,
  // kept it out for 17 s while the WAL grew past 600 MB.
  WriteGate gate;
  ASSERT_TRUE(gate.take(0ms));
  Turns turns(gate);
  auto writer = turns.start("writer", Turns::Kind::OutboxWriter);
  ASSERT_TRUE(outbox::testing::wait_until([&] { return gate.waiting_writers() == 1; }));
  auto checkpointer = turns.start("checkpointer", Turns::Kind::Checkpointer);
  ASSERT_TRUE(outbox::testing::wait_until([&] { return gate.waiting_checkpoints() == 1; }));
  gate.release();
  writer.join();
  checkpointer.join();
  EXPECT_EQ(turns.order(), (std::vector<std::string>{"checkpointer", "writer"}));
}

// Two threads of one tier writing in a loop, and a third of the same tier that wants the gate
// once: found in the second hostile round of the WAL guard, the third got 1 turn in 3 s against
// their 1,496 and failed after its busy timeout (a releasing looper takes the gate again before
// a woken waiter runs).
void a_thread_of_one_tier_is_not_starved_by_loopers_of_it(bool writes_first) {
  WriteGate gate;
  std::atomic<bool> stop{false};
  std::atomic<int> turns{0};
  std::vector<std::thread> loopers;
  for (int i = 0; i < 2; ++i) {
    loopers.emplace_back([&] {
      std::optional<outbox::internal::WritesFirst> first;
      if (writes_first) {
        first.emplace();
      }
      while (!stop.load()) {
        if (gate.take(10s)) {
          turns.fetch_add(1);
          std::this_thread::sleep_for(2ms);  // a write transaction's hold of the lock
          gate.release();
        }
      }
    });
  }
  ASSERT_TRUE(outbox::testing::wait_until([&] { return turns.load() >= 20; }));
  bool taken = false;
  {
    std::optional<outbox::internal::WritesFirst> first;
    if (writes_first) {
      first.emplace();
    }
    // Several times its timeout's worth of the loopers' turns: without a bound on how long a
    // waiter can be passed over, this failed every time.
    for (int i = 0; i < 5 && !taken; ++i) {
      taken = gate.take(2s);
    }
    if (taken) {
      gate.release();
    }
  }
  stop = true;
  for (auto& t : loopers) {
    t.join();
  }
  EXPECT_TRUE(taken);
}

TEST(SqliteWriteGate, AWriterIsNotStarvedByWritersOfItsTierInALoop) {
  a_thread_of_one_tier_is_not_starved_by_loopers_of_it(false);
}

TEST(SqliteWriteGate, AnOutboxWriterIsNotStarvedByOutboxWritersInALoop) {
  a_thread_of_one_tier_is_not_starved_by_loopers_of_it(true);
}

// Found by the hostile round on the passed-over rule: a take that does not wait (timeout 0, a
// busy_timeout of 0) counted as passed over at once and went before a waiting outbox writer, in
// 10 rounds of 10 (the writer waited up to 5 s).
TEST(SqliteWriteGate, ATakeThatDoesNotWaitNeverGoesBeforeAWaitingOutboxWriter) {
  WriteGate gate;
  ASSERT_TRUE(gate.take(0ms));
  std::atomic<bool> writer_done{false};
  std::thread writer([&] {
    const outbox::internal::WritesFirst first;
    if (gate.take(30s)) {
      writer_done = true;
      gate.release();
    }
  });
  ASSERT_TRUE(outbox::testing::wait_until([&] { return gate.waiting_writers() == 1; }));
  std::atomic<bool> stop{false};
  std::atomic<int> before_writer{0};
  std::vector<std::thread> others;
  for (int i = 0; i < 4; ++i) {
    others.emplace_back([&] {
      while (!stop.load()) {
        if (gate.take(0ms)) {
          if (!writer_done.load()) {
            before_writer.fetch_add(1);
          }
          gate.release();
        }
      }
    });
  }
  gate.release();
  const bool served = outbox::testing::wait_until([&] { return writer_done.load(); });
  stop = true;
  for (auto& t : others) {
    t.join();
  }
  writer.join();
  EXPECT_TRUE(served);
  EXPECT_EQ(before_writer.load(), 0);
}

// Found by the same round: an outbox writer waiting behind a passed-over thread was not counted
// as waiting, so when that thread was done a plain writer woken with it went first (13 rounds of
// 60).
TEST(SqliteWriteGate, AnOutboxWriterBehindAPassedOverOneStillGoesBeforeOthers) {
  for (int round = 0; round < 10; ++round) {
    WriteGate gate;
    ASSERT_TRUE(gate.take(0ms));
    Turns turns(gate);
    auto passed_over = turns.start("passed over", Turns::Kind::Other);
    // A plain writer counts among the writers once it is passed over.
    ASSERT_TRUE(outbox::testing::wait_until([&] { return gate.waiting_writers() == 1; }));
    auto outbox_writer = turns.start("outbox writer", Turns::Kind::OutboxWriter);
    ASSERT_TRUE(outbox::testing::wait_until([&] { return gate.waiting_writers() == 2; }));
    auto other = turns.start("other", Turns::Kind::Other);
    ASSERT_TRUE(outbox::testing::wait_until([&] { return gate.waiting_others() == 1; }));
    gate.release();
    passed_over.join();
    outbox_writer.join();
    other.join();
    EXPECT_EQ(turns.order(), (std::vector<std::string>{"passed over", "outbox writer", "other"}))
        << "round " << round;
  }
}

}  // namespace
