#pragma once
// Connection-managed facade over the dead-event store methods.

#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/store.hpp"

namespace outbox {

namespace sql {
class ConnectionProvider;
}

/// Queries, counts and replays DEAD events, each call on a connection of its own from the
/// provider. Database failures throw outbox::StoreError (or a subclass), never an empty result.
/// Thread-safe.
class DeadEventManager {
 public:
  /// What replay_all() did.
  struct ReplayAllResult {
    int replayed = 0;   ///< DEAD → NEW
    int skipped = 0;    ///< in the list but no longer DEAD when their turn came
    bool more = false;  ///< the list was capped at the limit: run again for the rest
  };
  /// The most DEAD rows one replay_all() takes by default.
  static constexpr int kReplayAllLimit = 100000;

  /// Throws std::invalid_argument on a null provider or store.
  DeadEventManager(std::shared_ptr<sql::ConnectionProvider> provider,
                   std::shared_ptr<OutboxStore> store,
                   std::shared_ptr<Clock> clock = Clock::system());
  /// At most `limit` dead events, optionally filtered, oldest first; with `with_payloads` false
  /// the payloads are not read (left empty). Throws StoreError.
  std::vector<OutboxEvent> query(std::optional<std::string_view> event_type,
                                 std::optional<std::string_view> aggregate_type, int limit,
                                 bool with_payloads = true);
  /// Resets one DEAD event to NEW (attempts 0, due now); false if no DEAD event has that id.
  /// Throws StoreError.
  bool replay(std::string_view event_id);
  /// Takes the ids of at most `limit` matching DEAD events once, then replays each at most once:
  /// events a running relay sends DEAD again meanwhile are not replayed again by this call.
  /// Throws std::invalid_argument if `limit` < 1, StoreError on database failure (the events
  /// replayed before it stay replayed).
  ReplayAllResult replay_all(std::optional<std::string_view> event_type,
                             std::optional<std::string_view> aggregate_type,
                             int limit = kReplayAllLimit);
  /// Number of dead events, optionally of one type. Throws StoreError.
  int count(std::optional<std::string_view> event_type = std::nullopt);

 private:
  std::shared_ptr<sql::ConnectionProvider> provider_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<Clock> clock_;
};

}  // namespace outbox
