#include "outbox/writer.hpp"

#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"
#include "outbox/tx_context.hpp"

namespace outbox {
namespace {

template <typename Fn>
void guarded(const char* what, Fn&& fn) noexcept {
  try {
    fn();
  } catch (const std::exception& e) {
    log(LogLevel::Error, std::string("WriterHook::") + what + " threw: " + e.what());
  } catch (...) {
    log(LogLevel::Error, std::string("WriterHook::") + what + " threw a non-standard exception");
  }
}

// After a commit whose transaction ran transaction-control SQL through the connection (a plain
// SAVEPOINT rolled back, a ROLLBACK AND CHAIN, …): which events' rows really exist. The ones that
// do not were undone and must not reach the hot path; if the check itself fails, none does (the
// poller delivers the rows that exist).
std::pair<std::vector<EventEnvelope>, std::vector<EventEnvelope>> split_by_row(
    sql::Connection& conn, OutboxStore& store, const std::vector<EventEnvelope>& events) {
  std::vector<EventEnvelope> present;
  std::vector<EventEnvelope> undone;
  try {
    for (const auto& e : events) {
      (store.find(conn, e.event_id()) ? present : undone).push_back(e);
    }
  } catch (const std::exception& ex) {
    log(LogLevel::Warning,
        std::string("OutboxWriter: could not check after commit which events were undone; the "
                    "poller delivers them: ") +
            ex.what());
    return {{}, events};
  }
  for (const auto& e : undone) {
    log(LogLevel::Warning, "OutboxWriter: event " + e.event_id() +
                               " was undone inside its transaction (savepoint or ROLLBACK run "
                               "through the connection); it is not delivered");
  }
  return {std::move(present), std::move(undone)};
}

}  // namespace

OutboxWriter::OutboxWriter(std::shared_ptr<TxContext> tx_context,
                           std::shared_ptr<OutboxStore> store, std::shared_ptr<WriterHook> hook,
                           TraceContextProvider trace_context,
                           std::shared_ptr<MetricsExporter> metrics)
    : tx_context_(std::move(tx_context)),
      store_(std::move(store)),
      hook_(std::move(hook)),
      trace_context_(std::move(trace_context)),
      metrics_(metrics ? std::move(metrics) : MetricsExporter::noop()) {
  if (!tx_context_) {
    throw std::invalid_argument("OutboxWriter: tx_context is required");
  }
  if (!store_) {
    throw std::invalid_argument("OutboxWriter: store is required");
  }
}

std::optional<std::string> OutboxWriter::write(const EventEnvelope& event) {
  auto ids = write_all({event});
  if (ids.empty()) {
    return std::nullopt;
  }
  return std::move(ids.front());
}

std::optional<std::string> OutboxWriter::write(EventType type, std::string payload_json) {
  return write(EventEnvelope::of_json(std::move(type), std::move(payload_json)));
}

std::vector<std::string> OutboxWriter::write_all(std::vector<EventEnvelope> events) {
  if (!tx_context_->is_transaction_active()) {
    throw std::logic_error("OutboxWriter: write requires an active transaction");
  }
  for (auto& e : events) {
    TraceStamp stamp;
    e = stamp_trace_context(e, trace_context_, stamp);
    if (stamp == TraceStamp::Dropped) {
      metrics_->increment_trace_context_dropped();
      log(LogLevel::Warning, "OutboxWriter: event " + e.event_id() +
                                 ": an invalid traceparent/tracestate was removed (the event "
                                 "is written without it)");
    }
  }
  if (hook_) {
    events = hook_->before_write(std::move(events));
  }
  if (events.empty()) {
    return {};
  }
  auto& conn = tx_context_->current_connection();
  const std::string_view owner = hook_ ? hook_->lock_owner() : std::string_view();
  try {
    if (events.size() == 1) {
      store_->insert_new(conn, events.front(), owner);
    } else {
      store_->insert_batch(conn, events, owner);
    }
  } catch (const UniqueViolationError& e) {
    // Tagged here, not in the drivers: the outbox insert is the statement, and event_id is the
    // table's only unique key, whereas the same error from a business statement is the caller's.
    throw DuplicateEventError(
        (events.size() == 1
             ? "duplicate event id " + events.front().event_id()
             : std::string("duplicate event id in a batch of ") + std::to_string(events.size())) +
            ": " + e.what(),
        e);
  }
  std::vector<std::string> ids;
  ids.reserve(events.size());
  for (const auto& e : events) {
    ids.push_back(e.event_id());
  }
  if (hook_) {
    guarded("after_write", [&] { hook_->after_write(events); });
    auto shared = std::make_shared<const std::vector<EventEnvelope>>(std::move(events));
    tx_context_->after_commit([hook = hook_, shared, store = store_, connection = &conn] {
      guarded("after_commit", [&] {
        if (!connection->transaction_suspect()) {
          hook->after_commit(*shared);
          return;
        }
        // Not a structured binding: clang before 16 cannot capture one in the lambda below.
        const auto split = split_by_row(*connection, *store, *shared);
        const auto& present = split.first;
        const auto& undone = split.second;
        if (!undone.empty()) {
          guarded("after_rollback", [&] { hook->after_rollback(undone); });
        }
        if (!present.empty()) {
          hook->after_commit(present);
        }
      });
    });
    tx_context_->after_rollback([hook = hook_, shared] {
      guarded("after_rollback", [&] { hook->after_rollback(*shared); });
    });
    tx_context_->after_unknown_outcome([hook = hook_, shared] {
      guarded("after_unknown_outcome", [&] { hook->after_unknown_outcome(*shared); });
    });
  }
  return ids;
}

}  // namespace outbox
