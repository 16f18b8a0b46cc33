#pragma once
// A GroupStore that delegates to the engine's own and runs a hook after (or before) one of its
// statements, standing for another node, an operator or an outside writer acting at that very
// moment, or watching what a claim reads; and the fixture whose nodes use it.

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "outbox/sql/group_store.hpp"
#include "tests/support/group_fixture.hpp"

namespace outbox::testing {

class HookedGroupStore final : public GroupStore {
 public:
  explicit HookedGroupStore(std::shared_ptr<GroupStore> inner) : inner_(std::move(inner)) {}
  std::function<void(sql::Connection&)> after_assign;
  std::function<void(sql::Connection&, const std::vector<GroupScanRow>&)> after_read;
  std::function<void(sql::Connection&, const std::vector<std::pair<int, std::string>>&)>
      before_runs;
  // After runs() returned (before read_runs() asks which picked groups have rows without a
  // partition).
  std::function<void(sql::Connection&, const std::vector<std::pair<int, std::string>>&)> after_runs;
  // Before claim() reads its rows (after read_runs() asked about rows without a partition).
  std::function<void(sql::Connection&, const std::vector<std::string>&)> before_claim;
  // After claim() read its rows, before the claimed rows reach the dispatcher.
  std::function<void(const std::vector<OutboxEvent>&)> after_claim;
  // After hold() returned (before the failure it was taken for is written).
  std::function<void(sql::Connection&, std::string_view, bool)> after_hold;
  // Before scan() reads its ranges; after front() read its rows, with the rows it asked of each
  // partition (before after_read).
  std::function<void(const std::vector<GroupScanRange>&)> before_scan;
  std::function<void(const std::vector<GroupScanRow>&, int)> after_front;

  int assign_partitions(sql::Connection& c, const std::vector<LeaseToken>& leases,
                        int limit) override {
    const int n = inner_->assign_partitions(c, leases, limit);
    if (after_assign) {
      after_assign(c);
    }
    return n;
  }
  std::vector<GroupScanRow> scan(sql::Connection& c, const std::vector<GroupScanRange>& ranges,
                                 Timestamp now) override {
    if (before_scan) {
      before_scan(ranges);
    }
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
    if (after_front) {
      after_front(rows, rows_each);
    }
    if (after_read) {
      after_read(c, rows);
    }
    return rows;
  }
  std::vector<GroupScanRow> runs(sql::Connection& c,
                                 const std::vector<std::pair<int, std::string>>& groups,
                                 int per_group, Timestamp now) override {
    if (before_runs) {
      before_runs(c, groups);
    }
    auto rows = inner_->runs(c, groups, per_group, now);
    if (after_runs) {
      after_runs(c, groups);
    }
    return rows;
  }
  std::vector<std::string> unassigned(sql::Connection& c,
                                      const std::vector<std::string>& groups) override {
    return inner_->unassigned(c, groups);
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
                                 const std::vector<std::string>& ids) override {
    if (before_claim) {
      before_claim(c, ids);
    }
    auto rows = inner_->claim(c, leases, ids);
    if (after_claim) {
      after_claim(rows);
    }
    return rows;
  }
  bool hold(sql::Connection& c, std::string_view id, const LeaseToken& lease,
            std::string_view owner, Timestamp now) override {
    const bool held = inner_->hold(c, id, lease, owner, now);
    if (after_hold) {
      after_hold(c, id, held);
    }
    return held;
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

class HookedGroupFixture : public GroupFixture {
 protected:
  // The next node's store, hooked.
  HookedGroupStore& hooked_node(const std::string& name,
                                GroupFailurePolicy policy = GroupFailurePolicy::Block,
                                int max_attempts = 3) {
    std::shared_ptr<HookedGroupStore> hooked;
    wrap_groups_ = [&](std::shared_ptr<GroupStore> inner) {
      hooked = std::make_shared<HookedGroupStore>(std::move(inner));
      return hooked;
    };
    node(name, policy, max_attempts);
    wrap_groups_ = nullptr;
    hooked_.push_back(hooked);
    return *hooked;
  }

  std::vector<std::shared_ptr<HookedGroupStore>> hooked_;
};

}  // namespace outbox::testing
