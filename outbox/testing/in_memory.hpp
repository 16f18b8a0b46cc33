#pragma once
// An outbox without a database, for tests of code that writes or handles events: an in-memory
// table, connections whose transactions keep or drop the rows written in them, a pool, a store and
// a purger with the same contract as the SQL ones (checked by the store contract suite).

#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "outbox/json_codec.hpp"
#include "outbox/purge.hpp"
#include "outbox/sql/pool.hpp"
#include "outbox/store.hpp"

namespace outbox::testing {

/// The rows of one in-memory outbox table, shared by its connections. Thread-safe.
class InMemoryDatabase {
 public:
  /// A row's place in claim order.
  struct Key {
    Timestamp created_at;
    std::string event_id;
    auto operator<=>(const Key&) const = default;
  };
  /// Every committed row, in (created_at, event_id) order.
  std::vector<OutboxEvent> rows() const;

 private:
  friend class InMemoryConnection;
  friend class InMemoryOutboxStore;
  friend class InMemoryEventPurger;
  friend class InMemoryAgeBasedPurger;
  mutable std::mutex mutex_;                     // guards rows_ and ids_
  std::map<Key, OutboxEvent> rows_;              // claim order
  std::map<std::string, Key, std::less<>> ids_;  // event id → its key
};

/// A sql::Connection over an InMemoryDatabase. Rows inserted inside a transaction become visible
/// to others at commit() and vanish at rollback(); every other change applies at once. It runs no
/// SQL: execute() and query() throw std::logic_error. Dialect "memory". One thread at a time.
class InMemoryConnection final : public sql::Connection {
 public:
  explicit InMemoryConnection(std::shared_ptr<InMemoryDatabase> db) : db_(std::move(db)) {}
  std::int64_t execute(std::string_view sql, std::span<const sql::Value> params) override;
  std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override;
  /// Throws std::logic_error when a transaction is open already.
  void begin() override;
  /// Publishes the rows inserted in the transaction. Throws UniqueViolationError (nothing
  /// published) when another connection committed one of their ids first.
  void commit() override;
  void rollback() override;
  bool in_transaction() const override { return in_transaction_; }
  std::string_view dialect() const override { return "memory"; }
  /// Like SQLite: one writing transaction at a time.
  bool single_writer() const override { return true; }

  InMemoryDatabase& database() const { return *db_; }

 private:
  friend class InMemoryOutboxStore;
  std::shared_ptr<InMemoryDatabase> db_;
  bool in_transaction_ = false;
  std::vector<OutboxEvent> staged_;  // inserted in the open transaction
};

/// A pool of InMemoryConnections on `db`.
std::shared_ptr<sql::ConnectionPool> make_in_memory_pool(std::shared_ptr<InMemoryDatabase> db,
                                                         std::size_t max_size = 8);

/// OutboxStore over InMemoryConnections (any other connection: std::invalid_argument), on the
/// caller's clock, with the SQL stores' rules: claims, owners, keyset pages, DONE and DEAD rows
/// left alone by status updates. A duplicate event id throws UniqueViolationError. Thread-safe.
class InMemoryOutboxStore final : public OutboxStore {
 public:
  explicit InMemoryOutboxStore(const JsonCodec& codec = JsonCodec::default_codec())
      : codec_(codec) {}

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
  int replay_dead_if(sql::Connection& conn, std::string_view event_id,
                     const std::optional<std::string>& last_error, Timestamp now) override;
  int discard_dead(sql::Connection& conn, std::string_view event_id,
                   const std::optional<std::string>& last_error) override;
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
  // DEAD → NEW; with `last_error`, only while the row still holds that error.
  static int replay_row(InMemoryDatabase& db, std::string_view event_id, Timestamp now,
                        const std::optional<std::string>* last_error);
  const JsonCodec& codec_;
};

/// Status-based purger for InMemoryOutboxStore: DONE rows done before `before`, DEAD rows that
/// became DEAD before it, oldest first. Thread-safe.
class InMemoryEventPurger final : public EventPurger {
 public:
  int purge(sql::Connection& conn, Timestamp before, int limit) override;
};

/// Age-based purger for InMemoryOutboxStore (writer-only tables): every row created before
/// `before` except pending rows someone holds claimed. Thread-safe.
class InMemoryAgeBasedPurger final : public EventPurger {
 public:
  int purge(sql::Connection& conn, Timestamp before, int limit) override;
  bool deletes_pending() const override { return true; }
};

}  // namespace outbox::testing
