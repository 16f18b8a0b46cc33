// What a claim reads where the engine keeps each partition's front (SQLite's index of grouped rows
// in insert order): a front that shows nothing able to move hides the groups behind it, so the
// claim that read it must also read that partition in key order, then and there.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/hooked_group_store.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;

class GroupFronts : public testing::HookedGroupFixture {};

// 40 groups of one partition whose heads keep failing (retried every 20 ms, never blocked) fill
// its front: due again after each backoff, they look able to move, but they fail again. Every
// claim that reads that front full of them reads the partition behind it in the same claim.
// (Taken for a front that moves, the partition was read behind it only by the claims that read
// every partition, one in four: 10 groups written after 3,000 such ones waited 73–284 cycles,
// and none came within 30 s under ThreadSanitizer.)
TEST_P(GroupFronts, AClaimThatReadsAFrontOfHeadsThatKeepFailingReadsThePartitionBehindIt) {
  if (GetParam().name != "sqlite") {
    GTEST_SKIP() << "not on " << GetParam().name << ": only SQLite's store reads fronts";
  }
  auto& hooks = hooked_node("node-a", GroupFailurePolicy::Block, 1000000);
  const int partition = message_group_partition("failing-0");
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < 40; ++i) {
    const std::string key = "failing-" + std::to_string(i);
    if (message_group_partition(key) == partition) {
      keys.push_back(key);
    }
  }
  std::mutex mutex;
  std::map<std::string, int> failed;  // per group
  fail_ = [&](const EventEnvelope& e) {
    std::lock_guard lock(mutex);
    ++failed[*e.message_group()];
    return true;
  };
  // Three times: the second failure is then written (a head that failed once moves on, by design).
  const auto every_one_failed_thrice = [&] {
    std::lock_guard lock(mutex);
    return failed.size() == keys.size() &&
           std::all_of(failed.begin(), failed.end(), [](const auto& f) { return f.second >= 3; });
  };
  // The claims' reads, on the poller's thread: a claim assigns first, reads fronts, then scans.
  std::atomic<bool> watching{false};
  bool front_full = false;  // this claim read the partition's front full
  std::atomic<int> read_behind{0};
  std::atomic<int> not_read_behind{0};
  hooks.after_assign = [&](sql::Connection&) {
    if (front_full) {
      ++not_read_behind;  // the claim ended without a scan
    }
    front_full = false;
  };
  hooks.after_front = [&](const std::vector<GroupScanRow>& rows) {
    front_full = watching && std::count_if(rows.begin(), rows.end(), [&](const auto& r) {
                               return r.partition == partition;
                             }) >= 16;
  };
  hooks.before_scan = [&](const std::vector<GroupScanRange>& ranges) {
    if (front_full) {
      const bool behind = std::any_of(ranges.begin(), ranges.end(),
                                      [&](const auto& r) { return r.partition == partition; });
      ++(behind ? read_behind : not_read_behind);
    }
    front_full = false;
  };
  insert_rows(*nodes_.front(), keys, 1);
  nodes_.front()->outbox->start();
  ASSERT_TRUE(wait_until(every_one_failed_thrice, 60s));
  watching = true;
  ASSERT_TRUE(wait_until([&] { return read_behind + not_read_behind >= 20; }, 60s))
      << read_behind.load() << " claims read behind the front, " << not_read_behind.load()
      << " did not";
  nodes_.front()->outbox->close();  // before the hooks' state goes
  EXPECT_EQ(not_read_behind.load(), 0) << read_behind.load() << " claims read behind the front";
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupFronts, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
