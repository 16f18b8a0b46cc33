#include "outbox/in_flight_tracker.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <thread>

namespace {

class ManualClock final : public outbox::Clock {
 public:
  outbox::Timestamp now() const override { return t; }
  outbox::Timestamp t = outbox::from_micros(1'000'000);
};

TEST(DefaultInFlightTracker, AcquireOnceUntilReleased) {
  outbox::DefaultInFlightTracker t;
  EXPECT_TRUE(t.try_acquire("a"));
  EXPECT_FALSE(t.try_acquire("a"));
  EXPECT_TRUE(t.contains("a"));
  t.release("a");
  EXPECT_FALSE(t.contains("a"));
  EXPECT_TRUE(t.try_acquire("a"));
}

TEST(DefaultInFlightTracker, TtlLetsStaleEntriesBeReacquired) {
  auto clock = std::make_shared<ManualClock>();
  outbox::DefaultInFlightTracker t(std::chrono::milliseconds(100), clock);
  EXPECT_TRUE(t.try_acquire("a"));
  clock->t += std::chrono::milliseconds(99);
  EXPECT_FALSE(t.try_acquire("a"));
  clock->t += std::chrono::milliseconds(1);
  EXPECT_TRUE(t.try_acquire("a"));
}

TEST(DefaultInFlightTracker, ConcurrentAcquireHasOneWinner) {
  outbox::DefaultInFlightTracker t;
  std::atomic<int> wins{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      for (int k = 0; k < 1000; ++k) {
        if (t.try_acquire("id-" + std::to_string(k))) {
          ++wins;
        }
      }
    });
  }
  for (auto& th : threads) {
    th.join();
  }
  EXPECT_EQ(wins.load(), 1000);
  EXPECT_EQ(t.size(), 1000u);
}

}  // namespace
