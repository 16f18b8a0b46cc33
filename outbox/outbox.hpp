#pragma once
// The composite that wires writer, dispatcher, poller and purge for the common set-ups.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/dispatcher.hpp"
#include "outbox/poller.hpp"
#include "outbox/purge.hpp"
#include "outbox/writer.hpp"

namespace outbox {

namespace sql {
class ConnectionProvider;
}
class TxContext;
class OutboxStore;
class ListenerRegistry;
class MetricsExporter;
class LeaseManager;
class GroupStore;
enum class GroupFailurePolicy;
namespace internal {
class GroupPartitions;
}

/// Owns the components of one mode. Like every component, it starts no thread until start():
/// events written before that wait in the hot queue (or, past its capacity, in the table) and are
/// delivered once it runs. close() (or the destructor) stops them in this order: purge, poller,
/// dispatcher (which drains). Move-only; start() and close() are thread-safe.
class Outbox {
 public:
  /// Settings for every mode; a mode ignores what it does not use (see each factory). The
  /// collaborators several components share sit at the top; each component's own settings sit in
  /// its nested options, where the fields listed as "filled by Outbox" must stay unset
  /// (std::invalid_argument otherwise: set them here once).
  /// The lease an Outbox acts under. While `manager` holds `name` the poller reads and the
  /// workers and the hot path deliver; otherwise events wait in the table for the holder (queued
  /// ones are dropped, in-flight ones finish and their status writes are fenced). The store must
  /// be fenced on the same lease (sql::StoreOptions::fence). start() keeps the lease and starts
  /// the manager; close() releases it after the dispatcher drained.
  struct Lease {
    std::shared_ptr<LeaseManager> manager;  ///< required; may be shared with other users
    std::string name = "leader";
    /// False: close() keeps the lease (another Outbox under it, closed later, releases it).
    bool release_on_close = true;
  };

  /// Message groups (multi_node; docs/groups.md): events with a message_group are claimed only in
  /// the partitions this node leases ("part:<n>", spread over the live nodes), group heads first,
  /// and run one at a time per group. Without it, grouped events are left in the table.
  struct Groups {
    std::shared_ptr<LeaseManager> leases;    ///< required; start() starts it
    std::shared_ptr<GroupStore> store;       ///< required (sql::SqlGroupStore)
    std::size_t max_concurrent_groups = 64;  ///< groups running at once; >= 1
    int per_group = 10;                      ///< rows claimed behind a due head; 1 … 1000
    /// The policy for a head that failed for good; default: Block for every event.
    std::function<GroupFailurePolicy(const EventEnvelope&)> on_failure;
  };

  struct Options {
    std::shared_ptr<sql::ConnectionProvider>
        connection_provider;                      ///< required (writer_only: if purging)
    std::shared_ptr<TxContext> tx_context;        ///< required
    std::shared_ptr<OutboxStore> store;           ///< required
    std::shared_ptr<ListenerRegistry> listeners;  ///< required except writer_only
    std::shared_ptr<MetricsExporter> metrics;     ///< default: noop
    std::shared_ptr<Clock> clock;                 ///< default: Clock::system()
    /// Stamps every written event with the caller's trace context (outbox/trace_context.hpp),
    /// e.g. thread_trace_context(); default: none (an event's own traceparent is still checked).
    TraceContextProvider trace_context;
    /// Further writer hooks, called after the Outbox's own hot path in this order (e.g. a
    /// postgres::CommitNotifier, a SubscriptionRunner::writer_hook()); none may be null.
    std::vector<std::shared_ptr<WriterHook>> writer_hooks;
    std::optional<ClaimLocking> claim_locking;  ///< required by multi_node, refused by ordered
    /// Primary + standby (single_node, ordered): act only while holding this lease (see Lease).
    std::optional<Lease> lease;
    /// multi_node only: deliver message groups (see Groups).
    std::optional<Groups> groups;
    /// Workers, queues, attempts, retry policy, interceptors, batches, drain. Filled by Outbox:
    /// connection_provider, store, listeners, metrics, clock, claim_owner, claim_timeout,
    /// ordered. ordered() forces worker_count, max_attempts and max_batch_size to 1.
    OutboxDispatcher::Options dispatcher;
    /// Interval, batch size, skip_recent, head rescan, JSON codec. Filled by Outbox:
    /// connection_provider, store, handler, metrics, claim_locking, clock. ordered() forces
    /// head_rescan_interval to 0.
    OutboxPoller::Options poller;
    /// A purge schedule starts when purge.purger is set. Filled by Outbox: connection_provider,
    /// clock.
    OutboxPurgeScheduler::Options purge;
  };

  /// Hot path + poller (poll_pending), not started. Throws std::invalid_argument naming a
  /// missing/bad field.
  static Outbox single_node(Options options);
  /// Hot path + poller with claim locking (claim_pending). Throws std::invalid_argument also when
  /// claim_locking is unset.
  static Outbox multi_node(Options options);
  /// Poller only, one worker, one event at a time, one attempt, no hot path: per-aggregate FIFO on
  /// one node. Failures go DEAD; a RetryLater holds the worker (see OutboxDispatcher).
  static Outbox ordered(Options options);
  /// Writer without hot path, dispatcher or poller (CDC); purges if a purger is set.
  static Outbox writer_only(Options options);

  Outbox(Outbox&&) noexcept;
  Outbox& operator=(Outbox&&) noexcept;
  ~Outbox();

  /// The writer to call inside business transactions.
  OutboxWriter& writer() { return *writer_; }
  /// The dispatcher (nullptr in writer_only mode).
  OutboxDispatcher* dispatcher() { return dispatcher_.get(); }
  /// The poller (nullptr in writer_only mode).
  OutboxPoller* poller() { return poller_.get(); }
  /// Starts the dispatcher's workers, the poller and the purge schedule. Idempotent; throws
  /// std::logic_error after close().
  void start();
  /// Stops taking work: purge, poller and the message groups' partitions; what was taken still
  /// runs until close(). For a process stopping several Outboxes at once. Idempotent.
  void stop_polling();
  /// stop_polling(), then drains the dispatcher; in multi_node mode then releases the rows this
  /// node still holds claimed, so other nodes take them at once. Idempotent.
  void close();

 private:
  enum class Mode { SingleNode, MultiNode, Ordered, WriterOnly };
  Outbox() = default;
  static Outbox build(Options options, Mode mode);

  std::unique_ptr<internal::GroupPartitions> groups_;  // first: outlives what uses it
  std::unique_ptr<OutboxDispatcher> dispatcher_;
  std::unique_ptr<OutboxPoller> poller_;
  std::unique_ptr<OutboxPurgeScheduler> purge_;
  std::unique_ptr<OutboxWriter> writer_;
  struct ClaimRelease;  // multi_node: what close() needs to free this node's claims, once
  std::unique_ptr<ClaimRelease> claim_release_;
  struct LeaseLink;  // with a lease: what start() keeps and close() releases
  std::unique_ptr<LeaseLink> lease_;
};

}  // namespace outbox
