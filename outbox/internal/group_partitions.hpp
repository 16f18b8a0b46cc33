#pragma once
// The partitions of message groups this node delivers: leased ("part:<n>") and spread over the
// live members by a balancer, claimed by the poller through scans bounded per cycle, and handed
// back only after the dispatcher holds nothing of them. Internal to Outbox.

#include <array>
#include <atomic>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "outbox/envelope.hpp"
#include "outbox/groups.hpp"
#include "outbox/internal/lease_balancer.hpp"
#include "outbox/internal/periodic_worker.hpp"
#include "outbox/poller.hpp"

namespace outbox {
class LeaseManager;
class OutboxDispatcher;
class OutboxStore;
class JsonCodec;
}  // namespace outbox

namespace outbox::internal {

class GroupPartitions {
 public:
  struct Options {
    std::shared_ptr<LeaseManager> leases;
    std::shared_ptr<GroupStore> store;
    std::shared_ptr<OutboxStore> outbox_store;  ///< settles rows that do not decode (skip)
    std::string owner;                          ///< the claim owner rows are stamped with
    int per_group = 10;
    std::size_t max_concurrent_groups = 64;
    const JsonCodec* codec = nullptr;                                    ///< decodes claimed rows
    std::function<GroupFailurePolicy(const EventEnvelope&)> on_failure;  ///< default Block
    std::shared_ptr<Clock> clock;  ///< default: Clock::system()
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
  /// The lease of `partition` while held() is true for it.
  std::optional<LeaseToken> lease(int partition) const;
  /// The poller's claim: due group heads and up to per_group rows behind each, in the partitions
  /// held, at most `limit` rows, the oldest heads first: read from each held partition's front
  /// (its first rows in insert order), from a bounded scan in key order where a front shows
  /// nothing that can move, and one fenced claim. Due means due when the reads start (after this
  /// node's other statements of the cycle).
  GroupClaim claim(sql::Connection& conn, int limit);
  /// A group stopped being held by the dispatcher: wakes the poller (its next events, or another
  /// group's now that there is room, may be claimed).
  void group_done();

 private:
  class Partition;
  // Groups picked by a claim: their partition and the rows to claim, head first.
  struct Pick {
    int partition;
    std::string group;
    std::vector<std::string> ids;
    bool front = false;  // from a front: the rows behind its head are read before the claim
    // After read_runs(): the row its read saw right behind its run, when that one was due.
    std::string next;
  };
  // A group whose last run here ended with rows behind it: the first of those, seen by that
  // run's read, is the head its next run must start with.
  struct Follower {
    int partition;
    std::string group;
    std::string head;
  };
  // One group's rows in a scan (rows[begin, end), head first).
  struct Run {
    std::size_t begin;
    std::size_t end;
    bool candidate;        // its own partition, not busy here, head due
    bool reached = false;  // looked at by pick: picked, or found blocked or waiting
    bool moving = false;   // running here, or picked by this claim
    bool front = false;    // read from a partition's front: its head and perhaps a few behind
  };
  // Groups asked about (blocked?) at least per statement.
  static constexpr int kMinGroupsAsked = 128;
  // Rows read from each held partition's front (its first rows in insert order) per claim: the
  // heads of its oldest groups, a row or two each when groups interleave.
  static constexpr int kFrontRows = 16;
  void balance();
  // Rows per partition for the next scan of `held`, to read about `budget` rows in all.
  int page_size(const std::vector<std::pair<int, LeaseToken>>& held, int budget) const;
  // The partitions held and deliverable, with their leases.
  std::vector<std::pair<int, LeaseToken>> held_partitions() const;
  // The runs of rows[from, rows.size()) (grouped by partition and group, each head first), in
  // that order; a group read in a partition that is not its own is repartitioned (and is no
  // candidate), and so is a group in `followed` (picked already, like a group running here).
  std::vector<Run> runs_of(sql::Connection& conn, const std::vector<GroupScanRow>& rows,
                           std::size_t from, bool front,
                           const std::unordered_set<std::string_view>& followed);
  // The partitions among `held` whose front came back full without a group that can move (each
  // run of it busy, not due, blocked, or with a head that keeps failing): what lies behind is
  // read by a scan in key order.
  std::vector<std::pair<int, LeaseToken>> clogged(
      sql::Connection& conn, const std::vector<std::pair<int, LeaseToken>>& held,
      const std::vector<GroupScanRow>& rows, const std::vector<Run>& runs);
  // Up to `groups` followers whose last run has ended (the oldest first), not blocked, as picks
  // whose head is the one their last read saw next: read_runs() checks it as it checks a scan's.
  // Drops the ones it returns or finds blocked.
  std::vector<Pick> followers(sql::Connection& conn, std::size_t groups);
  // Reads each pick's run again (its head and up to per_group rows, while due, and the row behind
  // them) and keeps at most `limit` rows in all, in pick order; a group whose head moved since it
  // was read is dropped, and so is one with a row not given its partition yet (asked after the
  // read: such a row may come before rows read).
  void read_runs(sql::Connection& conn, std::vector<Pick>& picks, int limit, Timestamp now);
  // The claimed `rows` (in the order of the picks' ids) of each pick's run up to its first row
  // the claim did not return.
  static std::vector<OutboxEvent> unbroken(const std::vector<Pick>& picks,
                                           std::vector<OutboxEvent> rows);
  // The due heads of candidate groups that are not blocked, the head due
  // longest first, and up to per_group rows behind each, at most `limit` rows (a front's group
  // counted as per_group); marks the runs reached, and those picked moving.
  std::vector<Pick> pick(sql::Connection& conn, const std::vector<GroupScanRow>& rows,
                         std::vector<Run>& runs, int limit);
  // Moves each scanned partition's cursor past what was looked at and notes what it read; true
  // when a partition's page came back full and was looked at whole (rows left).
  bool advance_cursors(const std::vector<std::pair<int, LeaseToken>>& held,
                       const std::vector<GroupScanRow>& rows, const std::vector<Run>& runs,
                       int per_partition);
  // Claimed rows as events, each with the epoch of the lease it was read under (`read_under`, by
  // partition); a row that does not decode is settled by its group's policy under that lease
  // and, unless it was skipped, the rest of its group is left for later.
  std::vector<ClaimedEvent> decode(sql::Connection& conn, const std::vector<OutboxEvent>& rows,
                                   const std::unordered_map<int, LeaseToken>& read_under,
                                   Timestamp now);
  // True when the group may go on (the row was skipped). Nothing is written once `read_under`
  // is no longer the partition's live holding.
  bool settle_undecodable(sql::Connection& conn, const OutboxEvent& row,
                          const LeaseToken& read_under, const std::string& error, Timestamp now);
  // Grouped events held here beyond which nothing more is claimed: the running groups' work and
  // as much again waiting its turn.
  std::size_t held_bound() const;

  Options options_;
  OutboxDispatcher* dispatcher_ = nullptr;
  std::function<void()> wake_;
  std::vector<std::unique_ptr<Partition>> partitions_;
  LeaseBalancer balancer_;  // the balancer thread's own
  // The poller's own: where each partition's next scan resumes.
  std::array<std::string, kMessageGroupPartitions> cursors_;
  double rows_per_claim_ = 20;  // rows the recent scans read per row they could claim
  double front_run_ = 0;        // rows the recent front groups' runs had (per_group at first)
  // The poller's own: followers, the oldest run first.
  std::deque<Follower> followers_;
  std::unordered_set<std::string> following_;  // the groups in followers_
  // Rows each partition's last scan read; -1: its page came back full, or not read yet.
  std::array<int, kMessageGroupPartitions> last_read_{};
  int idle_follow_ups_ = 0;   // cycles in a row that read full pages and claimed nothing
  unsigned claims_ = 0;       // claims that read partitions
  unsigned cycles_ = 0;       // claims, counted for the cycles that leave the followers out
  bool followed_up_ = false;  // the last claim asked for the next cycle at once
  std::mutex stop_mutex_;     // guards started_, stopped_, released_
  bool started_ = false;
  bool stopped_ = false;
  bool released_ = false;
  std::unique_ptr<PeriodicWorker> thread_;  // last: stopped first
};

}  // namespace outbox::internal
