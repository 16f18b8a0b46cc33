#pragma once
// Connection-managed facade over the dead-event store methods.

#include <functional>
#include <memory>
#include <optional>
#include <string_view>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/failure_fingerprint.hpp"
#include "outbox/store.hpp"

namespace outbox {

namespace sql {
class Connection;
class ConnectionProvider;
}  // namespace sql

/// Queries, counts and replays DEAD events, each call on a connection of its own from the
/// provider. Database failures throw outbox::StoreError (or a subclass), never an empty result.
/// Thread-safe.
class DeadEventManager {
 public:
  /// What replay_all() did.
  struct ReplayAllResult {
    int replayed = 0;      ///< DEAD → NEW
    int skipped = 0;       ///< in the list but no longer DEAD when their turn came
    bool more = false;     ///< the list was capped at the limit: run again for the rest
    bool stopped = false;  ///< the progress callback asked to stop: run again for the rest
  };
  /// Called before each event of a bulk action with (events handled, events listed); returning
  /// false stops the action there (what was done stays done).
  using Progress = std::function<bool(int done, int total)>;
  /// The most DEAD rows one replay_all() takes by default.
  static constexpr int kReplayAllLimit = 100000;
  /// DEAD events that failed the same way (one failure fingerprint).
  struct Group {
    FailureFingerprint fingerprint;
    int count = 0;
    Timestamp first_seen;         ///< when the first of them went DEAD
    Timestamp last_seen;          ///< when the last one did
    std::string sample_event_id;  ///< the last one to go DEAD
    std::string sample_error;     ///< its last error, as stored
  };
  /// What a group action did.
  struct GroupActionResult {
    int changed = 0;       ///< replayed or discarded
    int skipped = 0;       ///< no longer DEAD when their turn came (or, discarding, unread by a
                           ///< subscription)
    bool more = false;     ///< the DEAD rows read were capped at the limit: run again for the rest
    bool stopped = false;  ///< the progress callback asked to stop: run again for the rest
  };

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
                             int limit = kReplayAllLimit, const Progress& progress = {});
  /// Number of dead events, optionally of one type. Throws StoreError.
  int count(std::optional<std::string_view> event_type = std::nullopt);
  /// The DEAD events (the first `limit` of them, oldest first; `*more` says whether there were
  /// more) grouped by failure fingerprint, the largest group first. Throws StoreError.
  std::vector<Group> groups(int limit = kReplayAllLimit, bool* more = nullptr);
  /// Replays every DEAD event of the fingerprint `id` among the first `limit` DEAD rows, each
  /// at most once (the list is taken once, as replay_all), and only while it still failed with
  /// the error it was listed with (one that failed again otherwise is skipped). Throws
  /// StoreError.
  GroupActionResult replay_group(std::string_view id, int limit = kReplayAllLimit,
                                 const Progress& progress = {});
  /// Deletes them instead; a DEAD row a subscription has not read yet is kept (skipped).
  GroupActionResult discard_group(std::string_view id, int limit = kReplayAllLimit,
                                  const Progress& progress = {});

 private:
  std::shared_ptr<sql::ConnectionProvider> provider_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<Clock> clock_;
  // The ids and errors of the fingerprint `id` among the first `limit` DEAD rows.
  std::vector<std::pair<std::string, std::optional<std::string>>> members(sql::Connection& conn,
                                                                          std::string_view id,
                                                                          int limit, bool& more);
  GroupActionResult act_on_group(
      std::string_view id, int limit, const Progress& progress,
      const std::function<bool(sql::Connection&, const std::string&,
                               const std::optional<std::string>&)>& action);
};

}  // namespace outbox
