#pragma once
// Hot and cold bounded queues drained by a worker pool that runs listeners and writes the outcome.
// Its parts live in outbox/internal: the queues (dispatch_queue), the delivery ledger, the outcome
// policy and status writer, the DONE flusher and the claim heartbeat; the writer's hot-path hook
// is in dispatcher_writer_hook.hpp.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/delivery_result.hpp"
#include "outbox/envelope.hpp"
#include "outbox/lease.hpp"
#include "outbox/queued_event.hpp"

namespace outbox {

namespace sql {
class Connection;
class ConnectionProvider;
}  // namespace sql
class OutboxStore;
class ListenerRegistry;
class InFlightTracker;
class RetryPolicy;
class MetricsExporter;
class EventInterceptor;
class GroupStore;
enum class GroupFailurePolicy;
namespace internal {
class DispatchQueue;
class DeliveryLedger;
class StatusWriter;
struct StatusChange;
class DoneFlusher;
class ClaimHeartbeat;
struct DispatcherLink;
}  // namespace internal

/// Runs listeners for queued events and records DONE / RETRY / DEAD. Thread-safe.
///
/// DONE marks are batched: workers hand finished ids to a flusher thread, which writes them in
/// one UPDATE per `done_batch_window` (or as soon as `done_batch_max` ids are waiting), so a
/// workload pays one status commit per window instead of one per event. On a database with one
/// writer at a time (SQLite) a poll cycle writes the waiting marks before a claim that follows
/// one that took rows; while it drains such a backlog the flusher leaves full batches to its next
/// cycle (write_done_marks, expect_done_writer). A crash loses the
/// ids not yet written (at most one window's worth); the poller delivers those again
/// (at-least-once).
///
/// An event is tracked from enqueue until its status is written, so the poller cannot queue it a
/// second time meanwhile; a poll cycle bracketed by begin_scan()/end_scan() also skips events that
/// completed after the cycle's query started (their row may have been read while still pending).
class OutboxDispatcher {
 public:
  struct Options {
    std::shared_ptr<sql::ConnectionProvider> connection_provider;  ///< required
    std::shared_ptr<OutboxStore> store;                            ///< required
    std::shared_ptr<ListenerRegistry> listeners;                   ///< required
    std::shared_ptr<InFlightTracker> in_flight_tracker;  ///< default: DefaultInFlightTracker
    std::shared_ptr<RetryPolicy> retry_policy;  ///< default: ExponentialBackoff(200 ms, 60 s)
    int max_attempts = 10;                      ///< >= 1; DEAD when reached
    int worker_count = 4;                       ///< >= 1
    std::size_t hot_queue_capacity = 1000;      ///< >= 1
    std::size_t cold_queue_capacity = 1000;     ///< >= 1
    std::shared_ptr<MetricsExporter> metrics;   ///< default: MetricsExporter::noop()
    std::vector<std::shared_ptr<EventInterceptor>>
        interceptors;  ///< before in order, after reversed
    /// How long close() lets workers drain; 0 … kMaxDuration.
    std::chrono::milliseconds drain_timeout{5000};
    /// How long the flusher gathers DONE marks before writing them (0: write at once). >= 0.
    std::chrono::microseconds done_batch_window{10000};  ///< 0 … 1 hour
    /// Write as soon as this many DONE marks wait (unless a poller draining a backlog writes them
    /// before its next claim, see write_done_marks). >= 1.
    std::size_t done_batch_max = 256;
    /// Events a worker takes from a queue at once; events whose registry entry has a batch
    /// listener reach it together (one call per listener, queue order kept), others go one by
    /// one. 1 (the default) never batches. >= 1.
    std::size_t max_batch_size = 1;
    std::shared_ptr<Clock> clock;  ///< default: Clock::system()
    /// Multi-node: the claim owner of this node. Outcomes are written only while it still holds
    /// the row's claim, so a node whose claim expired cannot overwrite another node's outcome.
    std::string claim_owner;
    /// Multi-node: the claim lease (> 0 with claim_owner). A heartbeat renews the claims of every
    /// queued and running event each quarter lease; an event whose claim is older than half the
    /// lease when a worker takes it (the heartbeat could not renew it) is dropped unprocessed,
    /// since another node may take it, and left in the table.
    std::chrono::milliseconds claim_timeout{0};
    /// Ordered mode (worker_count and max_batch_size 1): DONE is written before the next event
    /// starts; a RetryLater holds the worker and retries the event in place after its delay (at
    /// least 100 ms), so no later event overtakes it; a status write that fails drops the queued
    /// events, which the poller reads again in order.
    bool ordered = false;
    /// When set, events are delivered only while it returns true (a lease is held): an event a
    /// worker takes otherwise is left in the table unprocessed, and the hot path hands nothing
    /// over (see acting()).
    std::function<bool()> active;
    /// Message groups (docs/groups.md), > 0 turns them on: a group's events run one take at a
    /// time in queue order, at most this many groups at once; after an event of a group fails,
    /// the group's waiting events are dropped (the poller brings them back behind their head).
    /// 0: message groups are not scheduled apart. Not with ordered.
    std::size_t max_concurrent_groups = 0;
    /// Message groups: an event of a partition is delivered only while this returns the
    /// partition's lease (held here); otherwise it is left in the table. A failure is written
    /// under that lease (GroupStore::hold). Required with groups.
    std::function<std::optional<LeaseToken>(int partition)> partition_lease;
    /// Message groups: records groups blocked or dead-lettered by their failure policy. Required
    /// with groups.
    std::shared_ptr<GroupStore> group_store;
    /// Message groups: the policy for a head that failed for good; default Block.
    std::function<GroupFailurePolicy(const EventEnvelope&)> group_failure_policy;
    /// Message groups: called (no lock held) when a group stopped being held here (its last
    /// event's status written): its next events may be claimed.
    std::function<void()> group_ended;
  };

  /// Validates (std::invalid_argument naming the field). Starts no thread: events queued before
  /// start() wait for it.
  explicit OutboxDispatcher(Options options);
  /// Calls close().
  ~OutboxDispatcher();
  OutboxDispatcher(const OutboxDispatcher&) = delete;
  OutboxDispatcher& operator=(const OutboxDispatcher&) = delete;

  /// Queues an event from the after-commit path. True if queued or already tracked; false if the
  /// hot queue is full or the dispatcher is closing (the row stays for the poller). With
  /// `reserved`, the event was reserved before commit and the reservation is consumed (or released
  /// on refusal).
  bool enqueue_hot(QueuedEvent event, bool reserved = false);
  /// Marks an event that is about to be committed as in flight, so a poll cycle that sees the
  /// committed row before the after-commit hook runs leaves it to the hot path. False if it is
  /// already tracked. Pair with enqueue_hot(…, true) or release_reservation().
  bool reserve(std::string_view event_id);
  /// reserve() for a row inserted claimed by this node, whose claim was stamped no earlier than
  /// `claimed_at` (taken before the insert statement was sent).
  bool reserve(std::string_view event_id, std::chrono::steady_clock::time_point claimed_at);
  /// Drops a reservation (the transaction rolled back).
  void release_reservation(std::string_view event_id);
  /// Events dropped unprocessed because their claim may have expired (see claim_timeout).
  std::uint64_t expired_claims_dropped() const;
  /// False while Options::active says this process must not deliver (no lease held).
  bool acting() const { return !options_.active || options_.active(); }
  /// Events left in the table unprocessed because acting() was false when a worker took them.
  std::uint64_t inactive_dropped() const;
  /// Queues an event from the poller. True if queued, already tracked, or completed during the
  /// current scan; false if the cold queue is full or closing.
  bool enqueue_cold(QueuedEvent event);
  /// What enqueue_cold did: queued, dropped as a duplicate, or refused (full / closing).
  enum class EnqueueResult { Queued, Duplicate, Refused };
  /// enqueue_cold with the distinction between a new event and a duplicate.
  EnqueueResult try_enqueue_cold(QueuedEvent event);
  /// What enqueue_cold_all did: events taken (queued or duplicates) before the first refusal,
  /// and of those the ones queued.
  struct BatchEnqueued {
    std::size_t taken = 0;
    std::size_t queued = 0;
  };
  /// try_enqueue_cold for each event in order under one lock hold, stopping at the first
  /// refusal (it and the events after it stay in the table).
  BatchEnqueued enqueue_cold_all(std::vector<QueuedEvent> events);
  /// Events queued (hot and cold) plus max_batch_size per worker: an upper bound of the events
  /// held here.
  int in_memory() const;
  /// Free slots in the cold queue (0 when closing).
  int cold_queue_remaining_capacity() const;
  /// Message groups: true while events of `group` are held here (waiting, running, or waiting for
  /// their DONE mark to be written): the poller leaves the group alone meanwhile.
  bool group_busy(const std::string& group) const;
  /// Message groups: events of `partition` held here (waiting, running, or waiting for their DONE
  /// mark to be written). A partition is handed over only at 0.
  std::size_t partition_load(int partition) const;
  /// Message groups: grouped events held here (waiting, running, or waiting for their DONE mark).
  std::size_t grouped_held() const;
  /// Message groups: drops the waiting events of `partition` (handed over); they stay in the
  /// table for its next holder.
  void drop_partition(int partition);
  /// Message groups: groups running now, and the most ever running at once.
  std::size_t active_groups() const;
  std::size_t max_active_groups_seen() const;
  /// Writes the DONE marks waiting for the flusher on `conn`, on the calling thread (a poller
  /// about to claim). Never throws.
  void write_done_marks(sql::Connection& conn);
  /// `at_once`: a write_done_marks() call follows at once (a poller draining a backlog), so full
  /// batches may wait for it up to a window; false: the flusher writes them itself again.
  void expect_done_writer(bool at_once);
  /// Marks the start of a poll cycle; returns a token for end_scan().
  std::uint64_t begin_scan();
  /// Ends the poll cycle started with `token`.
  void end_scan(std::uint64_t token);
  /// Starts the workers, the DONE flusher and (multi-node) the claim heartbeat. Idempotent;
  /// throws std::logic_error after close().
  void start();
  /// Stops accepting events, lets workers drain for up to drain_timeout, then stops them after
  /// their current event. Events still queued stay in the table for the poller. Idempotent.
  void close();

 private:
  void worker_loop();
  // process and complete return true when the event's group (if any) may go on.
  bool process(QueuedEvent& event);
  // True, and the event left in the table unprocessed, when acting() is false now or a grouped
  // event's partition is no longer held under the holding it was read under.
  bool left_for_holder(const QueuedEvent& queued);
  // Adds to `stopped` the message groups that may not go on; events of a group already in it
  // are left in the table.
  void process_batch(std::vector<QueuedEvent>& events, std::unordered_set<std::string>& stopped);
  DeliveryResult run_listener(const EventEnvelope& event);
  bool run_before(const EventEnvelope& event, DeliveryResult& failure);
  bool complete(QueuedEvent& queued, const DeliveryResult& result);
  // A grouped event's failure (retry, or its group's policy once it failed for good), written
  // under its partition's lease. True when its group goes on (skip).
  bool complete_grouped_failure(const QueuedEvent& queued, const internal::StatusChange& change);
  // The lease of a grouped event's partition while the holding it was read under lasts.
  std::optional<LeaseToken> lease_for(const QueuedEvent& event) const;
  // Scheduled as a message group's: its partition's lease holds it.
  bool grouped(const QueuedEvent& event) const {
    return event.partition && options_.max_concurrent_groups > 0;
  }
  // After a worker ran a group's take: frees the group, dropping its waiting events unless
  // `go_on`.
  void end_group(const std::string& group, bool go_on);
  // Releases an event from the ledger and the partition counts (queue lock held).
  void forget(const std::string& event_id);
  // Calls group_ended once if a group stopped being held since the last call (no lock held).
  void notify_group_freed();
  void finish(const std::string& event_id);
  void on_done_batch(const std::vector<std::string>& ids, bool written);
  std::vector<std::string> held_claims();
  bool claim_lapsed(const QueuedEvent& event) const;
  void drop_queued(const std::string& head_id);
  EnqueueResult enqueue(QueuedEvent event, bool reserved);
  // Looks up the event's batch listener (the caller's code: called without the queue lock).
  void prepare(QueuedEvent& event) const;
  // Queues a prepared event (queue lock held).
  EnqueueResult admit(QueuedEvent event, bool reserved);

  Options options_;
  mutable std::mutex queue_mutex_;  // guards queue_, ledger_, the flags and counters below
  std::condition_variable work_ready_;
  std::condition_variable drained_;
  std::unique_ptr<internal::DispatchQueue> queue_;
  std::unique_ptr<internal::DeliveryLedger> ledger_;
  bool closing_ = false;
  bool abandon_ = false;
  std::uint64_t expired_dropped_ = 0;
  std::uint64_t inactive_dropped_ = 0;
  // Grouped events held here (waiting, running or waiting for their DONE mark): id → partition
  // and group, and the counts per partition and per group.
  std::unordered_map<std::string, std::pair<int, std::string>> grouped_;
  std::unordered_map<int, std::size_t> partition_load_;
  std::unordered_map<std::string, std::size_t> group_load_;
  std::atomic<bool> group_freed_{false};
  std::size_t max_active_groups_ = 0;
  std::unique_ptr<internal::StatusWriter> status_writer_;
  std::unique_ptr<internal::DoneFlusher> flusher_;
  std::unique_ptr<internal::ClaimHeartbeat> heartbeat_;
  std::mutex close_mutex_;  // serialises start() and close()
  bool started_ = false;
  std::vector<std::thread> workers_;
  // What the writer hook reaches the dispatcher through; cut when the dispatcher goes, so an open
  // transaction that commits later finds no dispatcher instead of a dangling one.
  std::shared_ptr<internal::DispatcherLink> link_;
  friend class DispatcherWriterHook;
};

}  // namespace outbox
