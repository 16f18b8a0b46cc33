#pragma once
// The outbox store and purgers written once over a Dialect. An engine derives its store from
// SqlOutboxStore, gives its dialect and implements the claim (what truly differs between engines).

#include <cstddef>
#include <functional>
#include <optional>
#include <string>

#include "outbox/json_codec.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/purge.hpp"
#include "outbox/sql/dialect.hpp"
#include "outbox/store.hpp"

namespace outbox::sql {

/// Options of every engine's store.
struct StoreOptions {
  std::string table = "outbox_event";
  /// Lease expiry, due times and done times use the server's clock, so nodes with skewed clocks
  /// agree; the `now` arguments are then ignored and skip_recent counts from the time a row became
  /// due. False uses the caller's clock. Engines without a server clock (SQLite) always use the
  /// caller's.
  bool use_database_clock = true;
  const JsonCodec* codec = nullptr;  ///< default: JsonCodec::default_codec()
  /// Primary + standby: the status writes (mark_*) are conditioned on this lease in the same
  /// statement, so a process that lost the lease changes no row's outcome (LeaseLostError when it
  /// knows it does not hold the lease; no row changed, and the holding verified, when only the
  /// database knows). Claims are not fenced (claim locking and a lease are alternatives).
  std::shared_ptr<LeaseFence> fence;
  /// The outbox table whose lease table holds the fence's lease; empty: `table`. (A relay
  /// draining several tables fences them all on the lease of the first.)
  std::string fence_table;
  /// Rows for Debezium's outbox event router instead of our relay (docs/debezium.md; tables a
  /// writer_only Outbox writes): inserts also fill tracingspancontext (schema version 7) from the
  /// traceparent and tracestate headers, and refuse binary payloads (std::invalid_argument: the
  /// router reads one payload column).
  struct Debezium {
    /// Deletes the rows again right after inserting them, in the same transaction: the table stays
    /// empty while the change stream keeps the inserts (the router drops deletes).
    bool delete_after_insert = false;
  };
  std::optional<Debezium> debezium;
};

/// OutboxStore over `dialect` (which must outlive the store). Every method but the claim and the
/// claim renewal is generic SQL. Thread-safe (stateless apart from configuration).
class SqlOutboxStore : public OutboxStore {
 public:
  using Options = StoreOptions;

  void insert_new(Connection& conn, const EventEnvelope& event,
                  std::string_view lock_owner = {}) override;
  void insert_batch(Connection& conn, const std::vector<EventEnvelope>& events,
                    std::string_view lock_owner = {}) override;
  int mark_done(Connection& conn, std::string_view event_id, Timestamp now,
                std::string_view owner = {}) override;
  int mark_done_batch(Connection& conn, const std::vector<std::string>& event_ids, Timestamp now,
                      std::string_view owner = {}) override;
  int mark_retry(Connection& conn, std::string_view event_id, Timestamp now,
                 std::chrono::milliseconds delay, std::string_view error,
                 std::string_view owner = {}) override;
  int mark_deferred(Connection& conn, std::string_view event_id, Timestamp now,
                    std::chrono::milliseconds delay, std::string_view reason,
                    std::string_view owner = {}) override;
  int mark_dead(Connection& conn, std::string_view event_id, Timestamp now, std::string_view error,
                bool count_attempt = true, std::string_view owner = {}) override;
  std::vector<OutboxEvent> poll_pending(Connection& conn, Timestamp now,
                                        std::chrono::microseconds skip_recent, int limit,
                                        const PendingKey* after = nullptr) override;
  std::vector<OutboxEvent> query_dead(Connection& conn, std::optional<std::string_view> event_type,
                                      std::optional<std::string_view> aggregate_type, int limit,
                                      bool with_payloads = true) override;
  int replay_dead(Connection& conn, std::string_view event_id, Timestamp now) override;
  int replay_dead_if(Connection& conn, std::string_view event_id,
                     const std::optional<std::string>& last_error, Timestamp now) override;
  int discard_dead(Connection& conn, std::string_view event_id,
                   const std::optional<std::string>& last_error) override;
  int count_dead(Connection& conn, std::optional<std::string_view> event_type) override;
  std::optional<OutboxEvent> find(Connection& conn, std::string_view event_id) override;
  std::vector<std::int64_t> count_by_status(Connection& conn) override;
  int release_claims(Connection& conn, std::string_view owner) override;
  std::vector<std::pair<std::string, std::int64_t>> count_dead_by_type(Connection& conn) override;
  std::optional<Timestamp> oldest_pending(Connection& conn) override;

  const std::string& table() const { return options_.table; }

 protected:
  /// Throws std::invalid_argument on a bad table name.
  SqlOutboxStore(const Dialect& dialect, Options options);

  /// With a fence: appends the lease condition, or throws LeaseLostError when the lease is not
  /// held. Without one: nothing.
  void condition_on_lease(Statement& s) const;
  /// A DONE mark's condition on who holds the row (the rest of the store: locked_by = owner).
  static void done_by(Statement& s, std::string_view owner);
  /// With a fence: a write that changed fewer than `expected` rows has the holding verified (it
  /// may have changed nothing because the lease is gone). Returns `changed`.
  int fenced_result(std::int64_t changed, std::size_t expected) const;
  const LeaseFence* fence() const override { return options_.fence.get(); }
  /// A statement in this store's dialect and clock.
  Statement statement() const { return Statement(dialect_, database_clock_); }
  /// Appends " WHERE <pending> AND due at now AND settled for skip_recent".
  void where_due(Statement& s, Timestamp now, std::chrono::microseconds skip_recent) const;
  /// Appends the claim condition (unlocked, expired, or the owner's own past its grace) and the
  /// keyset condition for `after`.
  void claimable(Statement& s, std::string_view owner, Timestamp now,
                 std::chrono::milliseconds lock_timeout, const PendingKey* after) const;
  /// Appends the keyset condition: only rows ordered after `after` (nothing when null).
  void after_key(Statement& s, const PendingKey* after) const;
  /// Appends " ORDER BY <pending order> LIMIT <limit>".
  void oldest_first(Statement& s, int limit) const;
  /// Whether a claim with these arguments would take a row: a read of the row it would take
  /// first, by the claim's index (an engine's claim then need not lock or write for nothing).
  bool claim_would_take(Connection& conn, std::string_view owner, Timestamp now,
                        std::chrono::milliseconds lock_timeout,
                        std::chrono::microseconds skip_recent, const PendingKey* after) const;
  /// The columns event_row maps, optionally without payloads.
  const std::string& columns(bool with_payloads = true) const {
    return with_payloads ? columns_ : columns_without_payload_;
  }
  /// How many ids one statement takes.
  std::size_t id_chunk() const;
  /// The most bytes one multi-row insert may carry (MariaDB's max_allowed_packet); no limit here.
  virtual std::size_t insert_byte_budget(Connection& conn);

 private:
  // DEAD → NEW; with `last_error`, only while the row still holds that error.
  int replay(Connection& conn, std::string_view event_id, Timestamp now,
             const std::optional<std::string>* last_error);
  int reschedule(Connection& conn, std::string_view event_id, Timestamp now,
                 std::chrono::milliseconds delay, std::string_view message, bool count_attempt,
                 std::string_view owner);
  // Debezium layout: std::invalid_argument for a binary payload, before anything is written.
  void require_json_payloads(const EventEnvelope* events, std::size_t count) const;
  void insert_chunk(Connection& conn, const EventEnvelope* events,
                    const std::optional<std::string>* headers, std::size_t count,
                    std::string_view lock_owner, Timestamp claimed_at);

  const Dialect& dialect_;
  Options options_;
  bool database_clock_;  // asked for and available
  std::string lease_table_;
  std::string columns_;
  std::string columns_without_payload_;
};

/// Deletes DONE rows done before `before` and DEAD rows that became DEAD before it (done_at; a
/// DEAD row without done_at, from before schema version 2, is kept), except rows a subscription
/// has not read yet (unless it released them: StreamStore::release_retention). Thread-safe.
class SqlEventPurger : public EventPurger {
 public:
  /// Throws std::invalid_argument on a bad table name. With `use_database_clock` (and a dialect
  /// that has a server clock), purge_older_than counts retention from the server's time, the clock
  /// done_at was written with.
  SqlEventPurger(const Dialect& dialect, std::string table, bool use_database_clock = true);
  int purge(Connection& conn, Timestamp before, int limit) override;
  int purge_older_than(Connection& conn, std::chrono::microseconds retention, Timestamp now,
                       int limit) override;

 private:
  int purge_where(Connection& conn, int limit, const std::function<void(Statement&)>& cutoff);
  const Dialect& dialect_;
  std::string table_;
  bool use_database_clock_;
};

/// Deletes every row created before `before` whatever its status, except rows a relay holds
/// claimed and rows a subscription has not read yet (as SqlEventPurger): for writer-only (CDC)
/// tables and tables read only by subscriptions, where nothing marks rows DONE. Outbox accepts it
/// only in writer_only mode, since it would delete events that are still to be delivered.
/// Thread-safe.
class SqlAgeBasedPurger : public EventPurger {
 public:
  /// Throws std::invalid_argument on a bad table name.
  SqlAgeBasedPurger(const Dialect& dialect, std::string table);
  int purge(Connection& conn, Timestamp before, int limit) override;
  bool deletes_pending() const override { return true; }

 private:
  const Dialect& dialect_;
  std::string table_;
};

}  // namespace outbox::sql
