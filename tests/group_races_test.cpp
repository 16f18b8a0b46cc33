// Message groups against what other processes do between a claim's statements: a store that
// delegates to the engine's own and runs a hook after one of them stands for another node, an
// operator or an outside writer acting at that very moment.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "outbox/sql/dialect.hpp"
#include "tests/support/group_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::wait_until;

class HookedGroupStore final : public GroupStore {
 public:
  explicit HookedGroupStore(std::shared_ptr<GroupStore> inner) : inner_(std::move(inner)) {}
  std::function<void(sql::Connection&)> after_assign;
  std::function<void(sql::Connection&, const std::vector<GroupScanRow>&)> after_read;
  std::function<void(sql::Connection&, const std::vector<std::string>&)> after_unassigned;

  int assign_partitions(sql::Connection& c, int limit) override {
    const int n = inner_->assign_partitions(c, limit);
    if (after_assign) {
      after_assign(c);
    }
    return n;
  }
  std::vector<GroupScanRow> scan(sql::Connection& c, const std::vector<GroupScanRange>& ranges,
                                 Timestamp now) override {
    auto rows = inner_->scan(c, ranges, now);
    if (after_read) {
      after_read(c, rows);
    }
    return rows;
  }
  bool has_fronts() const override { return inner_->has_fronts(); }
  std::vector<GroupScanRow> front(sql::Connection& c, const std::vector<int>& partitions,
                                  int rows_each, Timestamp now) override {
    auto rows = inner_->front(c, partitions, rows_each, now);
    if (after_read) {
      after_read(c, rows);
    }
    return rows;
  }
  std::vector<GroupScanRow> runs(sql::Connection& c,
                                 const std::vector<std::pair<int, std::string>>& groups,
                                 int per_group, Timestamp now) override {
    return inner_->runs(c, groups, per_group, now);
  }
  std::vector<std::string> unassigned(sql::Connection& c,
                                      const std::vector<std::string>& groups) override {
    auto waiting = inner_->unassigned(c, groups);
    if (after_unassigned) {
      after_unassigned(c, groups);
    }
    return waiting;
  }
  std::vector<std::string> blocked(sql::Connection& c,
                                   const std::vector<std::string>& groups) override {
    return inner_->blocked(c, groups);
  }
  std::vector<std::string> held_back(sql::Connection& c, const std::vector<std::string>& groups,
                                     const std::vector<std::string>& heads) override {
    return inner_->held_back(c, groups, heads);
  }
  int repartition(sql::Connection& c, const std::string& group) override {
    return inner_->repartition(c, group);
  }
  std::vector<OutboxEvent> claim(sql::Connection& c, const std::vector<LeaseToken>& leases,
                                 const std::vector<std::string>& ids, std::string_view owner,
                                 Timestamp now) override {
    return inner_->claim(c, leases, ids, owner, now);
  }
  bool block(sql::Connection& c, std::string_view id, std::string_view group,
             std::string_view error, Timestamp now, std::string_view owner) override {
    return inner_->block(c, id, group, error, now, owner);
  }
  int dead_letter(sql::Connection& c, std::string_view id, std::string_view group,
                  std::string_view error, Timestamp now, std::string_view owner) override {
    return inner_->dead_letter(c, id, group, error, now, owner);
  }
  std::vector<GroupInfo> list(sql::Connection& c, int limit) override {
    return inner_->list(c, limit);
  }
  std::optional<GroupInfo> find(sql::Connection& c, std::string_view group) override {
    return inner_->find(c, group);
  }
  bool retry(sql::Connection& c, std::string_view group, Timestamp now) override {
    return inner_->retry(c, group, now);
  }
  std::optional<std::string> skip_head(sql::Connection& c, std::string_view group,
                                       Timestamp now) override {
    return inner_->skip_head(c, group, now);
  }
  int dead_letter_group(sql::Connection& c, std::string_view group, Timestamp now) override {
    return inner_->dead_letter_group(c, group, now);
  }
  GroupStats stats(sql::Connection& c) override { return inner_->stats(c); }

 private:
  std::shared_ptr<GroupStore> inner_;
};

class GroupRaces : public testing::GroupFixture {
 protected:
  // The next node's store, hooked.
  HookedGroupStore& hooked_node(const std::string& name) {
    std::shared_ptr<HookedGroupStore> hooked;
    wrap_groups_ = [&](std::shared_ptr<GroupStore> inner) {
      hooked = std::make_shared<HookedGroupStore>(std::move(inner));
      return hooked;
    };
    node(name);
    wrap_groups_ = nullptr;
    hooked_.push_back(hooked);
    return *hooked;
  }
  // A row of `group` as an outside client writes it: (id, its number, with its partition or
  // without, the client not having computed it).
  struct OutsideRow {
    std::string id;
    int n;
    bool partitioned;
  };
  // `rows` of `group` in one statement, in that order.
  std::string outside_rows(const std::string& group, const std::vector<OutsideRow>& rows) const {
    const auto& engine = GetParam().name;
    const std::string now = engine == "sqlite"     ? "0"
                            : engine == "postgres" ? "now()"
                                                   : "UTC_TIMESTAMP(6)";
    std::string sql = "INSERT INTO " + table_ +
                      " (event_id, event_type, aggregate_type, payload, headers, status, "
                      "attempts, available_at, created_at, message_group, partition_no) VALUES ";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      sql += (i == 0 ? "('" : ", ('") + r.id + "', 'E', NULL, '{\"n\":" + std::to_string(r.n) +
             "}', NULL, 0, 0, " + now + ", " + now + ", '" + group + "', " +
             (r.partitioned ? std::to_string(message_group_partition(group)) : "NULL") + ")";
    }
    return sql;
  }
  // Two rows of `group`: #0 without a partition, #1 with it.
  std::string outside_rows(const std::string& group) const {
    return outside_rows(group, {{"m0", 0, false}, {"m1", 1, true}});
  }

  std::vector<std::shared_ptr<HookedGroupStore>> hooked_;
};

// A key's first row was written without a partition; its second, with it. The claim's read sees
// the second as the group's head; right then another node gives the first its partition, before
// this node asks whether the group still has rows without one. Found breaking order (the second
// row was claimed and delivered first); the runs are now read again after that question.
TEST_P(GroupRaces, ARowGivenItsPartitionByAnotherNodeAfterTheReadIsNotOvertaken) {
  auto& hooks = hooked_node("node-a");
  const std::string group = "outside-key";
  const int partition = message_group_partition(group);
  // 0: rows not written yet; 1: written, the first one kept without a partition at each
  // assignment (as if written just after it); 2: the read saw the second as the head and the
  // first was given its partition at once.
  std::atomic<int> stage{0};
  hooks.after_assign = [&](sql::Connection& c) {
    int zero = 0;
    if (stage.compare_exchange_strong(zero, 1)) {
      c.execute(outside_rows(group));
    } else if (stage.load() == 1) {
      c.execute("UPDATE " + table_ + " SET partition_no = NULL WHERE event_id = 'm0'");
    }
  };
  hooks.after_read = [&](sql::Connection& c, const std::vector<GroupScanRow>& rows) {
    for (const auto& r : rows) {
      int one = 1;
      if (r.message_group == group && r.event_id == "m1" && stage.compare_exchange_strong(one, 2)) {
        c.execute("UPDATE " + table_ + " SET partition_no = " + std::to_string(partition) +
                  " WHERE event_id = 'm0'");
      }
    }
  };
  nodes_.front()->outbox->start();
  ASSERT_TRUE(wait_until([&] { return ledger_.seen(group).size() == 2; }))
      << "stage " << stage.load();
  EXPECT_EQ(stage.load(), 2);  // the race was run
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// A group whose run ended with rows behind it (a follower) is claimed next without a scan, from
// the row its run's read saw behind it. Here that row goes DEAD (an operator skipped it) before
// the next claim, and right after that claim asked whether the group has rows without a
// partition, an outside writer adds two: #5 without one, #6 with it. The claim's read then
// begins at #6; were it claimed, it would overtake #5. It is not: the head is not the one seen,
// the group waits for a read of its own, and #5 goes first once it has its partition.
TEST_P(GroupRaces, AFollowerWhoseNextHeadMovedIsNotClaimedPastARowWithoutAPartition) {
  auto& hooks = hooked_node("node-a");
  const std::string group = "followed-key";
  std::vector<OutsideRow> first;
  for (int n = 0; n < per_group_; ++n) {
    first.push_back({"m" + std::to_string(n), n, true});
  }
  first.push_back({"skipped", 99, true});  // the row the first run's read sees behind it
  // 0: the first run not delivered yet; 1: delivered and the row behind it gone DEAD; 2: the
  // next claim asked about the group and the outside writer's rows were written right then.
  std::atomic<int> stage{0};
  hooks.after_assign = [&](sql::Connection& c) {
    int zero = 0;
    if (ledger_.seen(group).size() == static_cast<std::size_t>(per_group_) &&
        stage.compare_exchange_strong(zero, 1)) {
      c.execute("UPDATE " + table_ + " SET status = " + sql::status_sql(EventStatus::Dead) +
                " WHERE event_id = 'skipped'");
    }
  };
  hooks.after_unassigned = [&](sql::Connection& c, const std::vector<std::string>& asked) {
    int one = 1;
    if (std::find(asked.begin(), asked.end(), group) != asked.end() &&
        stage.compare_exchange_strong(one, 2)) {
      c.execute(
          outside_rows(group, {{"late-0", per_group_, false}, {"late-1", per_group_ + 1, true}}));
    }
  };
  nodes_.front()->pool->acquire()->execute(outside_rows(group, first));
  nodes_.front()->outbox->start();
  ASSERT_TRUE(wait_until([&] {
    return ledger_.seen(group).size() == static_cast<std::size_t>(per_group_ + 2);
  })) << "stage "
      << stage.load() << ", seen " << ledger_.seen(group).size();
  EXPECT_EQ(stage.load(), 2);  // the race was run
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupRaces, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
