// What a claim reads where the engine keeps each partition's front (SQLite's index of grouped rows
// in insert order): a front that shows nothing able to move hides the groups behind it, so the
// claim that read it must also read that partition in key order, then and there.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
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
// claim that reads that front full of them reads the partition behind it in the same claim, and
// groups written behind them are delivered. (Taken for a front that moves, the partition was
// read behind it only by the claims that read every partition, one in four: 10 groups written
// after 3,000 such ones waited 73–284 cycles, and none came within 30 s under ThreadSanitizer.)
TEST_P(GroupFronts, AClaimThatReadsAFrontOfHeadsThatKeepFailingReadsThePartitionBehindIt) {
  if (GetParam().name != "sqlite") {
    GTEST_SKIP() << "not on " << GetParam().name << ": only SQLite's store reads fronts";
  }
  auto& hooks = hooked_node("node-a", GroupFailurePolicy::Block, 1000000);
  const int partition = message_group_partition("failing-0");
  const auto keys_of_partition = [&](const std::string& prefix, std::size_t n) {
    std::vector<std::string> keys;
    for (int i = 0; keys.size() < n; ++i) {
      if (message_group_partition(prefix + std::to_string(i)) == partition) {
        keys.push_back(prefix + std::to_string(i));
      }
    }
    return keys;
  };
  const auto failing = keys_of_partition("failing-", 40);
  const auto behind = keys_of_partition("behind-", 10);
  fail_ = [](const EventEnvelope& e) { return e.message_group()->starts_with("failing-"); };
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
  hooks.after_front = [&](const std::vector<GroupScanRow>& rows, int rows_each) {
    front_full = watching && std::count_if(rows.begin(), rows.end(), [&](const auto& r) {
                               return r.partition == partition;
                             }) == rows_each;
  };
  hooks.before_scan = [&](const std::vector<GroupScanRange>& ranges) {
    if (front_full) {
      const bool read = std::any_of(ranges.begin(), ranges.end(),
                                    [&](const auto& r) { return r.partition == partition; });
      ++(read ? read_behind : not_read_behind);
    }
    front_full = false;
  };
  // The poller and the workers use the hooks' state until the node is closed, also when an
  // assertion ends the test early.
  struct Closer {
    Outbox& outbox;
    ~Closer() { outbox.close(); }
  } closer{*nodes_.front()->outbox};
  insert_rows(*nodes_.front(), failing, 1);
  nodes_.front()->outbox->start();
  // Each head's second failure written (one that failed once moves on, by design), as the claim
  // reads it: attempts in the table, not the listener's calls (a failure whose hold lost the
  // lease is not written).
  const auto every_one_failed_twice = [&] {
    return nodes_.front()
               ->pool->acquire()
               ->query("SELECT count(*) FROM " + table_ +
                       " WHERE message_group LIKE 'failing-%' AND attempts >= 2")[0]
               .get_int(0) == static_cast<std::int64_t>(failing.size());
  };
  ASSERT_TRUE(wait_until(every_one_failed_twice, 60s));
  watching = true;
  ASSERT_TRUE(wait_until([&] { return read_behind + not_read_behind >= 20; }, 60s))
      << read_behind.load() << " claims read behind the front, " << not_read_behind.load()
      << " did not";
  insert_rows(*nodes_.front(), behind, 1);
  EXPECT_TRUE(wait_until(
      [&] {
        return std::all_of(behind.begin(), behind.end(),
                           [&](const auto& key) { return ledger_.seen(key).size() == 1; });
      },
      60s));
  nodes_.front()->outbox->close();
  EXPECT_EQ(not_read_behind.load(), 0) << read_behind.load() << " claims read behind the front";
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupFronts, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
