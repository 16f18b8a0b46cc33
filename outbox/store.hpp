#pragma once
// The storage SPI: one implementation per SQL dialect.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/envelope.hpp"

namespace outbox {
namespace sql {
class Connection;
}

/// Row status.
enum class EventStatus { New = 0, Done = 1, Retry = 2, Dead = 3 };

/// Name of a status ("NEW", "DONE", "RETRY", "DEAD").
std::string_view to_string(EventStatus status);

/// One row of the outbox table.
struct OutboxEvent {
  std::string event_id;
  std::string event_type;
  std::string aggregate_type;
  std::optional<std::string> aggregate_id;
  std::optional<std::string> tenant_id;
  std::string payload;  ///< JSON text, or raw bytes when payload_is_json is false
  bool payload_is_json = true;
  std::optional<std::string> headers_json;
  std::optional<std::string> tags_json;  ///< JSON object of the event's tags
  std::optional<std::string> message_group;
  std::optional<int> partition_no;  ///< the group's partition (NULL: not yet assigned)
  EventStatus status = EventStatus::New;
  int attempts = 0;
  Timestamp available_at;
  Timestamp created_at;
  std::optional<Timestamp> done_at;
  std::optional<std::string> last_error;
  std::optional<std::string> locked_by;
  std::optional<Timestamp> locked_at;
  /// Set when a column could not be read (another client wrote a type no reading fits): which
  /// one and why. to_envelope throws it, so the row is settled like any undecodable row.
  std::optional<std::string> unreadable;
};

/// A row's place in the pending order (created_at, then event_id): where a keyset page resumes.
struct PendingKey {
  Timestamp created_at;
  std::string event_id;
};

/// Longest last_error stored; longer messages are truncated (on a UTF-8 boundary).
inline constexpr std::size_t kMaxErrorLength = 4000;

/// How long a node leaves its own claims alone before its poller may take them again:
/// lock_timeout / 10, at most 10 s. Shorter would make a poller re-read the rows it has queued.
inline std::chrono::milliseconds own_claim_grace(std::chrono::milliseconds lock_timeout) {
  return std::min<std::chrono::milliseconds>(lock_timeout / 10, std::chrono::seconds(10));
}

/// Longest retry or deferral delay stored (30 days); longer ones (and negative ones) are clamped so
/// that no engine's interval or timestamp arithmetic overflows.
inline constexpr std::chrono::milliseconds kMaxRetryDelay{std::chrono::hours(24 * 30)};

/// `delay` within [0, kMaxRetryDelay].
inline std::chrono::milliseconds clamp_delay(std::chrono::milliseconds delay) {
  return std::clamp(delay, std::chrono::milliseconds(0), kMaxRetryDelay);
}

/// Truncates `error` to kMaxErrorLength bytes without splitting a UTF-8 sequence and replaces
/// invalid UTF-8 and NUL bytes with U+FFFD, so every engine accepts it as text.
std::string truncate_error(std::string_view error);

/// `text` as valid UTF-8: invalid sequences and NUL bytes become U+FFFD; nothing is cut.
std::string sanitize_utf8(std::string_view text);

class LeaseFence;

/// Reads and writes the outbox table through a caller-supplied connection; never commits or closes
/// it. `now` arguments are the caller's clock; an engine with a server clock may document that it
/// uses the server's time instead (so skewed nodes agree on leases and due times). Implementations
/// are thread-safe (stateless apart from configuration). Database failures throw
/// outbox::StoreError. Status updates never change a DONE or DEAD row (replay excepted). With an
/// `owner`, a status update changes the row only while that owner still holds its claim
/// (locked_by = owner): a node whose claim expired and was taken over cannot overwrite the new
/// owner's outcome. Stored errors are cut to kMaxErrorLength and made valid UTF-8 (truncate_error).
class OutboxStore {
 public:
  virtual ~OutboxStore() = default;

  /// Inserts one NEW row. With a `lock_owner`, the row is born claimed by it (locked_at = the
  /// insert time: the server's clock, or the system clock; never the envelope's occurred_at), so
  /// other nodes' pollers leave it to the writer's hot path until the lock expires. Throws
  /// UniqueViolationError for an event id already stored (OutboxWriter reports it as
  /// DuplicateEventError), StoreError on other failures.
  virtual void insert_new(sql::Connection& conn, const EventEnvelope& event,
                          std::string_view lock_owner = {}) = 0;
  /// Inserts NEW rows in as few statements as the engine allows (lock_owner as insert_new).
  virtual void insert_batch(sql::Connection& conn, const std::vector<EventEnvelope>& events,
                            std::string_view lock_owner = {}) = 0;
  /// NEW/RETRY → DONE, clearing the claim. Returns rows changed (0 if already terminal, absent,
  /// or claimed by another owner). A row of a message group counts whoever holds it: its
  /// partition's lease holds it, not a lock (GroupStore::claim).
  virtual int mark_done(sql::Connection& conn, std::string_view event_id, Timestamp now,
                        std::string_view owner = {}) = 0;
  /// mark_done for many ids in one statement per chunk; returns rows changed.
  virtual int mark_done_batch(sql::Connection& conn, const std::vector<std::string>& event_ids,
                              Timestamp now, std::string_view owner = {}) = 0;
  /// → RETRY with attempts + 1, due `delay` after now, error stored sanitized.
  virtual int mark_retry(sql::Connection& conn, std::string_view event_id, Timestamp now,
                         std::chrono::milliseconds delay, std::string_view error,
                         std::string_view owner = {}) = 0;
  /// → RETRY due `delay` after now without counting an attempt (a listener's RetryLater).
  virtual int mark_deferred(sql::Connection& conn, std::string_view event_id, Timestamp now,
                            std::chrono::milliseconds delay, std::string_view reason,
                            std::string_view owner = {}) = 0;
  /// → DEAD at `now` with the error (attempts + 1 when `count_attempt`). done_at records when it
  /// became DEAD: a purge's retention counts from then, not from created_at.
  virtual int mark_dead(sql::Connection& conn, std::string_view event_id, Timestamp now,
                        std::string_view error, bool count_attempt = true,
                        std::string_view owner = {}) = 0;
  /// Sets locked_at = now on those of `event_ids` that `owner` still holds claimed and pending
  /// (a heartbeat: rows waiting in a node's queue keep their claim); rows locked by a statement
  /// right now may be skipped. Returns the ids renewed.
  virtual std::vector<std::string> renew_claims(sql::Connection& conn, std::string_view owner,
                                                const std::vector<std::string>& event_ids,
                                                Timestamp now) = 0;
  /// NEW/RETRY rows due at `now` and created at or before now - skip_recent, oldest first; with
  /// `after`, only rows ordered after that key (a keyset page: the scan skips the rows before it).
  virtual std::vector<OutboxEvent> poll_pending(sql::Connection& conn, Timestamp now,
                                                std::chrono::microseconds skip_recent, int limit,
                                                const PendingKey* after = nullptr) = 0;
  /// Like poll_pending, but atomically sets locked_by = owner, locked_at = now on rows that are
  /// unlocked, whose lock is older than `lock_timeout`, or that `owner` itself claimed longer than
  /// own_claim_grace(lock_timeout) ago (rows its writer inserted claimed but its hot path dropped);
  /// returns only the rows it claimed, oldest first. Safe across processes sharing the database.
  virtual std::vector<OutboxEvent> claim_pending(sql::Connection& conn, std::string_view owner,
                                                 Timestamp now,
                                                 std::chrono::milliseconds lock_timeout,
                                                 std::chrono::microseconds skip_recent, int limit,
                                                 const PendingKey* after = nullptr) = 0;
  /// DEAD rows, optional filters, in the order they were written (insert order: replayed in this
  /// order, a message group comes back head first). With `with_payloads` false the payloads are not
  /// read (empty in the result): listings stay small whatever the events carry.
  virtual std::vector<OutboxEvent> query_dead(sql::Connection& conn,
                                              std::optional<std::string_view> event_type,
                                              std::optional<std::string_view> aggregate_type,
                                              int limit, bool with_payloads = true) = 0;
  /// DEAD → NEW with attempts 0, due now. Returns rows changed.
  virtual int replay_dead(sql::Connection& conn, std::string_view event_id, Timestamp now) = 0;
  /// replay_dead, only while the row's last_error is still `last_error` (nullopt: none): a row
  /// that failed again for another reason since it was listed is left alone.
  virtual int replay_dead_if(sql::Connection& conn, std::string_view event_id,
                             const std::optional<std::string>& last_error, Timestamp now) = 0;
  /// Deletes one DEAD row while its last_error is still `last_error` (nullopt: none), unless a
  /// subscription has not read it yet (as the purge keeps such rows). Returns rows deleted (0:
  /// not DEAD, another error now, or kept).
  virtual int discard_dead(sql::Connection& conn, std::string_view event_id,
                           const std::optional<std::string>& last_error) = 0;
  /// Number of DEAD rows, optionally of one type.
  virtual int count_dead(sql::Connection& conn, std::optional<std::string_view> event_type) = 0;
  /// One row by id, or nullopt.
  virtual std::optional<OutboxEvent> find(sql::Connection& conn, std::string_view event_id) = 0;
  /// Rows per status (NEW, DONE, RETRY, DEAD in that order).
  virtual std::vector<std::int64_t> count_by_status(sql::Connection& conn) = 0;
  /// Releases the pending rows `owner` still holds (a stopping node that will not process them),
  /// so other nodes can claim them at once instead of after the lock timeout. Returns rows freed.
  virtual int release_claims(sql::Connection& conn, std::string_view owner) = 0;
  /// DEAD rows per event type, most first.
  virtual std::vector<std::pair<std::string, std::int64_t>> count_dead_by_type(
      sql::Connection& conn) = 0;
  /// created_at of the oldest NEW/RETRY row (due or not), or nullopt when none is pending.
  virtual std::optional<Timestamp> oldest_pending(sql::Connection& conn) = 0;
  /// The lease the status writes are conditioned on, or nullptr when they are not fenced.
  virtual const LeaseFence* fence() const { return nullptr; }
};

/// Decodes a row into the envelope the listeners receive, with headers parsed by `codec`.
/// Throws std::invalid_argument when the headers or the payload do not decode.
EventEnvelope to_envelope(const OutboxEvent& row, const JsonCodec& codec);

}  // namespace outbox

namespace outbox {
/// Throws std::invalid_argument unless `name` matches ^[A-Za-z_][A-Za-z0-9_]{0,62}$.
void validate_table_name(std::string_view name);

/// The name of an index or constraint of `table`: table + suffix when it fits 63 characters
/// (PostgreSQL cuts longer names, so two would collide; MariaDB refuses them), otherwise a
/// prefix of the table, a hash of the whole name (case-insensitive, as PostgreSQL and SQLite
/// compare unquoted names), and the suffix.
std::string derived_name(std::string_view table, std::string_view suffix);
}  // namespace outbox
