#pragma once
// The composite that wires writer, dispatcher, poller and purge for the common set-ups.

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/poller.hpp"
#include "outbox/writer.hpp"

namespace outbox {

namespace sql {
class ConnectionProvider;
}
class TxContext;
class OutboxStore;
class ListenerRegistry;
class MetricsExporter;
class JsonCodec;
class EventInterceptor;
class RetryPolicy;
class InFlightTracker;
class EventPurger;
class OutboxDispatcher;
class OutboxPurgeScheduler;

/// Owns the components of one mode. Like every component, it starts no thread until start():
/// events written before that wait in the hot queue (or, past its capacity, in the table) and are
/// delivered once it runs. close() (or the destructor) stops them in this order: purge, poller,
/// dispatcher (which drains). Move-only; start() and close() are thread-safe.
class Outbox {
 public:
  /// Settings for every mode; a mode ignores what it does not use (see each factory).
  struct Options {
    std::shared_ptr<sql::ConnectionProvider>
        connection_provider;                      ///< required (writer_only: if purging)
    std::shared_ptr<TxContext> tx_context;        ///< required
    std::shared_ptr<OutboxStore> store;           ///< required
    std::shared_ptr<ListenerRegistry> listeners;  ///< required except writer_only
    std::shared_ptr<MetricsExporter> metrics;     ///< default: noop
    const JsonCodec* json_codec = nullptr;        ///< default: JsonCodec::default_codec()
    std::vector<std::shared_ptr<EventInterceptor>> interceptors;
    std::chrono::milliseconds poll_interval{5000};
    int poll_batch_size = 50;
    std::chrono::milliseconds head_rescan_interval{1000};  ///< see OutboxPoller; 0 in ordered()
    std::chrono::microseconds skip_recent{0};
    std::chrono::milliseconds drain_timeout{5000};
    std::chrono::microseconds done_batch_window{10000};  ///< see OutboxDispatcher::Options
    std::size_t done_batch_max = 256;
    std::size_t max_batch_size = 1;  ///< see OutboxDispatcher::Options (batch listeners)
    int worker_count = 4;            ///< forced to 1 by ordered()
    std::size_t hot_queue_capacity = 1000;
    std::size_t cold_queue_capacity = 1000;
    int max_attempts = 10;  ///< forced to 1 by ordered()
    std::shared_ptr<RetryPolicy> retry_policy;
    std::shared_ptr<InFlightTracker> in_flight_tracker;
    std::optional<ClaimLocking> claim_locking;  ///< required by multi_node, refused by ordered
    std::shared_ptr<EventPurger> purger;        ///< optional: starts a purge schedule
    std::chrono::seconds purge_retention{std::chrono::hours(24 * 7)};
    int purge_batch_size = 500;
    std::chrono::milliseconds purge_interval{std::chrono::hours(1)};
    std::shared_ptr<Clock> clock;  ///< default: Clock::system()
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
  /// Stops purge, poller, then drains the dispatcher; in multi_node mode then releases the rows
  /// this node still holds claimed, so other nodes take them at once. Idempotent.
  void close();

 private:
  enum class Mode { SingleNode, MultiNode, Ordered, WriterOnly };
  Outbox() = default;
  static Outbox build(Options options, Mode mode);

  std::unique_ptr<OutboxDispatcher> dispatcher_;
  std::unique_ptr<OutboxPoller> poller_;
  std::unique_ptr<OutboxPurgeScheduler> purge_;
  std::unique_ptr<OutboxWriter> writer_;
  struct ClaimRelease;  // multi_node: what close() needs to free this node's claims, once
  std::unique_ptr<ClaimRelease> claim_release_;
};

}  // namespace outbox
