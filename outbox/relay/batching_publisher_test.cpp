#include "outbox/relay/batching_publisher.hpp"

#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

namespace outbox::relay {
namespace {

// Records batch sizes; holds the first batch until released so that others queue up behind it.
class RecordingPublisher final : public Publisher {
 public:
  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override {
    std::unique_lock lock(mutex_);
    sizes_.push_back(batch.size());
    cv_.notify_all();
    if (sizes_.size() == 1) {
      cv_.wait(lock, [&] { return released_; });
    }
    std::vector<PublishResult> out;
    for (const auto& r : batch) {
      out.push_back(r.target == "bad" ? PublishResult::permanent("bad target")
                                      : PublishResult::ok());
    }
    return out;
  }
  void wait_first() {
    std::unique_lock lock(mutex_);
    cv_.wait(lock, [&] { return !sizes_.empty(); });
  }
  void release() {
    std::lock_guard lock(mutex_);
    released_ = true;
    cv_.notify_all();
  }
  std::vector<std::size_t> sizes() {
    std::lock_guard lock(mutex_);
    return sizes_;
  }

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<std::size_t> sizes_;
  bool released_ = false;
};

TEST(BatchingPublisher, CallersWaitingBehindABatchLeaveTogetherWithTheirOwnResults) {
  auto inner = std::make_shared<RecordingPublisher>();
  BatchingPublisher batching(inner, 4);
  auto e = EventEnvelope::of_json(EventType::of("T"), "{}");
  std::vector<PublishResult> first;
  std::thread t0([&] { first = batching.publish(std::vector<PublishRequest>{{&e, "x"}}); });
  inner->wait_first();
  // Six callers queue while the first batch is held: they leave as 4 + 2.
  std::vector<std::thread> callers;
  std::vector<PublishResult> results(6);
  std::atomic<int> queued{0};
  for (int i = 0; i < 6; ++i) {
    callers.emplace_back([&, i] {
      ++queued;
      results[i] = batching.publish(std::vector<PublishRequest>{{&e, i == 3 ? "bad" : "ok"}}).at(0);
    });
  }
  while (queued.load() < 6) {
    std::this_thread::yield();  // callers started; whether they queued yet does not matter
  }
  inner->release();
  t0.join();
  for (auto& c : callers) {
    c.join();
  }
  ASSERT_EQ(first.size(), 1u);
  EXPECT_TRUE(first[0].is_ok());
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(results[i].is_ok(), i != 3) << i;
  }
  auto sizes = inner->sizes();
  std::size_t total = 0;
  for (auto s : sizes) {
    EXPECT_LE(s, 4u);
    total += s;
  }
  EXPECT_EQ(total, 7u);
  EXPECT_LT(sizes.size(), 7u);  // at least some callers shared a batch
}

}  // namespace
}  // namespace outbox::relay
