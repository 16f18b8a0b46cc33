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

/// Queries, counts and replays DEAD events. Database errors are logged and reported as the empty
/// result, never thrown. Thread-safe.
class DeadEventManager {
 public:
  /// Throws std::invalid_argument on a null provider or store.
  DeadEventManager(std::shared_ptr<sql::ConnectionProvider> provider,
                   std::shared_ptr<OutboxStore> store,
                   std::shared_ptr<Clock> clock = Clock::system());
  /// Dead events, optionally filtered, oldest first (empty on failure).
  std::vector<OutboxEvent> query(std::optional<std::string_view> event_type,
                                 std::optional<std::string_view> aggregate_type, int limit);
  /// Resets one DEAD event to NEW; false if it was not DEAD or on failure.
  bool replay(std::string_view event_id);
  /// Replays every matching dead event in batches; returns how many (so far, on failure).
  int replay_all(std::optional<std::string_view> event_type,
                 std::optional<std::string_view> aggregate_type, int batch_size = 100);
  /// Number of dead events (0 on failure).
  int count(std::optional<std::string_view> event_type = std::nullopt);

 private:
  std::shared_ptr<sql::ConnectionProvider> provider_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<Clock> clock_;
};

}  // namespace outbox
