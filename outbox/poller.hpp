#pragma once
// Low-frequency fallback scan of the outbox table.

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/envelope.hpp"

namespace outbox {

namespace sql {
class Connection;
class ConnectionProvider;
}  // namespace sql
class OutboxStore;
class MetricsExporter;
class JsonCodec;
class OutboxDispatcher;
class ChangeWatcher;
struct OutboxEvent;
namespace internal {
class HandOverStage;
class PeriodicWorker;
}  // namespace internal

/// One event a poll cycle hands over: claimed in a message group's `partition`, or (partition < 0)
/// not in a message group.
struct ClaimedEvent {
  EventEnvelope envelope;
  int attempts = 0;
  int partition = 0;
  std::int64_t lease_epoch = 0;  ///< of the partition's lease it was read under
};

/// One poll cycle, from before its query until its rows are handed over. A background cycle's
/// hand-over may run while the next cycle's query does, so each cycle carries its own state.
struct PollCycle {
  std::optional<std::uint64_t> scan_token;        ///< the handler's scan tracking, if any
  std::chrono::steady_clock::time_point started;  ///< set by the poller before the cycle's query
  /// How many handed-over events were new work (not already queued or in flight); unset if the
  /// handler does not know. A full batch of new work makes the poller run its next cycle at once.
  std::optional<int> queued;
};

/// Receives the events a poll cycle found. Implementations must be thread-safe.
class OutboxPollerHandler {
 public:
  virtual ~OutboxPollerHandler() = default;
  /// Takes one event; false stops the current cycle (backpressure).
  virtual bool handle(const EventEnvelope& event, int attempts) = 0;
  /// Takes one event of a message group claimed in `partition`.
  virtual bool handle_grouped(const EventEnvelope& event, int attempts, int /*partition*/) {
    return handle(event, attempts);
  }
  /// Takes events of `cycle` in order until one is refused; returns how many were taken. By
  /// default handle_grouped (handle for partition < 0) one by one; a handler that can take many
  /// under one lock overrides it (the poller hands rows over in chunks).
  virtual std::size_t handle_all(std::vector<ClaimedEvent> events, PollCycle& cycle);
  /// How many events the handler can take now; the cycle is skipped at 0.
  virtual int available_capacity() const { return INT_MAX; }
  /// Called before the cycle's query (it may set the cycle's scan_token) and after the cycle's
  /// last handle_all().
  virtual void begin_cycle(PollCycle& /*cycle*/) {}
  virtual void end_cycle(PollCycle& /*cycle*/) {}
  /// Called with the cycle's connection before a claim (claim locking) when the claim before it
  /// took rows: work that needs the database's write lock is cheaper done here, by the thread
  /// about to take it anyway (a claim that finds nothing may not take it).
  virtual void before_query(sql::Connection& /*conn*/) {}
  /// Called when the cycle's claim is done (a staged hand-over may still run): `next_at_once`,
  /// the next cycle follows without waiting (a full page, no failure) and calls before_query().
  virtual void after_cycle(bool /*next_at_once*/) {}
  /// Events the handler holds (queued or running) whose rows are still pending: a poll without
  /// claim locking reads that many extra rows to see past them.
  virtual int in_flight() const { return 0; }
};

/// Feeds polled events to a dispatcher's cold queue, bracketing each cycle with its scan tracking.
class DispatcherPollerHandler final : public OutboxPollerHandler {
 public:
  /// `dispatcher` must outlive the handler.
  explicit DispatcherPollerHandler(OutboxDispatcher& dispatcher) : dispatcher_(dispatcher) {}
  /// One event outside any poll cycle (claimed now, no scan tracking).
  bool handle(const EventEnvelope& event, int attempts) override;
  bool handle_grouped(const EventEnvelope& event, int attempts, int partition) override;
  std::size_t handle_all(std::vector<ClaimedEvent> events, PollCycle& cycle) override;
  int available_capacity() const override;
  void begin_cycle(PollCycle& cycle) override;
  void end_cycle(PollCycle& cycle) override;
  /// On a single-writer database, writes the DONE marks waiting in the dispatcher on the
  /// cycle's connection (see OutboxDispatcher::write_done_marks).
  void before_query(sql::Connection& conn) override;
  /// Tells the dispatcher whether the next cycle will write the waiting marks at once.
  void after_cycle(bool next_at_once) override;
  int in_flight() const override;

 private:
  OutboxDispatcher& dispatcher_;
  std::atomic<bool> writes_marks_{false};  // the last cycle's connection was a single writer
};

/// Multi-node claim locking: rows are claimed by `owner` until delivered or `lock_timeout` passes.
struct ClaimLocking {
  /// Longest owner accepted (the claim column's width on MariaDB).
  static constexpr std::size_t kMaxOwnerBytes = 128;
  std::string owner;  ///< unique per process, at most kMaxOwnerBytes; empty = generated
  std::chrono::milliseconds lock_timeout{std::chrono::minutes(5)};  ///< > 0, <= kMaxDuration
};

/// What one cycle's claim of message groups got.
struct GroupClaim {
  std::vector<ClaimedEvent> events;  ///< group by group, each in insert order
  bool more = false;                 ///< claimable rows were left for the next cycle
};

/// Polls pending rows on a schedule and hands them to a handler. Thread-safe.
class OutboxPoller {
 public:
  struct Options {
    std::shared_ptr<sql::ConnectionProvider> connection_provider;  ///< required
    std::shared_ptr<OutboxStore> store;                            ///< required
    std::shared_ptr<OutboxPollerHandler> handler;                  ///< required
    std::chrono::microseconds skip_recent{0};   ///< ignore rows younger than this; >= 0
    int batch_size = 50;                        ///< >= 1
    std::chrono::milliseconds interval{5000};   ///< between cycles; > 0, <= kMaxDuration
    std::shared_ptr<MetricsExporter> metrics;   ///< default: MetricsExporter::noop()
    std::optional<ClaimLocking> claim_locking;  ///< set for multi-node
    /// While pages come back full, how often a cycle starts again from the oldest pending row
    /// (catching retries now due, released or expired claims, rows committed late); cycles in
    /// between resume after the last row taken, so a drain does not rescan the rows it already
    /// passed. 0: every cycle starts from the oldest row. >= 0.
    std::chrono::milliseconds head_rescan_interval{1000};
    const JsonCodec* json_codec = nullptr;  ///< default: JsonCodec::default_codec()
    std::shared_ptr<Clock> clock;           ///< default: Clock::system()
    /// When set, a cycle reads nothing while it returns false (a standby without the lease).
    std::function<bool()> active;
    /// Message groups: called each cycle after the ungrouped rows with the room left (at most
    /// batch_size); returns the grouped events it claimed (decoded; rows that do not decode were
    /// settled by their group's failure policy), group by group in insert order, and whether
    /// claimable rows were left behind (the next cycle then runs at once). It reads the time
    /// itself, as it reads the rows: a row committed meanwhile is due, not passed over.
    std::function<GroupClaim(sql::Connection& conn, int limit)> claim_groups;
    /// Wake-ups: a cycle runs at once on each of its hints and after it (re)connects; the
    /// interval stays the backstop. start() starts it, close() stops it.
    std::shared_ptr<ChangeWatcher> change_watcher;
    /// Adaptive polling (> 0): after a cycle that found work the next waits this long, doubled
    /// per cycle that found none, back up to the interval. 0: off. >= 0, <= interval.
    std::chrono::milliseconds adaptive_floor{0};
  };

  /// Validates (std::invalid_argument naming the field). Does not start polling.
  explicit OutboxPoller(Options options);
  /// Calls close().
  ~OutboxPoller();
  OutboxPoller(const OutboxPoller&) = delete;
  OutboxPoller& operator=(const OutboxPoller&) = delete;

  /// Starts the background thread (a first cycle runs at once). Idempotent while running; throws
  /// std::logic_error after close().
  void start();
  /// Runs one cycle on the calling thread; returns the number of events handed over. Database
  /// errors are logged and counted as 0 (never thrown); while they last, the background loop
  /// backs off (see next_wait()). After close() it does nothing and returns 0.
  int poll();
  /// Stops the background thread after its current cycle. Idempotent.
  void close();
  /// Starts the next background cycle now instead of after the wait (e.g. on gaining a lease).
  void wake();
  /// The claim owner in use (empty without claim locking).
  const std::string& owner() const noexcept { return owner_; }
  /// The wait before the next background cycle: none after a full batch (a backlog is drained
  /// without pauses), a tenth of the interval (at most 100 ms) when the handler had no
  /// capacity, otherwise the
  /// interval (with adaptive_floor: the floor doubled per cycle without work since the last one
  /// with, up to the interval) — doubled per consecutive failed cycle up to 16 intervals, at most
  /// 30 s (never less than one interval).
  std::chrono::milliseconds next_wait() const;
  /// Poll cycles completed so far (background and poll() calls alike).
  std::uint64_t completed_cycles() const noexcept { return completed_cycles_.load(); }

 private:
  Options options_;
  std::string owner_;
  std::atomic<std::uint64_t> completed_cycles_{0};
  std::atomic<int> consecutive_failures_{0};
  enum class CycleResult { Partial, FullBatch, NoCapacity };
  struct HandOver {
    int handed = 0;
    bool refused = false;                 // the handler refused a row (its queue is full)
    const OutboxEvent* passed = nullptr;  // the last row handed over or settled
  };
  // One cycle, then the handler's after_cycle().
  int run_cycle(bool background);
  // One cycle; a background one with claim locking leaves its hand-over to the stage.
  int cycle_once(bool background);
  // Decodes `rows` and hands them over in order; undecodable ones are marked DEAD on `conn`
  // (null: a connection acquired for it), or left pending if that fails.
  HandOver hand_over(const std::vector<OutboxEvent>& rows, PollCycle& cycle, sql::Connection* conn,
                     Timestamp now);
  std::atomic<CycleResult> last_cycle_{CycleResult::Partial};
  std::atomic<int> idle_cycles_{64};  // cycles without work since the last with (adaptive)
  std::atomic<bool> hinted_{false};   // a wake-up came since the last cycle began
  // The last claim (claim locking) took rows: the next one is expected to write, so the
  // handler's before_query() work is done on its connection.
  std::atomic<bool> claimed_last_{true};
  std::once_flag watcher_started_;
  std::mutex cycle_mutex_;  // serialises poll() cycles; guards cursor_*, last_head_scan_
  // Where the next keyset page starts (a PendingKey); no time: from the head.
  std::optional<Timestamp> cursor_created_at_;
  std::string cursor_event_id_;
  std::chrono::steady_clock::time_point last_head_scan_{};
  std::atomic<int> staged_rows_{0};                   // claimed rows the stage has yet to hand over
  std::unique_ptr<internal::HandOverStage> stage_;    // claim locking without groups only
  std::unique_ptr<internal::PeriodicWorker> worker_;  // last: stopped before the rest goes
};

}  // namespace outbox
