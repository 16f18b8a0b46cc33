#include "outbox/internal/group_partitions.hpp"

#include <algorithm>
#include <stdexcept>

#include "outbox/dispatcher.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/log.hpp"

namespace outbox::internal {
namespace {

// Rows of grouped pending events read per claim, whatever `limit` is: one large group (or many
// blocked ones) costs at most this much of one cycle; the next cycle reads on from after it.
constexpr int kMinScanBudget = 500;
constexpr int kScanBudgetPerRow = 20;
// Rows written without a partition (outside writers) assigned per cycle.
constexpr int kAssignPerCycle = 500;

}  // namespace

class GroupPartitions::Partition final : public LeaseBalancer::Item {
 public:
  Partition(GroupPartitions& owner, int number)
      : owner_(owner), number_(number), lease_(partition_lease_name(number)) {}

  const std::string& lease() const override { return lease_; }
  bool held() const override {
    return draining_.load() || owner_.options_.leases->token(lease_).has_value();
  }
  void gained() override {
    if (owner_.wake_) {
      owner_.wake_();
    }
  }
  void yield() override { draining_ = true; }

  int number() const { return number_; }
  bool deliverable() const {
    return !draining_.load() && owner_.options_.leases->token(lease_).has_value();
  }
  // Hands the lease back once nothing of the partition is held here any more.
  void drain() {
    if (!draining_.load()) {
      return;
    }
    owner_.dispatcher_->drop_partition(number_);
    if (owner_.dispatcher_->partition_load(number_) > 0) {
      return;  // running, or waiting for its DONE mark: the next round looks again
    }
    owner_.options_.leases->release(lease_);
    draining_ = false;
  }

 private:
  GroupPartitions& owner_;
  int number_;
  std::string lease_;
  std::atomic<bool> draining_{false};
};

GroupPartitions::GroupPartitions(Options options) : options_(std::move(options)) {
  if (!options_.leases || !options_.store) {
    throw std::invalid_argument("message groups: leases and store are required");
  }
  if (options_.per_group < 1 || options_.per_group > 1000) {
    throw std::invalid_argument("message groups: per_group must be 1 … 1000");
  }
  for (int p = 0; p < kMessageGroupPartitions; ++p) {
    partitions_.push_back(std::make_unique<Partition>(*this, p));
  }
  thread_ = std::make_unique<PeriodicWorker>(
      "group partitions", [this] { balance(); },
      [this] { return std::max(std::chrono::milliseconds(50), options_.leases->ttl() / 5); });
}

GroupPartitions::~GroupPartitions() {
  stop();
}

void GroupPartitions::start() {
  std::lock_guard lock(stop_mutex_);
  if (started_ || stopped_) {
    return;
  }
  started_ = true;
  options_.leases->keep(LeaseBalancer::member_lease(options_.leases->owner()));
  options_.leases->start();
  thread_->start();
}

void GroupPartitions::stop() {
  {
    std::lock_guard lock(stop_mutex_);
    stopped_ = true;
  }
  thread_->close();
}

void GroupPartitions::release_all() {
  {
    std::lock_guard lock(stop_mutex_);
    if (!started_ || released_) {
      return;
    }
    released_ = true;
  }
  stop();
  std::vector<std::string> names;
  for (const auto& p : partitions_) {
    if (p->held()) {
      names.push_back(p->lease());
    }
  }
  names.push_back(LeaseBalancer::member_lease(options_.leases->owner()));
  for (const auto& name : names) {
    try {
      options_.leases->release(name);
    } catch (const std::exception& e) {
      log(LogLevel::Warning, "releasing lease '" + name + "' failed: " + e.what());
    }
  }
}

bool GroupPartitions::held(int partition) const {
  return partition >= 0 && partition < kMessageGroupPartitions &&
         partitions_[static_cast<std::size_t>(partition)]->deliverable();
}

void GroupPartitions::balance() {
  try {
    std::vector<LeaseBalancer::Item*> items;
    for (auto& p : partitions_) {
      items.push_back(p.get());
    }
    balancer_.balance(*options_.leases, items);
    for (auto& p : partitions_) {
      p->drain();
    }
  } catch (const std::exception& e) {
    log(LogLevel::Warning, std::string("message group partitions: ") + e.what());
  }
}

std::vector<OutboxEvent> GroupPartitions::claim(sql::Connection& conn, Timestamp now, int limit) {
  options_.store->assign_partitions(conn, kAssignPerCycle);
  std::vector<OutboxEvent> out;
  int budget = std::max(kMinScanBudget, kScanBudgetPerRow * limit);
  for (int step = 0; step < kMessageGroupPartitions && budget > 0; ++step) {
    if (static_cast<int>(out.size()) >= limit) {
      break;
    }
    const int number = next_partition_;
    next_partition_ = (next_partition_ + 1) % kMessageGroupPartitions;
    auto& partition = *partitions_[static_cast<std::size_t>(number)];
    const auto token = options_.leases->token(partition.lease());
    if (!token || !partition.deliverable()) {
      continue;
    }
    auto& cursor = cursors_[static_cast<std::size_t>(number)];
    const int asked = budget;
    const auto rows = options_.store->scan(conn, number, cursor, asked, now);
    budget -= static_cast<int>(rows.size());
    // A short page reached the end: the next scan starts over; otherwise it resumes after the
    // last group read (whose head, first in its run, was seen).
    cursor = static_cast<int>(rows.size()) < asked ? std::string() : rows.back().message_group;
    std::vector<std::string> ids;
    const int room = limit - static_cast<int>(out.size());
    for (std::size_t i = 0; i < rows.size() && static_cast<int>(ids.size()) < room;) {
      const std::string& group = rows[i].message_group;
      const bool take = rows[i].due && !rows[i].blocked && !dispatcher_->group_busy(group);
      int taken = 0;
      for (; i < rows.size() && rows[i].message_group == group; ++i) {
        if (take && taken < options_.per_group && static_cast<int>(ids.size()) < room) {
          ids.push_back(rows[i].event_id);
          ++taken;
        }
      }
    }
    if (ids.empty()) {
      continue;
    }
    auto claimed = options_.store->claim(conn, *token, number, ids, options_.owner, now);
    for (auto& row : claimed) {
      out.push_back(std::move(row));
    }
  }
  return out;
}

}  // namespace outbox::internal
