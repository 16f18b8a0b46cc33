#pragma once
// Stream mode: every committed event in one order that never skips a commit, and subscriptions
// that each read that order from their own stored cursor (see docs/subscriptions.md).

#include <compare>
#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/store.hpp"

namespace outbox {

struct LeaseToken;

/// A place in the stream. PostgreSQL orders by (xid, seq); the other engines by seq alone (xid 0).
/// Position {0, 0} is before every event.
struct StreamPosition {
  std::int64_t xid = 0;
  std::int64_t seq = 0;
  auto operator<=>(const StreamPosition&) const = default;
  /// "xid:seq" (PostgreSQL) or "seq".
  std::string to_string() const;
  /// Reads to_string()'s forms. Throws std::invalid_argument.
  static StreamPosition parse(std::string_view text);
};

/// One row read from the stream.
struct StreamEvent {
  StreamPosition position;
  OutboxEvent row;
};

/// Raised when the stream cannot be read safely as it stands (e.g. a PostgreSQL database restored
/// from a dump whose transaction ids went backwards); what() says the one-line fix.
class StreamError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

/// What keeps the stream from moving past a point: the oldest open transaction that wrote (or may
/// write) rows not yet readable. PostgreSQL only.
struct StreamHoldback {
  std::int64_t pid = 0;
  std::chrono::milliseconds age{0};  ///< how long that transaction has been open
  std::string state;                 ///< "active", "idle in transaction", …
};

/// How far a cursor is behind the readable end of the stream.
struct StreamLag {
  std::int64_t events = 0;
  std::optional<Timestamp> oldest_unread;  ///< created_at of the first unread event
};

enum class SubscriptionStatus { Active, Paused, Failed };
/// "ACTIVE", "PAUSED", "FAILED": the spelling in the subscription table.
std::string_view to_string(SubscriptionStatus status);
/// Throws std::invalid_argument for another spelling.
SubscriptionStatus parse_subscription_status(std::string_view text);

/// Which events a subscription takes. Empty lists match everything; globs use * and ?. A tag
/// condition is "name" (present) or "name=value".
struct SubscriptionFilter {
  std::vector<std::string> event_types;      ///< any of these (globs)
  std::vector<std::string> aggregate_types;  ///< any of these (globs)
  std::vector<std::string> required_tags;    ///< all of these
  std::vector<std::string> any_of_tags;      ///< at least one of these
  bool operator==(const SubscriptionFilter&) const = default;

  bool matches(const EventEnvelope& event) const;
  /// As stored in the subscription table: a JSON object of the four lists.
  std::string to_json() const;
  /// Throws std::invalid_argument when `json` is not what to_json writes.
  static SubscriptionFilter from_json(std::string_view json);
  /// Throws std::invalid_argument naming a bad entry (empty, or a tag with an empty name).
  void validate() const;
};

/// A subscription as configured: its name and what it reads and where it sends it.
struct SubscriptionSpec {
  std::string name;  ///< 1 to 190 bytes of printable ASCII, no spaces (its lease is "sub:<name>")
  SubscriptionFilter filter;
  std::string publisher;  ///< the relay's publisher name
  std::string target;     ///< topic or URL template
};

/// A subscription's row.
struct SubscriptionState {
  SubscriptionSpec spec;
  SubscriptionStatus status = SubscriptionStatus::Active;
  StreamPosition cursor;  ///< every event at or before it is done with
  int error_count = 0;
  std::optional<std::string> last_error;
  std::int64_t delivered = 0;  ///< events handed to the publisher, ever
  Timestamp created_at;
  Timestamp updated_at;
  std::optional<Timestamp> last_delivered_at;
  /// When it stopped keeping its unread rows from purge (release_retention); nullopt: it keeps
  /// them, whatever its status.
  std::optional<Timestamp> released_at;
  /// Set when the row cannot be used as it stands (e.g. a malformed filter written with SQL): the
  /// reason. A runner does not deliver for it; the row is still listed.
  std::optional<std::string> problem;
};

/// Checks a subscription name. Throws std::invalid_argument.
void validate_subscription_name(std::string_view name);

/// The stream of one outbox table and its subscription table, on one engine. Each call is one
/// short statement or transaction on `conn` (none may be open). Thread-safe (stateless apart from
/// configuration); every call throws StoreError on database errors.
class StreamStore {
 public:
  virtual ~StreamStore() = default;

  /// Up to `limit` events after `after`, in stream order, of those no open transaction can still
  /// precede: a later read never returns an event before the last one returned.
  virtual std::vector<StreamEvent> read(sql::Connection& conn, StreamPosition after, int limit) = 0;
  /// The last readable position ({0, 0} when the stream is empty).
  virtual StreamPosition head(sql::Connection& conn) = 0;
  /// The position just before the first event created at or after `t` (head when none).
  virtual StreamPosition position_before(sql::Connection& conn, Timestamp t) = 0;
  /// How many readable events lie after `after`, and the oldest of them.
  virtual StreamLag lag(sql::Connection& conn, StreamPosition after) = 0;
  /// What holds the stream back; nullopt where nothing does or the engine cannot tell.
  virtual std::optional<StreamHoldback> holdback(sql::Connection& conn) = 0;
  /// Throws StreamError when the stream cannot be read safely (see StreamError).
  virtual void check(sql::Connection& conn) = 0;
  /// True when committed rows get their position from sequence() (MariaDB) rather than at insert.
  virtual bool needs_sequencer() const { return false; }
  /// True when positions are "xid:seq" (PostgreSQL); false when they are a seq alone.
  virtual bool positions_have_xid() const { return false; }
  /// Numbers up to `limit` committed rows that have no position yet, in one transaction; how many.
  /// One process at a time should run it (a lease); a second one waits, it never duplicates.
  virtual int sequence(sql::Connection& conn, int limit);
  /// PostgreSQL after a restore (see check()): moves every row to one old transaction id and each
  /// cursor to just before its first unread row; returns the rows moved. Events read since the
  /// cursor's transaction may be delivered again.
  virtual std::int64_t rebase(sql::Connection& conn);

  /// Creates the subscription at `start` unless one of that name exists; true when created.
  virtual bool create(sql::Connection& conn, const SubscriptionSpec& spec,
                      StreamPosition start) = 0;
  /// Sets filter, publisher and target of an existing subscription; false when there is none.
  virtual bool update_spec(sql::Connection& conn, const SubscriptionSpec& spec) = 0;
  /// Deletes it; false when there was none.
  virtual bool remove(sql::Connection& conn, std::string_view name) = 0;
  virtual std::optional<SubscriptionState> find(sql::Connection& conn, std::string_view name) = 0;
  /// Every subscription, by name.
  virtual std::vector<SubscriptionState> list(sql::Connection& conn) = 0;
  /// Moves the cursor from `from` to `to` and adds `delivered`, resetting the error count: only
  /// while the cursor is still `from` (a rewind in between wins) and, with a token, only while it
  /// is the live holding of the subscription's lease. False when nothing changed.
  virtual bool advance(sql::Connection& conn, std::string_view name, StreamPosition from,
                       StreamPosition to, std::int64_t delivered, const LeaseToken* token) = 0;
  /// Counts a failed attempt and keeps `error`; FAILED once the count reaches `max_errors` (never
  /// with 0). Conditioned like advance(). The status after it (nullopt: nothing changed).
  virtual std::optional<SubscriptionStatus> record_error(sql::Connection& conn,
                                                         std::string_view name,
                                                         std::string_view error, int max_errors,
                                                         const LeaseToken* token) = 0;
  /// Sets the status when it is one of `from`; to ACTIVE also clears the error count, the last
  /// error and released_at. True when changed.
  virtual bool set_status(sql::Connection& conn, std::string_view name, SubscriptionStatus to,
                          std::vector<SubscriptionStatus> from) = 0;
  /// Moves the cursor to `to` (back or forward) and clears errors. True when the subscription
  /// exists.
  virtual bool rewind(sql::Connection& conn, std::string_view name, StreamPosition to) = 0;
  /// Makes it FAILED with `reason` and lets purges delete the rows it has not read (every other
  /// subscription, whatever its status, keeps them). True when it exists.
  virtual bool release_retention(sql::Connection& conn, std::string_view name,
                                 std::string_view reason) = 0;
  /// The lowest cursor of the subscriptions that keep their rows; nullopt when there are none.
  virtual std::optional<StreamPosition> retained_from(sql::Connection& conn) = 0;
};

}  // namespace outbox
