// Message groups' reads of the claim path on every engine: a partition's scan in group and insert
// order, resuming after a group; its front in insert order; each asked group's run; and the same
// rows whatever order an engine hands a UNION ALL's rows back in.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"
#include "tests/support/delegating_connection.hpp"
#include "tests/support/group_contract_fixture.hpp"

namespace outbox {
namespace {

using testing::grouped;
using testing::keys_of_partition;

class GroupReads : public testing::GroupContractFixture {};

TEST_P(GroupReads, AScanReadsAPartitionGroupByGroupInInsertOrderAndResumesAfterAGroup) {
  // Three keys of one partition, written interleaved.
  const auto keys = keys_of_partition("k", 7, 3);
  std::vector<EventEnvelope> events;
  for (int n = 0; n < 3; ++n) {
    for (const auto& key : keys) {
      events.push_back(grouped(key + "-" + std::to_string(n), key));
    }
  }
  for (const auto& e : events) {
    write({e});  // one transaction each: insert order is write order
  }
  std::vector<std::string> sorted = keys;
  std::sort(sorted.begin(), sorted.end());
  std::vector<std::string> expected;
  for (const auto& key : sorted) {
    for (int n = 0; n < 3; ++n) {
      expected.push_back(key + "-" + std::to_string(n));
    }
  }
  EXPECT_EQ(scan_ids(7), expected);
  EXPECT_EQ(scan_ids(7, sorted[0]), std::vector<std::string>(expected.begin() + 3, expected.end()));
  // Several partitions in one statement: range after range, each in its own order and limit.
  write({grouped("z-0", "zz"), grouped("z-1", "zz")});
  const int pz = message_group_partition("zz");
  if (pz != 7) {
    auto conn = pool_->acquire();
    std::vector<std::string> both;
    for (const auto& r : groups_->scan(*conn, {{pz, {}, 1}, {7, {}, 4}}, Clock::system()->now())) {
      both.push_back(r.event_id);
      EXPECT_TRUE(r.due);
    }
    EXPECT_EQ(both, (std::vector<std::string>{"z-0", expected[0], expected[1], expected[2],
                                              expected[3]}));
  }
  EXPECT_TRUE(scan_ids(8).empty() || message_group_partition(sorted[0]) != 8);
}

// A partition's front is its first pending rows in insert order, whatever their keys: each
// group's rows there are its oldest, head first. Runs are each group's first rows, group after
// group, in the order asked (padded statements return no row twice).
TEST_P(GroupReads, AFrontIsAPartitionsFirstRowsInInsertOrderAndRunsAreEachGroupsFirstRows) {
  const auto keys = keys_of_partition("f", 9, 3);
  // Written interleaved, the last key first: insert order differs from key order.
  std::vector<std::string> written;
  for (int n = 0; n < 4; ++n) {
    for (auto k = keys.rbegin(); k != keys.rend(); ++k) {
      written.push_back(*k + "-" + std::to_string(n));
      write({grouped(written.back(), *k)});
    }
  }
  write({grouped("other-0", "elsewhere")});
  const int other = message_group_partition("elsewhere");
  auto conn = pool_->acquire();
  const auto now = Clock::system()->now();
  std::vector<std::string> front;
  for (const auto& r : groups_->front(*conn, {9}, 5, now)) {
    front.push_back(r.event_id);
    EXPECT_EQ(r.partition, 9);
    EXPECT_TRUE(r.due);
  }
  EXPECT_EQ(front, std::vector<std::string>(written.begin(), written.begin() + 5));
  // Several partitions: one after the other, each its own rows.
  if (other != 9) {
    std::vector<std::string> both;
    for (const auto& r : groups_->front(*conn, {other, 9}, 2, now)) {
      both.push_back(r.event_id);
    }
    EXPECT_EQ(both, (std::vector<std::string>{"other-0", written[0], written[1]}));
  }
  // Runs: 3 groups ask for 4 arms (padded); each group's first rows, once, in the order asked.
  std::vector<std::string> run_ids;
  for (const auto& r : groups_->runs(*conn, {{9, keys[0]}, {9, keys[2]}, {9, keys[1]}}, 3, now)) {
    run_ids.push_back(r.event_id);
  }
  EXPECT_EQ(run_ids, (std::vector<std::string>{keys[0] + "-0", keys[0] + "-1", keys[0] + "-2",
                                               keys[2] + "-0", keys[2] + "-1", keys[2] + "-2",
                                               keys[1] + "-0", keys[1] + "-1", keys[1] + "-2"}));
  // More groups than one statement may hold (SQLite: 500 arms): all of them, in order.
  std::vector<EventEnvelope> many;
  std::vector<std::pair<int, std::string>> asked;
  for (int g = 0; g < 300; ++g) {
    const std::string key = "many-" + std::to_string(g);
    many.push_back(grouped(key + "-0", key));
    asked.emplace_back(message_group_partition(key), key);
  }
  write(many);
  const auto all = groups_->runs(*conn, asked, 2, now);
  ASSERT_EQ(all.size(), 300u);
  for (int g = 0; g < 300; ++g) {
    EXPECT_EQ(all[static_cast<std::size_t>(g)].event_id, "many-" + std::to_string(g) + "-0");
  }
  // Padded to a power of two up to 8 arms, to a multiple of 8 above: each group once, in order,
  // even when asked for twice (found breaking: its rows came back twice).
  for (const std::size_t n : {2, 5, 8, 9, 13, 17, 24, 127, 128, 129, 200}) {
    std::vector<std::pair<int, std::string>> first(asked.begin(), asked.begin() + n);
    for (const bool twice : {false, true}) {
      if (twice) {
        first.push_back(first.front());
      }
      const auto some = groups_->runs(*conn, first, 2, now);
      ASSERT_EQ(some.size(), n) << n << (twice ? " with the first asked again" : "");
      for (std::size_t g = 0; g < n; ++g) {
        EXPECT_EQ(some[g].event_id, "many-" + std::to_string(g) + "-0");
      }
    }
  }
  // A group in the wrong partition has no run there; DONE rows leave the front.
  EXPECT_TRUE(groups_->runs(*conn, {{9, "elsewhere"}}, 3, now).empty() || other == 9);
  store_->mark_done(*conn, written[0], now);
  EXPECT_EQ(groups_->front(*conn, {9}, 1, now).at(0).event_id, written[1]);
}

// SQL promises no order of a UNION ALL without an ORDER BY over the whole. Through a connection
// that hands a union's rows back reversed (as an engine may, e.g. from a parallel plan), the
// scan, the front and the runs read what they read through the engine's own order.
class ReversedUnions final : public testing::DelegatingConnection {
 public:
  using DelegatingConnection::DelegatingConnection;
  std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override {
    auto rows = inner().query(sql, params);
    if (sql.find("UNION ALL") != std::string_view::npos) {
      std::reverse(rows.begin(), rows.end());
    }
    return rows;
  }
};

TEST_P(GroupReads, TheGroupReadsDoNotDependOnTheOrderOfAUnionsRows) {
  const auto keys = keys_of_partition("u", 11, 3);
  for (int n = 0; n < 4; ++n) {
    for (const auto& key : keys) {
      write({grouped(key + "-" + std::to_string(n), key)});
    }
  }
  write({grouped("w-0", "unioned"), grouped("w-1", "unioned")});
  const int other = message_group_partition("unioned");
  ASSERT_NE(other, 11);
  auto conn = pool_->acquire();
  ReversedUnions reversed(*conn);
  const auto now = Clock::system()->now();
  const auto ids = [](const std::vector<GroupScanRow>& rows) {
    std::vector<std::string> out;
    for (const auto& r : rows) {
      out.push_back(r.event_id);
    }
    return out;
  };
  // A scan: partition after partition, each group's rows together and head first (the order of
  // the groups inside a partition is the engine's, under its collation).
  const auto by_partition_and_group = [](const std::vector<GroupScanRow>& rows) {
    std::vector<std::pair<int, std::map<std::string, std::vector<std::string>>>> out;
    std::string last;
    for (const auto& r : rows) {
      if (out.empty() || out.back().first != r.partition) {
        out.push_back({r.partition, {}});
        last.clear();
      }
      auto& group = out.back().second[r.message_group];
      EXPECT_TRUE(group.empty() || last == r.message_group)
          << r.message_group << "'s rows are not together";
      group.push_back(r.event_id);
      last = r.message_group;
    }
    return out;
  };
  const std::vector<GroupScanRange> ranges{{11, {}, 7}, {other, {}, 5}};
  const auto scanned = by_partition_and_group(groups_->scan(*conn, ranges, now));
  ASSERT_EQ(scanned.size(), 2U);
  EXPECT_EQ(by_partition_and_group(groups_->scan(reversed, ranges, now)), scanned);
  const std::vector<std::pair<int, std::string>> asked{
      {11, keys[2]}, {other, "unioned"}, {11, keys[0]}};
  const auto runs = ids(groups_->runs(*conn, asked, 3, now));
  EXPECT_EQ(runs.size(), 8U);
  EXPECT_EQ(ids(groups_->runs(reversed, asked, 3, now)), runs);
  if (groups_->has_fronts()) {
    EXPECT_EQ(ids(groups_->front(reversed, {other, 11}, 3, now)),
              ids(groups_->front(*conn, {other, 11}, 3, now)));
  }
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupReads, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
