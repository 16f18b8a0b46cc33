#pragma once
// Runs subscriptions (stream mode): each reads the stream after its own cursor, hands the events
// its filter takes to its publisher, and moves its cursor, on a schedule of its own.

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "outbox/json_codec.hpp"
#include "outbox/publisher.hpp"
#include "outbox/stream.hpp"

namespace outbox {

namespace sql {
class ConnectionProvider;
}
class LeaseManager;
class MetricsExporter;
class WriterHook;
namespace internal {
class LeaseBalancer;
}

/// Runs a set of subscriptions for one process. With a LeaseManager, a subscription runs only
/// where its lease "sub:<name>" is held, the cursor moves only under that holding (fenced), and
/// the processes that run the same set share the subscriptions out between them (each takes about
/// its share of the live members, "member:<owner>"). Without one, this process runs them all.
/// Thread-safe.
class SubscriptionRunner {
 public:
  /// How one subscription polls. Defaults as in Crablet.
  struct Schedule {
    std::chrono::milliseconds poll_interval{500};
    int batch_size = 100;  ///< events read per poll, 1 … 10000
    /// Idle backoff: after `backoff_threshold` empty polls the wait doubles (× multiplier) per
    /// empty poll up to backoff_max; any event read resets it. wake() ends a wait at once.
    int backoff_threshold = 3;
    int backoff_multiplier = 2;
    std::chrono::milliseconds backoff_max{60000};
    /// A failing batch is retried after retry_base × 2^(errors − 1), at most retry_max, keeping
    /// the cursor; at max_errors in a row the subscription becomes FAILED (0: never).
    int max_errors = 10;
    std::chrono::milliseconds retry_base{1000};
    std::chrono::milliseconds retry_max{60000};
    /// Events handed to the publisher per call (0: the whole batch). The lease is checked before
    /// each call and a failure ends the batch there: 1 keeps order and single ownership exact for
    /// publishers that send one event after another (webhooks).
    int publish_chunk = 0;
  };
  struct Subscription {
    SubscriptionSpec spec;
    std::shared_ptr<Publisher> publisher;  ///< required
    Schedule schedule;
    /// Where a subscription this runner creates starts: the first event, or after the last one.
    bool start_at_end = false;
    /// The target of one event; default: spec.target as is.
    std::function<std::string(const EventEnvelope&)> target;
  };
  struct Options {
    std::shared_ptr<sql::ConnectionProvider> connection_provider;  ///< required
    std::shared_ptr<StreamStore> store;                            ///< required
    std::vector<Subscription> subscriptions;                       ///< names unique
    /// Optional (see the class comment). Started by its owner.
    std::shared_ptr<LeaseManager> leases;
    std::shared_ptr<MetricsExporter> metrics;  ///< default: MetricsExporter::noop()
    const JsonCodec* codec = nullptr;          ///< default: JsonCodec::default_codec()
    /// Engines whose stream needs a sequencer (StreamStore::needs_sequencer): how often it runs
    /// when idle (it runs again at once after a full batch). One process at a time runs it, the
    /// holder of "stream:sequencer" when there is a LeaseManager.
    std::chrono::milliseconds sequencer_interval{100};
    int sequencer_batch = 1000;
  };

  /// What a subscription is doing in this process, for status pages.
  struct View {
    std::string name;
    bool running_here = false;               ///< this process holds it (always true without leases)
    std::string waiting;                     ///< why it does not deliver now ("" when it does)
    std::optional<SubscriptionState> state;  ///< its row as last read
  };

  /// Validates (std::invalid_argument naming the field). Creates missing subscriptions and
  /// updates the spec of existing ones at start(), not here.
  explicit SubscriptionRunner(Options options);
  /// Calls close().
  ~SubscriptionRunner();
  SubscriptionRunner(const SubscriptionRunner&) = delete;
  SubscriptionRunner& operator=(const SubscriptionRunner&) = delete;

  /// Creates or updates the configured subscriptions and starts one thread per subscription
  /// (and the sequencer's). Throws StoreError, StreamError (see StreamStore::check). The check is
  /// made again every 5 s: while it fails, no subscription reads (their views say why).
  void start();
  /// Ends every idle wait now: new events were committed. A subscription waiting out the retry
  /// delay of a failed publication keeps waiting (then reads at once).
  void wake();
  /// Ends every wait now, retry delays too: an operator changed subscriptions (rewind, reset).
  void poll_now();
  /// A writer hook that calls wake() after each commit of events: give it to the OutboxWriter of
  /// this process, so its subscriptions do not wait for their poll. The runner must outlive it.
  std::shared_ptr<WriterHook> writer_hook();
  /// Stops the threads after the batches in progress, and gives back held subscription leases.
  /// Idempotent.
  void close();
  /// One view per configured subscription, in configuration order.
  std::vector<View> views() const;

 private:
  class Worker;
  void balance();
  void sequence();
  void check_stream();
  /// Why the stream may not be read now (StreamStore::check refused it); empty when it may.
  std::string stream_refusal() const;

  Options options_;
  std::vector<std::unique_ptr<Worker>> workers_;
  std::chrono::milliseconds sequencer_wait_{0};  // the sequencer thread's own
  mutable std::mutex refusal_mutex_;             // guards refusal_
  std::string refusal_;
  std::unique_ptr<internal::LeaseBalancer> balancer_;  // the balancer thread's own
  struct Background;
  std::unique_ptr<Background> background_;  // last: stopped first
};

}  // namespace outbox
