#pragma once
// The writer hook of the hot path: events reserved in a dispatcher before commit and queued after.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/writer.hpp"

namespace outbox {

class OutboxDispatcher;
class MetricsExporter;
namespace internal {
struct DispatcherLink;
}

/// WriterHook that puts committed events on the dispatcher's hot queue. Events are reserved in
/// the dispatcher before commit (so the poller cannot deliver them a second time in the gap between
/// commit and hook) and enqueued after it. Delayed events (available_at after occurred_at) are left
/// to the poller. A full queue is logged (warning) and counted; the poller delivers those rows.
/// Thread-safe.
class DispatcherWriterHook final : public WriterHook {
 public:
  /// With a `lock_owner` (multi-node), rows are inserted claimed by it so that other nodes'
  /// pollers do not deliver them while this node does. The hook may outlive `dispatcher` (an open
  /// transaction keeps it): events committed after the dispatcher is gone are left to the poller.
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
  template <typename Fn>
  bool with_dispatcher(Fn&& fn) const;

  std::shared_ptr<internal::DispatcherLink> link_;
  std::shared_ptr<MetricsExporter> metrics_;
  std::string lock_owner_;
};

}  // namespace outbox
