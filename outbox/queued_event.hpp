#pragma once
// An event waiting in a dispatcher, with what the dispatcher knows about its row.

#include <chrono>
#include <cstdint>
#include <optional>

#include "outbox/envelope.hpp"

namespace outbox {

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
  /// Set with `batchable`: which batch listener takes it. Events of one message group travel
  /// together only to one listener, so a failure stops the group where it happened.
  const void* batch_key = nullptr;
  /// The row's partition (grouped events from the poller): delivered only while it is held.
  std::optional<int> partition;
  /// With `partition`: the epoch of the partition's lease the row was read under. Delivered only
  /// while that holding lasts (a row read before a lapse may have gone out from another node
  /// since, and the group on past it).
  std::optional<std::int64_t> lease_epoch;
};

}  // namespace outbox
