#include "outbox/testing/in_memory.hpp"

#include <algorithm>
#include <stdexcept>

#include "outbox/errors.hpp"

namespace outbox::testing {
namespace {

InMemoryConnection& memory(sql::Connection& conn) {
  auto* c = dynamic_cast<InMemoryConnection*>(&conn);
  if (c == nullptr) {
    throw std::invalid_argument("InMemoryOutboxStore: not an InMemoryConnection");
  }
  return *c;
}

bool pending(const OutboxEvent& e) {
  return e.status == EventStatus::New || e.status == EventStatus::Retry;
}

// A status update's condition: still pending, and held by `owner` when one is given.
bool updatable(const OutboxEvent& e, std::string_view owner) {
  return pending(e) && (owner.empty() || e.locked_by == owner);
}
// A DONE mark's: a grouped row is held by its partition's lease, not locked (as SqlOutboxStore).
bool markable_done(const OutboxEvent& e, std::string_view owner) {
  return updatable(e, e.message_group ? std::string_view() : owner);
}

void clear_claim(OutboxEvent& e) {
  e.locked_by.reset();
  e.locked_at.reset();
}

}  // namespace

std::vector<OutboxEvent> InMemoryDatabase::rows() const {
  std::lock_guard lock(mutex_);
  std::vector<OutboxEvent> out;
  out.reserve(rows_.size());
  for (const auto& [key, row] : rows_) {
    out.push_back(row);
  }
  return out;
}

std::int64_t InMemoryConnection::execute(std::string_view, std::span<const sql::Value>) {
  throw std::logic_error("InMemoryConnection runs no SQL");
}

std::vector<sql::Row> InMemoryConnection::query(std::string_view, std::span<const sql::Value>) {
  throw std::logic_error("InMemoryConnection runs no SQL");
}

void InMemoryConnection::begin() {
  if (in_transaction_) {
    throw std::logic_error("InMemoryConnection: a transaction is open already");
  }
  in_transaction_ = true;
  staged_.clear();
}

void InMemoryConnection::commit() {
  if (!in_transaction_) {
    throw std::logic_error("InMemoryConnection: no transaction to commit");
  }
  in_transaction_ = false;
  auto staged = std::move(staged_);
  staged_.clear();
  std::lock_guard lock(db_->mutex_);
  for (const auto& row : staged) {
    if (db_->ids_.count(row.event_id) != 0) {
      throw UniqueViolationError("memory: duplicate event id " + row.event_id + " at commit");
    }
  }
  for (auto& row : staged) {
    const InMemoryDatabase::Key key{row.created_at, row.event_id};
    db_->ids_.emplace(row.event_id, key);
    db_->rows_.emplace(key, std::move(row));
  }
}

void InMemoryConnection::rollback() {
  in_transaction_ = false;
  staged_.clear();
}

std::shared_ptr<sql::ConnectionPool> make_in_memory_pool(std::shared_ptr<InMemoryDatabase> db,
                                                         std::size_t max_size) {
  return std::make_shared<sql::ConnectionPool>(sql::ConnectionPool::Options{
      .factory = [db] { return std::make_unique<InMemoryConnection>(db); }, .max_size = max_size});
}

void InMemoryOutboxStore::insert_new(sql::Connection& conn, const EventEnvelope& event,
                                     std::string_view lock_owner) {
  insert_batch(conn, {event}, lock_owner);
}

void InMemoryOutboxStore::insert_batch(sql::Connection& conn,
                                       const std::vector<EventEnvelope>& events,
                                       std::string_view lock_owner) {
  auto& c = memory(conn);
  const Timestamp claimed_at = Clock::system()->now();
  std::vector<OutboxEvent> rows;
  rows.reserve(events.size());
  for (const auto& e : events) {
    OutboxEvent row;
    row.event_id = e.event_id();
    row.event_type = e.event_type();
    row.aggregate_type = e.aggregate_type();
    row.aggregate_id = e.aggregate_id();
    row.tenant_id = e.tenant_id();
    row.payload_is_json = e.has_json_payload();
    row.payload = row.payload_is_json
                      ? e.payload_json()
                      : std::string(e.payload_bytes().begin(), e.payload_bytes().end());
    row.headers_json = codec_.to_json(e.headers());
    row.tags_json = codec_.to_json(e.tags());
    row.message_group = e.message_group();
    if (row.message_group) {
      row.partition_no = message_group_partition(*row.message_group);
    }
    row.created_at = e.occurred_at();
    row.available_at = e.available_at().value_or(e.occurred_at());
    if (!lock_owner.empty()) {
      row.locked_by = std::string(lock_owner);
      row.locked_at = claimed_at;
    }
    rows.push_back(std::move(row));
  }
  std::lock_guard lock(c.db_->mutex_);
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto& id = rows[i].event_id;
    const bool staged_twice = std::any_of(c.staged_.begin(), c.staged_.end(),
                                          [&](const OutboxEvent& s) { return s.event_id == id; }) ||
                              std::any_of(rows.begin(), rows.begin() + static_cast<long>(i),
                                          [&](const OutboxEvent& s) { return s.event_id == id; });
    if (staged_twice || c.db_->ids_.count(id) != 0) {
      throw UniqueViolationError("memory: duplicate event id " + id);
    }
  }
  if (c.in_transaction_) {
    for (auto& row : rows) {
      c.staged_.push_back(std::move(row));
    }
    return;
  }
  for (auto& row : rows) {
    const InMemoryDatabase::Key key{row.created_at, row.event_id};
    c.db_->ids_.emplace(row.event_id, key);
    c.db_->rows_.emplace(key, std::move(row));
  }
}

namespace {

// Runs `change` on the committed row `id` (under the database lock); 0 when absent.
template <typename Change>
int change_row(const std::map<std::string, InMemoryDatabase::Key, std::less<>>& ids,
               std::map<InMemoryDatabase::Key, OutboxEvent>& rows, std::string_view id,
               Change change) {
  auto it = ids.find(id);
  if (it == ids.end()) {
    return 0;
  }
  return change(rows.at(it->second)) ? 1 : 0;
}

}  // namespace

int InMemoryOutboxStore::mark_done(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                   std::string_view owner) {
  return mark_done_batch(conn, {std::string(event_id)}, now, owner);
}

int InMemoryOutboxStore::mark_done_batch(sql::Connection& conn,
                                         const std::vector<std::string>& event_ids, Timestamp now,
                                         std::string_view owner) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  int changed = 0;
  for (const auto& id : event_ids) {
    changed += change_row(db.ids_, db.rows_, id, [&](OutboxEvent& e) {
      if (!markable_done(e, owner)) {
        return false;
      }
      e.status = EventStatus::Done;
      e.done_at = now;
      clear_claim(e);
      return true;
    });
  }
  return changed;
}

int InMemoryOutboxStore::mark_retry(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                    std::chrono::milliseconds delay, std::string_view error,
                                    std::string_view owner) {
  return reschedule(conn, event_id, now, delay, error, true, owner);
}

int InMemoryOutboxStore::mark_deferred(sql::Connection& conn, std::string_view event_id,
                                       Timestamp now, std::chrono::milliseconds delay,
                                       std::string_view reason, std::string_view owner) {
  return reschedule(conn, event_id, now, delay, reason, false, owner);
}

int InMemoryOutboxStore::reschedule(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                    std::chrono::milliseconds delay, std::string_view message,
                                    bool count_attempt, std::string_view owner) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  return change_row(db.ids_, db.rows_, event_id, [&](OutboxEvent& e) {
    if (!updatable(e, owner)) {
      return false;
    }
    e.status = EventStatus::Retry;
    e.attempts += count_attempt ? 1 : 0;
    e.available_at = now + clamp_delay(delay);
    e.last_error = truncate_error(message);
    clear_claim(e);
    return true;
  });
}

int InMemoryOutboxStore::mark_dead(sql::Connection& conn, std::string_view event_id, Timestamp now,
                                   std::string_view error, bool count_attempt,
                                   std::string_view owner) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  return change_row(db.ids_, db.rows_, event_id, [&](OutboxEvent& e) {
    if (!updatable(e, owner)) {
      return false;
    }
    e.status = EventStatus::Dead;
    e.attempts += count_attempt ? 1 : 0;
    e.last_error = truncate_error(error);
    e.done_at = now;
    clear_claim(e);
    return true;
  });
}

std::vector<std::string> InMemoryOutboxStore::renew_claims(
    sql::Connection& conn, std::string_view owner, const std::vector<std::string>& event_ids,
    Timestamp now) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  std::vector<std::string> renewed;
  for (const auto& id : event_ids) {
    if (change_row(db.ids_, db.rows_, id, [&](OutboxEvent& e) {
          if (!pending(e) || e.locked_by != owner) {
            return false;
          }
          e.locked_at = now;
          return true;
        }) != 0) {
      renewed.push_back(id);
    }
  }
  return renewed;
}

namespace {

// Pending rows due at `now`, created at or before now - skip_recent, after `after`, in claim
// order, passing `also`; at most `limit`.
template <typename Also>
std::vector<OutboxEvent*> due_rows(std::map<InMemoryDatabase::Key, OutboxEvent>& rows,
                                   Timestamp now, std::chrono::microseconds skip_recent, int limit,
                                   const PendingKey* after, Also also) {
  std::vector<OutboxEvent*> out;
  auto it = rows.begin();
  if (after != nullptr) {
    it = rows.upper_bound(InMemoryDatabase::Key{after->created_at, after->event_id});
  }
  for (; it != rows.end() && static_cast<int>(out.size()) < limit; ++it) {
    auto& e = it->second;
    if (pending(e) && e.available_at <= now && e.created_at <= now - skip_recent && also(e)) {
      out.push_back(&e);
    }
  }
  return out;
}

}  // namespace

std::vector<OutboxEvent> InMemoryOutboxStore::poll_pending(sql::Connection& conn, Timestamp now,
                                                           std::chrono::microseconds skip_recent,
                                                           int limit, const PendingKey* after) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  std::vector<OutboxEvent> out;
  for (auto* e : due_rows(db.rows_, now, skip_recent, limit, after,
                          [](const OutboxEvent&) { return true; })) {
    out.push_back(*e);
  }
  return out;
}

std::vector<OutboxEvent> InMemoryOutboxStore::claim_pending(sql::Connection& conn,
                                                            std::string_view owner, Timestamp now,
                                                            std::chrono::milliseconds lock_timeout,
                                                            std::chrono::microseconds skip_recent,
                                                            int limit, const PendingKey* after) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  const auto grace = own_claim_grace(lock_timeout);
  std::vector<OutboxEvent> out;
  for (auto* e : due_rows(db.rows_, now, skip_recent, limit, after, [&](const OutboxEvent& r) {
         return !r.locked_by || *r.locked_at < now - lock_timeout ||
                (r.locked_by == owner && *r.locked_at < now - grace);
       })) {
    e->locked_by = std::string(owner);
    e->locked_at = now;
    out.push_back(*e);
  }
  return out;
}

std::vector<OutboxEvent> InMemoryOutboxStore::query_dead(
    sql::Connection& conn, std::optional<std::string_view> event_type,
    std::optional<std::string_view> aggregate_type, int limit, bool with_payloads) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  std::vector<OutboxEvent> out;
  for (const auto& [key, e] : db.rows_) {
    if (static_cast<int>(out.size()) >= limit) {
      break;
    }
    if (e.status == EventStatus::Dead && (!event_type || e.event_type == *event_type) &&
        (!aggregate_type || e.aggregate_type == *aggregate_type)) {
      out.push_back(e);
      if (!with_payloads) {
        out.back().payload.clear();
        out.back().payload_is_json = true;
      }
    }
  }
  return out;
}

int InMemoryOutboxStore::replay_row(InMemoryDatabase& db, std::string_view event_id, Timestamp now,
                                    const std::optional<std::string>* last_error) {
  std::lock_guard lock(db.mutex_);
  return change_row(db.ids_, db.rows_, event_id, [&](OutboxEvent& e) {
    if (e.status != EventStatus::Dead || (last_error && e.last_error != *last_error)) {
      return false;
    }
    e.status = EventStatus::New;
    e.attempts = 0;
    e.available_at = now;
    e.done_at.reset();
    clear_claim(e);
    return true;
  });
}

int InMemoryOutboxStore::replay_dead(sql::Connection& conn, std::string_view event_id,
                                     Timestamp now) {
  return replay_row(memory(conn).database(), event_id, now, nullptr);
}

int InMemoryOutboxStore::replay_dead_if(sql::Connection& conn, std::string_view event_id,
                                        const std::optional<std::string>& last_error,
                                        Timestamp now) {
  return replay_row(memory(conn).database(), event_id, now, &last_error);
}

int InMemoryOutboxStore::discard_dead(sql::Connection& conn, std::string_view event_id,
                                      const std::optional<std::string>& last_error) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  const auto id = db.ids_.find(event_id);
  if (id == db.ids_.end() || db.rows_.at(id->second).status != EventStatus::Dead ||
      db.rows_.at(id->second).last_error != last_error) {
    return 0;
  }
  db.rows_.erase(id->second);
  db.ids_.erase(id);
  return 1;
}

int InMemoryOutboxStore::count_dead(sql::Connection& conn,
                                    std::optional<std::string_view> event_type) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  return static_cast<int>(std::count_if(db.rows_.begin(), db.rows_.end(), [&](const auto& kv) {
    return kv.second.status == EventStatus::Dead &&
           (!event_type || kv.second.event_type == *event_type);
  }));
}

std::optional<OutboxEvent> InMemoryOutboxStore::find(sql::Connection& conn,
                                                     std::string_view event_id) {
  auto& c = memory(conn);
  for (const auto& row : c.staged_) {  // the connection's own uncommitted rows
    if (row.event_id == event_id) {
      return row;
    }
  }
  auto& db = c.database();
  std::lock_guard lock(db.mutex_);
  auto it = db.ids_.find(event_id);
  if (it == db.ids_.end()) {
    return std::nullopt;
  }
  return db.rows_.at(it->second);
}

std::vector<std::int64_t> InMemoryOutboxStore::count_by_status(sql::Connection& conn) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  std::vector<std::int64_t> counts(4, 0);
  for (const auto& [key, e] : db.rows_) {
    ++counts[static_cast<std::size_t>(e.status)];
  }
  return counts;
}

int InMemoryOutboxStore::release_claims(sql::Connection& conn, std::string_view owner) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  int freed = 0;
  for (auto& [key, e] : db.rows_) {
    if (pending(e) && e.locked_by == owner) {
      clear_claim(e);
      ++freed;
    }
  }
  return freed;
}

std::vector<std::pair<std::string, std::int64_t>> InMemoryOutboxStore::count_dead_by_type(
    sql::Connection& conn) {
  auto& db = memory(conn).database();
  std::map<std::string, std::int64_t> by_type;
  {
    std::lock_guard lock(db.mutex_);
    for (const auto& [key, e] : db.rows_) {
      if (e.status == EventStatus::Dead) {
        ++by_type[e.event_type];
      }
    }
  }
  std::vector<std::pair<std::string, std::int64_t>> out(by_type.begin(), by_type.end());
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return out;
}

std::optional<Timestamp> InMemoryOutboxStore::oldest_pending(sql::Connection& conn) {
  auto& db = memory(conn).database();
  std::lock_guard lock(db.mutex_);
  for (const auto& [key, e] : db.rows_) {
    if (pending(e)) {
      return e.created_at;
    }
  }
  return std::nullopt;
}

namespace {

// Deletes the oldest rows (claim order) that `doomed` selects, at most `limit`.
template <typename Doomed>
int delete_rows(std::mutex& mutex, std::map<std::string, InMemoryDatabase::Key, std::less<>>& ids,
                std::map<InMemoryDatabase::Key, OutboxEvent>& rows, int limit, Doomed doomed) {
  std::lock_guard lock(mutex);
  int deleted = 0;
  for (auto it = rows.begin(); it != rows.end() && deleted < limit;) {
    if (doomed(it->second)) {
      ids.erase(it->second.event_id);
      it = rows.erase(it);
      ++deleted;
    } else {
      ++it;
    }
  }
  return deleted;
}

}  // namespace

int InMemoryEventPurger::purge(sql::Connection& conn, Timestamp before, int limit) {
  auto& db = memory(conn).database();
  return delete_rows(db.mutex_, db.ids_, db.rows_, limit, [&](const OutboxEvent& e) {
    return (e.status == EventStatus::Done && e.done_at.value_or(e.created_at) < before) ||
           (e.status == EventStatus::Dead && e.done_at && *e.done_at < before);
  });
}

int InMemoryAgeBasedPurger::purge(sql::Connection& conn, Timestamp before, int limit) {
  auto& db = memory(conn).database();
  return delete_rows(db.mutex_, db.ids_, db.rows_, limit, [&](const OutboxEvent& e) {
    return e.created_at < before && !(pending(e) && e.locked_by);
  });
}

}  // namespace outbox::testing
