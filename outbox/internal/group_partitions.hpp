#pragma once
// The partitions of message groups this node delivers: leased ("part:<n>") and spread over the
// live members by a balancer, claimed by the poller through scans bounded per cycle, and handed
// back only after the dispatcher holds nothing of them. Internal to Outbox.

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "outbox/envelope.hpp"
#include "outbox/groups.hpp"
#include "outbox/internal/lease_balancer.hpp"
#include "outbox/internal/periodic_worker.hpp"

namespace outbox {
class LeaseManager;
class OutboxDispatcher;
}  // namespace outbox

namespace outbox::internal {

class GroupPartitions {
 public:
  struct Options {
    std::shared_ptr<LeaseManager> leases;
    std::shared_ptr<GroupStore> store;
    std::string owner;  ///< the claim owner rows are stamped with
    int per_group = 10;
  };
  explicit GroupPartitions(Options options);
  ~GroupPartitions();
  GroupPartitions(const GroupPartitions&) = delete;
  GroupPartitions& operator=(const GroupPartitions&) = delete;

  /// The dispatcher whose load decides hand-overs; set once before start(). Must outlive close().
  void set_dispatcher(OutboxDispatcher* dispatcher) { dispatcher_ = dispatcher; }
  /// The poller to wake when a partition is gained.
  void set_wake(std::function<void()> wake) { wake_ = std::move(wake); }
  /// Announces this node as a member and starts the balancer (and the lease manager).
  void start();
  /// Stops the balancer; no partition is taken any more. Idempotent.
  void stop();
  /// Hands back every partition and the member lease (after the dispatcher drained). Idempotent.
  void release_all();

  /// True while this node may deliver events of `partition` (held, not being handed back).
  bool held(int partition) const;
  /// The poller's claim: due group heads and up to per_group rows behind each, in the partitions
  /// held, at most `limit` rows, reading at most a bounded number of rows per call.
  std::vector<OutboxEvent> claim(sql::Connection& conn, Timestamp now, int limit);

 private:
  class Partition;
  void balance();

  Options options_;
  OutboxDispatcher* dispatcher_ = nullptr;
  std::function<void()> wake_;
  std::vector<std::unique_ptr<Partition>> partitions_;
  LeaseBalancer balancer_;  // the balancer thread's own
  // The poller's own: where each partition's next scan resumes, and the next partition to read.
  std::array<std::string, kMessageGroupPartitions> cursors_;
  int next_partition_ = 0;
  std::mutex stop_mutex_;  // guards started_, stopped_, released_
  bool started_ = false;
  bool stopped_ = false;
  bool released_ = false;
  std::unique_ptr<PeriodicWorker> thread_;  // last: stopped first
};

}  // namespace outbox::internal
