#pragma once
// Several multi-node Outboxes over one grouped table on one engine (each with its own pool and
// lease manager, as relays would be), and the ledger that checks every group's order as events
// arrive: the message-group suites' fixture.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdio>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "outbox/dispatcher.hpp"
#include "outbox/interceptor.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/listener.hpp"
#include "outbox/outbox.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/sql/group_store.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/tables.hpp"
#include "tests/support/test_support.hpp"

namespace outbox::testing {

using namespace std::chrono_literals;

inline int number_of(const EventEnvelope& e) {
  const auto text = e.payload_json();
  return std::stoi(std::string(text.substr(text.find(':') + 1)));
}

// What every group received, checked as it arrives: a new event must be the next one of its group
// (every earlier one already seen); a repeat is counted, never an order violation.
class OrderLedger {
 public:
  void record(const std::string& node, const EventEnvelope& e) {
    const int n = number_of(e);
    std::lock_guard lock(mutex_);
    auto& seen = seen_[*e.message_group()];
    if (seen.empty()) {
      started_.push_back(*e.message_group());
    }
    if (seen.contains(n)) {
      ++repeats_;
    } else if (n != static_cast<int>(seen.size())) {
      violations_.push_back(*e.message_group() + ": got " + std::to_string(n) + " after " +
                            std::to_string(seen.size()) + " events");
      seen.insert(n);
    } else {
      seen.insert(n);
    }
    by_node_[node] += 1;
    ++delivered_;
  }
  std::size_t complete_groups(int per_group) {
    std::lock_guard lock(mutex_);
    std::size_t n = 0;
    for (const auto& [group, seen] : seen_) {
      n += static_cast<int>(seen.size()) == per_group ? 1 : 0;
    }
    return n;
  }
  std::set<int> seen(const std::string& group) {
    std::lock_guard lock(mutex_);
    return seen_[group];
  }
  std::vector<std::string> violations() {
    std::lock_guard lock(mutex_);
    return violations_;
  }
  std::map<std::string, int> by_node() {
    std::lock_guard lock(mutex_);
    return by_node_;
  }
  int repeats() {
    std::lock_guard lock(mutex_);
    return repeats_;
  }
  // Groups in the order their first event arrived.
  std::vector<std::string> started() {
    std::lock_guard lock(mutex_);
    return started_;
  }

 private:
  std::mutex mutex_;
  std::map<std::string, std::set<int>> seen_;
  std::vector<std::string> started_;
  std::vector<std::string> violations_;
  std::map<std::string, int> by_node_;
  int repeats_ = 0;
  int delivered_ = 0;
};

// Groups running at once across every node, as the listeners see it.
class Concurrency {
 public:
  void enter() {
    const int now = ++running_;
    int seen = most_.load();
    while (now > seen && !most_.compare_exchange_weak(seen, now)) {
    }
  }
  void leave() { --running_; }
  int most() const { return most_.load(); }

 private:
  std::atomic<int> running_{0};
  std::atomic<int> most_{0};
};

struct Node {
  std::string name;
  std::shared_ptr<sql::ConnectionPool> pool;
  std::shared_ptr<LeaseManager> leases;
  std::shared_ptr<OutboxStore> store;
  std::shared_ptr<GroupStore> groups;
  std::shared_ptr<DefaultListenerRegistry> listeners = std::make_shared<DefaultListenerRegistry>();
  std::shared_ptr<ThreadLocalTxContext> tx_context = std::make_shared<ThreadLocalTxContext>();
  std::unique_ptr<Outbox> outbox;

  void write(const std::string& group, int n) {
    TransactionManager tx(pool, tx_context);
    auto t = tx.begin();
    outbox->writer().write(EventEnvelope::builder(EventType::of("E"))
                               .message_group(group)
                               .payload_json("{\"n\":" + std::to_string(n) + "}")
                               .build());
    t.commit();
  }
  std::size_t partitions_held() const {
    std::size_t n = 0;
    for (int p = 0; p < kMessageGroupPartitions; ++p) {
      n += leases->token(partition_lease_name(p)) ? 1 : 0;
    }
    return n;
  }
};

// Hands events to one batch listener (as the relay's Kafka and HTTP-batch publishers are): every
// event, or those whose type `takes` accepts when it is set (the rest one by one, as to a
// webhook), beside the node's registry for the single-event form.
class BatchRegistry final : public ListenerRegistry {
 public:
  BatchRegistry(std::shared_ptr<const ListenerRegistry> singles, BatchEventListener batch,
                std::function<bool(std::string_view)> takes)
      : singles_(std::move(singles)),
        batch_(std::make_shared<const BatchEventListener>(std::move(batch))),
        takes_(std::move(takes)) {}
  std::shared_ptr<const EventListener> listener_for(std::string_view a,
                                                    std::string_view t) const override {
    return singles_->listener_for(a, t);
  }
  std::shared_ptr<const BatchEventListener> batch_listener_for(std::string_view,
                                                               std::string_view t) const override {
    return !takes_ || takes_(t) ? batch_ : nullptr;
  }

 private:
  std::shared_ptr<const ListenerRegistry> singles_;
  std::shared_ptr<const BatchEventListener> batch_;
  std::function<bool(std::string_view)> takes_;
};

class GroupFixture : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    const auto url = GetParam().url();
    OUTBOX_REQUIRE_SERVER(url, display_name(GetParam().name));
    url_ = GetParam().name == "sqlite" ? "sqlite://" + dir_.file("groups.db") : *url;
    table_ = unique_table("grouped");
    auto pool = open_pool(url_, 1);
    create_schema_for(*pool->acquire(), table_);
  }
  void TearDown() override {
    nodes_.clear();
    if (!table_.empty() && GetParam().name != "sqlite" && !url_.empty()) {
      drop_outbox_tables(*open_pool(url_, 1)->acquire(), table_);
    }
  }

  // `batches`: events go to a batch listener, up to 50 per call.
  Node& node(const std::string& name, GroupFailurePolicy policy = GroupFailurePolicy::Block,
             int max_attempts = 3, bool batches = false) {
    auto n = std::make_unique<Node>();
    n->name = name;
    n->pool = open_pool(url_, 6);
    auto conn = n->pool->acquire();
    n->leases = std::make_shared<LeaseManager>(
        LeaseManager::Options{.connection_provider = n->pool,
                              .store = detect_lease_store(*conn, table_),
                              .owner = name,
                              .ttl = 2000ms,
                              .renew_interval = 200ms});
    n->store = detect_store(*conn, table_);
    n->groups = detect_group_store(*conn, table_);
    if (wrap_groups_) {
      n->groups = wrap_groups_(n->groups);
    }
    n->listeners->register_listener(EventType::of("E"), [this, name](const EventEnvelope& e) {
      concurrency_.enter();
      struct Leave {
        Concurrency& c;
        ~Leave() { c.leave(); }
      } leave{concurrency_};
      if (fail_ && fail_(e)) {
        throw std::runtime_error("endpoint refused event " + std::to_string(number_of(e)));
      }
      ledger_.record(name, e);
      std::this_thread::yield();
    });
    std::shared_ptr<ListenerRegistry> registry = n->listeners;
    if (batches) {
      registry = std::make_shared<BatchRegistry>(
          n->listeners,
          [this, name](std::span<const EventEnvelope* const> events) {
            // A broker that fails a key's later events behind a failed one (Kafka's idempotent
            // producer does so per partition).
            std::vector<DeliveryResult> results;
            std::set<std::string> failed;
            for (const auto* e : events) {
              const auto& group = *e->message_group();
              const bool refused = fail_ && fail_(*e);  // asked of every event it is handed
              if (failed.contains(group) || refused) {
                failed.insert(group);
                results.push_back(DeliveryResult::failed("endpoint refused event " +
                                                         std::to_string(number_of(*e))));
              } else {
                ledger_.record(name, *e);
                results.push_back(DeliveryResult::delivered());
              }
            }
            return results;
          },
          batch_for_);
    }
    if (wrap_registry_) {
      registry = wrap_registry_(registry);
    }
    n->outbox = std::make_unique<Outbox>(Outbox::multi_node(
        {.connection_provider = n->pool,
         .tx_context = n->tx_context,
         .store = n->store,
         .listeners = registry,
         .claim_locking = ClaimLocking{.owner = name, .lock_timeout = 10s},
         .groups = Outbox::Groups{.leases = n->leases,
                                  .store = n->groups,
                                  .max_concurrent_groups = max_groups_,
                                  .per_group = per_group_,
                                  .on_failure = [policy](const EventEnvelope&) { return policy; }},
         .dispatcher = {.retry_policy =
                            std::make_shared<ExponentialBackoffRetryPolicy>(20ms, 20ms, false),
                        .max_attempts = max_attempts,
                        .worker_count = 4,
                        .interceptors = interceptors_,
                        .max_batch_size = batches ? 50U : 1U},
         .poller = {.batch_size = 100, .interval = interval_}}));
    nodes_.push_back(std::move(n));
    return *nodes_.back();
  }

  // Writers of different groups in parallel; each group's events from one writer, in order (the
  // serialization per key the documentation asks of writers).
  void write_groups(Node& via, int groups, int per_group, int writers = 4) {
    std::vector<std::string> keys;
    for (int g = 0; g < groups; ++g) {
      keys.push_back("key-" + std::to_string(g));
    }
    write_keys(via, keys, per_group, writers);
  }
  void write_keys(Node& via, const std::vector<std::string>& keys, int per_group, int writers) {
    std::vector<std::jthread> threads;
    for (int w = 0; w < writers; ++w) {
      threads.emplace_back([&, w] {
        for (std::size_t g = w; g < keys.size(); g += writers) {
          for (int n = 0; n < per_group; ++n) {
            via.write(keys[g], n);
          }
        }
      });
    }
  }
  // Rows as another client (the poller's to claim: this node's writer would hand them to its
  // dispatcher itself), per_group events of each key in turn, in one statement.
  void insert_rows(Node& via, const std::vector<std::string>& keys, int per_group) {
    std::vector<EventEnvelope> events;
    for (const auto& key : keys) {
      for (int n = 0; n < per_group; ++n) {
        events.push_back(EventEnvelope::builder(EventType::of("E"))
                             .message_group(key)
                             .payload_json("{\"n\":" + std::to_string(n) + "}")
                             .build());
      }
    }
    via.store->insert_batch(*via.pool->acquire(), events);
  }
  // One event of each of `types` in `key`, numbered in that order, as insert_rows() writes them.
  void insert_typed(Node& via, const std::string& key, const std::vector<std::string>& types) {
    std::vector<EventEnvelope> events;
    for (std::size_t n = 0; n < types.size(); ++n) {
      events.push_back(EventEnvelope::builder(EventType::of(types[n]))
                           .message_group(key)
                           .payload_json("{\"n\":" + std::to_string(n) + "}")
                           .build());
    }
    via.store->insert_batch(*via.pool->acquire(), events);
  }
  std::optional<OutboxEvent> row(const std::string& id) {
    return nodes_.front()->store->find(*nodes_.front()->pool->acquire(), id);
  }

  TempDir dir_;
  std::string url_;
  std::string table_;
  OrderLedger ledger_;
  Concurrency concurrency_;
  std::size_t max_groups_ = 8;
  int per_group_ = 5;
  std::chrono::milliseconds interval_ = 50ms;
  std::function<bool(const EventEnvelope&)> fail_;
  // With batches: asked which event types the batch listener takes (unset: every type).
  std::function<bool(std::string_view)> batch_for_;
  // Wraps the group store of the nodes made from now on (a test's hooks between statements).
  std::function<std::shared_ptr<GroupStore>(std::shared_ptr<GroupStore>)> wrap_groups_;
  std::vector<std::unique_ptr<Node>> nodes_;
  // The interceptors of the nodes made from now on, and what wraps their listener registry.
  std::vector<std::shared_ptr<EventInterceptor>> interceptors_;
  std::function<std::shared_ptr<ListenerRegistry>(std::shared_ptr<ListenerRegistry>)>
      wrap_registry_;
};

}  // namespace outbox::testing
