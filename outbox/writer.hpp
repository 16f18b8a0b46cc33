#pragma once
// The API business code calls inside its transaction.

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/envelope.hpp"

namespace outbox {

class TxContext;
class OutboxStore;

/// Lifecycle hook around writes. Implementations must be thread-safe.
class WriterHook {
 public:
  virtual ~WriterHook() = default;
  /// May transform the events; an empty result suppresses the write.
  virtual std::vector<EventEnvelope> before_write(std::vector<EventEnvelope> events) {
    return events;
  }
  /// After the rows are inserted, before commit. Exceptions are logged and swallowed.
  virtual void after_write(const std::vector<EventEnvelope>&) {}
  /// After a successful commit. Exceptions are logged and swallowed.
  virtual void after_commit(const std::vector<EventEnvelope>&) {}
  /// After a rollback. Exceptions are logged and swallowed.
  virtual void after_rollback(const std::vector<EventEnvelope>&) {}
  /// Non-empty: rows are inserted already claimed by this owner (multi-node hot path).
  virtual std::string_view lock_owner() const { return {}; }
};

/// Writes events into the caller's current transaction. Thread-safe (each call uses the calling
/// thread's transaction).
class OutboxWriter {
 public:
  /// Throws std::invalid_argument if `tx_context` or `store` is null. No hook = no hot path.
  OutboxWriter(std::shared_ptr<TxContext> tx_context, std::shared_ptr<OutboxStore> store,
               std::shared_ptr<WriterHook> hook = {});

  /// Inserts one event; returns its id, or nullopt when the hook suppressed it. Throws
  /// std::logic_error with no active transaction, outbox::StoreError when the insert fails. After
  /// commit, events whose rows a plain-SQL savepoint or ROLLBACK undid do not reach the hook's
  /// after_commit (they get after_rollback).
  std::optional<std::string> write(const EventEnvelope& event);
  /// Shorthand for write(EventEnvelope::of_json(type, payload_json)).
  std::optional<std::string> write(EventType type, std::string payload_json);
  /// Inserts all events (one multi-row insert where possible) with one after-commit callback;
  /// returns their ids (empty when suppressed). Throws like write().
  std::vector<std::string> write_all(std::vector<EventEnvelope> events);

 private:
  std::shared_ptr<TxContext> tx_context_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<WriterHook> hook_;
};

}  // namespace outbox
