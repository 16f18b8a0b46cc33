#pragma once
// Hot and cold bounded queues drained by a worker pool that runs listeners and writes the outcome.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/envelope.hpp"
#include "outbox/writer.hpp"

namespace outbox {

namespace sql {
class ConnectionProvider;
}
class OutboxStore;
class ListenerRegistry;
class InFlightTracker;
class RetryPolicy;
class MetricsExporter;
class EventInterceptor;

/// A queue element.
struct QueuedEvent {
  enum class Source { Hot, Cold };
  EventEnvelope envelope;
  Source source = Source::Hot;
  int attempts = 0;  ///< attempts already recorded in the row
  /// When this node's claim on the row was stamped (multi-node; taken before the claiming
  /// statement ran). Unset: no claim to watch.
  std::optional<std::chrono::steady_clock::time_point> claimed_at;
  /// The begin_scan() token of the poll cycle that read the row (cold events). Unset: not read by
  /// a tracked cycle.
  std::optional<std::uint64_t> scan_token;
  /// Set by the dispatcher when queued: a batch listener takes this event. Events without one go
  /// to a worker alone, so a worker never runs several single listeners one after another.
  bool batchable = false;
};

/// Runs listeners for queued events and records DONE / RETRY / DEAD. Thread-safe.
///
/// DONE marks are batched: workers hand finished ids to a flusher thread, which writes them in
/// one UPDATE per `done_batch_window` (or as soon as `done_batch_max` ids are waiting), so a
/// workload pays one status commit per window instead of one per event. A crash loses the ids not
/// yet flushed (at most one window's worth, bounded by done_batch_max per statement); the poller
/// delivers those again (at-least-once).
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
    /// Write as soon as this many DONE marks wait. >= 1.
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
  };

  /// Validates (std::invalid_argument naming the field) and starts the workers.
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
  /// Queues an event from the poller. True if queued, already tracked, or completed during the
  /// current scan; false if the cold queue is full or closing.
  bool enqueue_cold(QueuedEvent event);
  /// What enqueue_cold did: queued, dropped as a duplicate, or refused (full / closing).
  enum class EnqueueResult { Queued, Duplicate, Refused };
  /// enqueue_cold with the distinction between a new event and a duplicate.
  EnqueueResult try_enqueue_cold(QueuedEvent event);
  /// Events queued (hot and cold) plus max_batch_size per worker: an upper bound of the events
  /// held here.
  int in_memory() const;
  /// Free slots in the cold queue (0 when closing).
  int cold_queue_remaining_capacity() const;
  /// Marks the start of a poll cycle; returns a token for end_scan().
  std::uint64_t begin_scan();
  /// Ends the poll cycle started with `token`.
  void end_scan(std::uint64_t token);
  /// Stops accepting events, lets workers drain for up to drain_timeout, then stops them after
  /// their current event. Events still queued stay in the table for the poller. Idempotent.
  void close();

 private:
  void worker_loop();
  void process(QueuedEvent& event);
  void process_batch(std::vector<QueuedEvent>& events);
  std::exception_ptr run_before(const EventEnvelope& event);
  void complete(QueuedEvent& queued, std::exception_ptr error);
  void finish(const std::string& event_id);
  void finish_locked(const std::string& event_id);  // queue_mutex_ held
  void complete_done(std::string event_id);
  void flusher_loop();
  void heartbeat_loop();
  bool claim_lapsed(const QueuedEvent& event) const;
  enum class Outcome { Done, Retry, Deferred, Dead };
  /// Writes the row's new status; false (logged, counted) when it could not be written.
  bool write_outcome(const QueuedEvent& queued, Outcome outcome, std::chrono::milliseconds delay,
                     const std::string& message, bool count_attempt);
  void drop_queued(const std::string& head_id);
  EnqueueResult enqueue(QueuedEvent event, bool hot, bool reserved);

  Options options_;
  mutable std::mutex queue_mutex_;  // guards the queues, flags, scan bookkeeping
  std::condition_variable work_ready_;
  std::condition_variable drained_;
  std::deque<QueuedEvent> hot_;
  std::deque<QueuedEvent> cold_;
  unsigned fairness_tick_ = 0;
  bool closing_ = false;
  bool abandon_ = false;
  std::uint64_t completion_seq_ = 0;
  std::multiset<std::uint64_t> active_scans_;
  std::deque<std::pair<std::uint64_t, std::string>> completed_log_;
  std::unordered_set<std::string> completed_ids_;
  // Multi-node: when each reserved (written, not yet committed) event's claim was stamped, and the
  // ids workers are running now (renewed by the heartbeat with the queued ones).
  std::unordered_map<std::string, std::chrono::steady_clock::time_point> reserved_at_;
  std::unordered_set<std::string> running_;
  std::uint64_t expired_dropped_ = 0;
  // Ordered mode: poll cycles that began before this completion count read the queue that was
  // dropped after a failed status write; what they still hand over is refused.
  std::uint64_t scans_invalid_before_ = 0;
  std::mutex done_mutex_;  // guards pending_done_, first_done_at_, flusher_stop_
  std::condition_variable done_ready_;
  std::vector<std::string> pending_done_;
  std::chrono::steady_clock::time_point first_done_at_;
  bool flusher_stop_ = false;
  std::thread flusher_;
  std::mutex heartbeat_mutex_;  // guards heartbeat_stop_
  std::condition_variable heartbeat_wake_;
  bool heartbeat_stop_ = false;
  std::thread heartbeat_;
  std::mutex close_mutex_;  // serialises close()
  std::vector<std::thread> workers_;
};

/// WriterHook that puts committed events on the dispatcher's hot queue. Events are reserved in
/// the dispatcher before commit (so the poller cannot deliver them a second time in the gap between
/// commit and hook) and enqueued after it. Delayed events (available_at after occurred_at) are left
/// to the poller. A full queue is logged (warning) and counted; the poller delivers those rows.
/// Thread-safe.
class DispatcherWriterHook final : public WriterHook {
 public:
  /// `dispatcher` must outlive the hook's use. With a `lock_owner` (multi-node), rows are inserted
  /// claimed by it so that other nodes' pollers do not deliver them while this node does.
  DispatcherWriterHook(OutboxDispatcher& dispatcher, std::shared_ptr<MetricsExporter> metrics,
                       std::string lock_owner = {});
  std::string_view lock_owner() const override { return lock_owner_; }
  std::vector<EventEnvelope> before_write(std::vector<EventEnvelope> events) override;
  void after_write(const std::vector<EventEnvelope>& events) override;
  void after_commit(const std::vector<EventEnvelope>& events) override;
  void after_rollback(const std::vector<EventEnvelope>& events) override;
  /// Releases the reservations and enqueues nothing: the poller delivers the rows that exist.
  void after_unknown_outcome(const std::vector<EventEnvelope>& events) override;

 private:
  OutboxDispatcher& dispatcher_;
  std::shared_ptr<MetricsExporter> metrics_;
  std::string lock_owner_;
};

}  // namespace outbox
