#pragma once
// Real stores with one fault injected: ForwardingStore hands every call to a wrapped store, and a
// test overrides the call it wants to disturb (FailingDoneStore: a status write the database
// refuses, for tests of what the dispatcher does then).

#include <atomic>
#include <memory>
#include <string>

#include "outbox/errors.hpp"
#include "outbox/store.hpp"

namespace outbox::testing {

// Hands every call to `inner`.
class ForwardingStore : public OutboxStore {
 public:
  explicit ForwardingStore(std::shared_ptr<OutboxStore> inner) : inner_(std::move(inner)) {}
  void insert_new(sql::Connection& c, const EventEnvelope& e, std::string_view o) override {
    inner_->insert_new(c, e, o);
  }
  void insert_batch(sql::Connection& c, const std::vector<EventEnvelope>& e,
                    std::string_view o) override {
    inner_->insert_batch(c, e, o);
  }
  int mark_done(sql::Connection& c, std::string_view id, Timestamp now,
                std::string_view owner) override {
    return inner_->mark_done(c, id, now, owner);
  }
  int mark_done_batch(sql::Connection& c, const std::vector<std::string>& ids, Timestamp now,
                      std::string_view owner) override {
    return inner_->mark_done_batch(c, ids, now, owner);
  }
  int mark_retry(sql::Connection& c, std::string_view id, Timestamp now,
                 std::chrono::milliseconds d, std::string_view e, std::string_view o) override {
    return inner_->mark_retry(c, id, now, d, e, o);
  }
  int mark_deferred(sql::Connection& c, std::string_view id, Timestamp now,
                    std::chrono::milliseconds d, std::string_view r, std::string_view o) override {
    return inner_->mark_deferred(c, id, now, d, r, o);
  }
  int mark_dead(sql::Connection& c, std::string_view id, Timestamp now, std::string_view e,
                bool count, std::string_view o) override {
    return inner_->mark_dead(c, id, now, e, count, o);
  }
  std::vector<std::string> renew_claims(sql::Connection& c, std::string_view o,
                                        const std::vector<std::string>& ids,
                                        Timestamp now) override {
    return inner_->renew_claims(c, o, ids, now);
  }
  std::vector<OutboxEvent> poll_pending(sql::Connection& c, Timestamp now,
                                        std::chrono::microseconds skip, int limit,
                                        const PendingKey* after) override {
    return inner_->poll_pending(c, now, skip, limit, after);
  }
  std::vector<OutboxEvent> claim_pending(sql::Connection& c, std::string_view owner, Timestamp now,
                                         std::chrono::milliseconds lock,
                                         std::chrono::microseconds skip, int limit,
                                         const PendingKey* after) override {
    return inner_->claim_pending(c, owner, now, lock, skip, limit, after);
  }
  std::vector<OutboxEvent> query_dead(sql::Connection& c, std::optional<std::string_view> t,
                                      std::optional<std::string_view> a, int limit,
                                      bool with_payloads = true) override {
    return inner_->query_dead(c, t, a, limit, with_payloads);
  }
  int replay_dead(sql::Connection& c, std::string_view id, Timestamp now) override {
    return inner_->replay_dead(c, id, now);
  }
  int replay_dead_if(sql::Connection& c, std::string_view id,
                     const std::optional<std::string>& last_error, Timestamp now) override {
    return inner_->replay_dead_if(c, id, last_error, now);
  }
  int discard_dead(sql::Connection& c, std::string_view id,
                   const std::optional<std::string>& last_error) override {
    return inner_->discard_dead(c, id, last_error);
  }
  int count_dead(sql::Connection& c, std::optional<std::string_view> t) override {
    return inner_->count_dead(c, t);
  }
  std::optional<OutboxEvent> find(sql::Connection& c, std::string_view id) override {
    return inner_->find(c, id);
  }
  std::vector<std::int64_t> count_by_status(sql::Connection& c) override {
    return inner_->count_by_status(c);
  }
  int release_claims(sql::Connection& c, std::string_view o) override {
    return inner_->release_claims(c, o);
  }
  std::vector<std::pair<std::string, std::int64_t>> count_dead_by_type(
      sql::Connection& c) override {
    return inner_->count_dead_by_type(c);
  }
  std::optional<Timestamp> oldest_pending(sql::Connection& c) override {
    return inner_->oldest_pending(c);
  }

 protected:
  std::shared_ptr<OutboxStore> inner_;
};

// A store whose DONE marks fail for one event id until two writes were refused (the dispatcher
// tries a refused outcome twice).
class FailingDoneStore final : public ForwardingStore {
 public:
  FailingDoneStore(std::shared_ptr<OutboxStore> inner, std::string fail_id)
      : ForwardingStore(std::move(inner)), fail_id_(std::move(fail_id)) {}
  int mark_done(sql::Connection& c, std::string_view id, Timestamp now,
                std::string_view owner) override {
    if (id == fail_id_ && refusals_.fetch_add(1) < 2) {
      throw StoreError("injected: status write refused");
    }
    return inner_->mark_done(c, id, now, owner);
  }
  int mark_done_batch(sql::Connection& c, const std::vector<std::string>& ids, Timestamp now,
                      std::string_view owner) override {
    for (const auto& id : ids) {
      if (id == fail_id_ && refusals_.fetch_add(1) < 2) {
        throw StoreError("injected: status write refused");
      }
    }
    return inner_->mark_done_batch(c, ids, now, owner);
  }

 private:
  std::string fail_id_;
  std::atomic<int> refusals_{0};
};

}  // namespace outbox::testing
