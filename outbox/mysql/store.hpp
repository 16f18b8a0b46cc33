#pragma once
// The MariaDB/MySQL OutboxStore, schema and purgers: DATETIME(6) in UTC, JSON, TINYINT, and
// indexed generated columns standing in for the partial indexes these engines lack.

#include <atomic>
#include <string>

#include "outbox/json_codec.hpp"
#include "outbox/purge.hpp"
#include "outbox/store.hpp"

namespace outbox::mysql {

/// Creates the outbox table and its indexes if missing (idempotent). Throws outbox::StoreError,
/// std::invalid_argument on a bad table name.
void create_schema(sql::Connection& conn, const std::string& table = "outbox_event");

/// OutboxStore for MariaDB 10.6+ / MySQL 8. Claims run SELECT … FOR UPDATE SKIP LOCKED and an
/// UPDATE in one short transaction (joining the caller's if one is open). JSON payloads are kept as
/// written. Thread-safe (stateless).
class MySqlOutboxStore final : public OutboxStore {
 public:
  struct Options {
    std::string table = "outbox_event";
    /// Lease expiry, due times and done times use the server's clock (UTC_TIMESTAMP(6)), so nodes
    /// with skewed clocks agree; the `now` arguments are then ignored and skip_recent counts from
    /// the time a row became due. False uses the caller's clock.
    bool use_database_clock = true;
    const JsonCodec* codec = nullptr;  ///< default: JsonCodec::default_codec()
  };
  /// Throws std::invalid_argument on a bad table name.
  explicit MySqlOutboxStore(Options options);
  MySqlOutboxStore() : MySqlOutboxStore(Options{}) {}

  void insert_new(sql::Connection& conn, const EventEnvelope& event,
                  std::string_view lock_owner = {}) override;
  void insert_batch(sql::Connection& conn, const std::vector<EventEnvelope>& events,
                    std::string_view lock_owner = {}) override;
  int mark_done(sql::Connection& conn, std::string_view event_id, Timestamp now,
                std::string_view owner = {}) override;
  int mark_done_batch(sql::Connection& conn, const std::vector<std::string>& event_ids,
                      Timestamp now, std::string_view owner = {}) override;
  int mark_retry(sql::Connection& conn, std::string_view event_id, Timestamp now,
                 std::chrono::milliseconds delay, std::string_view error,
                 std::string_view owner = {}) override;
  int mark_deferred(sql::Connection& conn, std::string_view event_id, Timestamp now,
                    std::chrono::milliseconds delay, std::string_view reason,
                    std::string_view owner = {}) override;
  int mark_dead(sql::Connection& conn, std::string_view event_id, Timestamp now,
                std::string_view error, bool count_attempt = true,
                std::string_view owner = {}) override;
  std::vector<std::string> renew_claims(sql::Connection& conn, std::string_view owner,
                                        const std::vector<std::string>& event_ids,
                                        Timestamp now) override;
  std::vector<OutboxEvent> poll_pending(sql::Connection& conn, Timestamp now,
                                        std::chrono::microseconds skip_recent, int limit,
                                        const PendingKey* after = nullptr) override;
  std::vector<OutboxEvent> claim_pending(sql::Connection& conn, std::string_view owner,
                                         Timestamp now, std::chrono::milliseconds lock_timeout,
                                         std::chrono::microseconds skip_recent, int limit,
                                         const PendingKey* after = nullptr) override;
  std::vector<OutboxEvent> query_dead(sql::Connection& conn,
                                      std::optional<std::string_view> event_type,
                                      std::optional<std::string_view> aggregate_type, int limit,
                                      bool with_payloads = true) override;
  int replay_dead(sql::Connection& conn, std::string_view event_id, Timestamp now) override;
  int count_dead(sql::Connection& conn, std::optional<std::string_view> event_type) override;
  std::optional<OutboxEvent> find(sql::Connection& conn, std::string_view event_id) override;
  std::vector<std::int64_t> count_by_status(sql::Connection& conn) override;
  int release_claims(sql::Connection& conn, std::string_view owner) override;
  std::vector<std::pair<std::string, std::int64_t>> count_dead_by_type(
      sql::Connection& conn) override;
  std::optional<Timestamp> oldest_pending(sql::Connection& conn) override;

 private:
  int reschedule(sql::Connection& conn, std::string_view event_id, Timestamp now,
                 std::chrono::milliseconds delay, std::string_view message, bool count_attempt,
                 std::string_view owner);
  std::size_t packet_budget(sql::Connection& conn);
  Options options_;
  std::string select_;
  std::string select_without_payload_;         // the same columns, the payloads left empty
  std::atomic<std::size_t> packet_budget_{0};  // bytes per INSERT; 0: not asked yet
};

/// Deletes DONE rows done before `before` and DEAD rows that became DEAD before it (done_at; a
/// DEAD row without done_at, from before schema version 2, is kept). Thread-safe.
class MySqlEventPurger final : public EventPurger {
 public:
  explicit MySqlEventPurger(std::string table = "outbox_event");
  int purge(sql::Connection& conn, Timestamp before, int limit) override;

 private:
  std::string table_;
};

/// Deletes every row created before `before` whatever its status, except rows a relay holds
/// claimed: for writer-only (CDC) tables, where nothing marks rows DONE. Outbox accepts it only in
/// writer_only mode, since it would delete events that are still to be delivered. Thread-safe.
class MySqlAgeBasedPurger final : public EventPurger {
 public:
  explicit MySqlAgeBasedPurger(std::string table = "outbox_event");
  int purge(sql::Connection& conn, Timestamp before, int limit) override;
  bool deletes_pending() const override { return true; }

 private:
  std::string table_;
};

}  // namespace outbox::mysql
