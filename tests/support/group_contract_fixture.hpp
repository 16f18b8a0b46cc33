#pragma once
// The fixture of the group store's contract tests (group_contract_test.cpp, group_schema_test.cpp):
// a migrated table on each engine, its group store and lease store, and the writes, leases, scans
// and claims those tests make.

#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "outbox/lease_manager.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"
#include "tests/support/stream_fixture.hpp"

namespace outbox::testing {

inline EventEnvelope grouped(const std::string& id, const std::string& group) {
  return EventEnvelope::builder(EventType::of("Moved"))
      .event_id(id)
      .aggregate_type(AggregateType::of("Order"))
      .aggregate_id(group)
      .message_group(group)
      .payload_json("{\"id\":\"" + id + "\"}")
      .build();
}

inline EventEnvelope plain(const std::string& id) {
  return EventEnvelope::builder(EventType::of("Moved")).event_id(id).payload_json("{}").build();
}

// The first `n` keys "<prefix><i>" whose partition is `partition`.
inline std::vector<std::string> keys_of_partition(const std::string& prefix, int partition,
                                                  std::size_t n) {
  std::vector<std::string> keys;
  for (int i = 0; keys.size() < n; ++i) {
    if (message_group_partition(prefix + std::to_string(i)) == partition) {
      keys.push_back(prefix + std::to_string(i));
    }
  }
  return keys;
}

inline std::vector<std::string> ids_of(const std::vector<OutboxEvent>& rows) {
  std::vector<std::string> out;
  for (const auto& r : rows) {
    out.push_back(r.event_id);
  }
  return out;
}

class GroupContractFixture : public StreamFixture {
 protected:
  void SetUp() override {
    StreamFixture::SetUp();
    if (pool_) {
      auto conn = pool_->acquire();
      groups_ = detect_group_store(*conn, table_);
    }
  }
  void TearDown() override {
    if (pool_ && GetParam().name != "sqlite") {
      pool_->acquire()->execute("DROP TABLE IF EXISTS " + sql::group_block_table_name(table_));
    }
    StreamFixture::TearDown();
  }
  void write(const std::vector<EventEnvelope>& events) {
    auto conn = pool_->acquire();
    store_->insert_batch(*conn, events);
  }
  LeaseToken take(const std::string& name, const std::string& owner = "relay-a") {
    auto conn = pool_->acquire();
    auto token = leases_->acquire(*conn, name, owner, std::chrono::seconds(30));
    EXPECT_TRUE(token.has_value());
    return *token;
  }
  std::vector<std::string> scan_ids(int partition, const std::string& after = {}, int limit = 100) {
    auto conn = pool_->acquire();
    std::vector<std::string> out;
    for (const auto& r :
         groups_->scan(*conn, {{partition, after, limit}}, Clock::system()->now())) {
      out.push_back(r.event_id);
    }
    return out;
  }
  // Reads the rows under `token`, then holds each for `owner`, as a relay does before it writes
  // a failure: the ids held.
  std::vector<std::string> claim(const std::vector<std::string>& ids, const LeaseToken& token,
                                 const std::string& owner = "relay-a") {
    auto conn = pool_->acquire();
    std::vector<std::string> held;
    for (const auto& id : ids_of(groups_->claim(*conn, {token}, ids))) {
      if (groups_->hold(*conn, id, token, owner, Clock::system()->now())) {
        held.push_back(id);
      }
    }
    return held;
  }
  std::shared_ptr<GroupStore> groups_;
};

}  // namespace outbox::testing
