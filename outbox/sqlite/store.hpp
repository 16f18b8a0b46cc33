#pragma once
// The SQLite OutboxStore, schema and purgers. Timestamps are INTEGER microseconds since the epoch.

#include <string>

#include "outbox/json_codec.hpp"
#include "outbox/purge.hpp"
#include "outbox/store.hpp"

namespace outbox::sqlite {

/// Creates the outbox table and its indexes if missing (idempotent). Throws outbox::StoreError,
/// std::invalid_argument on a bad table name.
void create_schema(sql::Connection& conn, const std::string& table = "outbox_event");

/// OutboxStore for SQLite. Claims are single UPDATE … RETURNING statements, atomic across
/// processes sharing the file. Thread-safe (stateless).
class SqliteOutboxStore final : public OutboxStore {
 public:
  /// Throws std::invalid_argument on a bad table name.
  explicit SqliteOutboxStore(std::string table = "outbox_event",
                             const JsonCodec& codec = JsonCodec::default_codec());

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

  const std::string& table() const noexcept { return table_; }

 private:
  void insert_chunk(sql::Connection& conn, const EventEnvelope* events, std::size_t count,
                    std::string_view lock_owner);

  std::string table_;
  const JsonCodec& codec_;
  std::string select_columns_;
  std::string select_without_payload_;  // the same columns, the payload left empty
  std::string mark_done_sql_, mark_retry_sql_, mark_deferred_sql_, mark_dead_sql_, poll_sql_,
      poll_after_sql_, claim_sql_, claim_after_sql_;
};

/// Deletes DONE rows done before `before` and DEAD rows that became DEAD before it (done_at; a
/// DEAD row without done_at, from before schema version 2, is kept). Thread-safe.
class SqliteEventPurger final : public EventPurger {
 public:
  explicit SqliteEventPurger(std::string table = "outbox_event");
  int purge(sql::Connection& conn, Timestamp before, int limit) override;

 private:
  std::string table_;
};

/// Deletes every row created before `before` whatever its status, except rows a relay holds
/// claimed: for writer-only (CDC) tables, where nothing marks rows DONE. Outbox accepts it only in
/// writer_only mode, since it would delete events that are still to be delivered. Thread-safe.
class SqliteAgeBasedPurger final : public EventPurger {
 public:
  explicit SqliteAgeBasedPurger(std::string table = "outbox_event");
  int purge(sql::Connection& conn, Timestamp before, int limit) override;
  bool deletes_pending() const override { return true; }

 private:
  std::string table_;
};

}  // namespace outbox::sqlite
