// Two Outboxes of one service on one database under one lease (primary + standby), on every
// engine: only the holder delivers, a standby takes over when the holder closes, and a holder
// deposed by the database changes no row with the writes it makes after losing the lease.

#include <gtest/gtest.h>

#include <map>
#include <mutex>

#include "outbox/detect/detect.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/listener.hpp"
#include "outbox/metrics.hpp"
#include "outbox/outbox.hpp"
#include "outbox/retry_policy.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::Gate;
using testing::wait_until;

// Who delivered what, across nodes.
struct Ledger {
  void record(const std::string& node, const std::string& id) {
    std::lock_guard lock(mutex);
    deliveries[id].push_back(node);
  }
  std::map<std::string, std::vector<std::string>> snapshot() {
    std::lock_guard lock(mutex);
    return deliveries;
  }
  std::mutex mutex;
  std::map<std::string, std::vector<std::string>> deliveries;
};

// One process of the service: its pool, lease manager, fenced store and Outbox.
struct Node {
  std::string name;
  std::shared_ptr<sql::ConnectionPool> pool;
  std::shared_ptr<InMemoryMetrics> metrics = std::make_shared<InMemoryMetrics>();
  std::shared_ptr<LeaseManager> leases;
  std::shared_ptr<OutboxStore> store;
  std::shared_ptr<DefaultListenerRegistry> listeners = std::make_shared<DefaultListenerRegistry>();
  std::shared_ptr<ThreadLocalTxContext> tx_context = std::make_shared<ThreadLocalTxContext>();
  std::unique_ptr<Outbox> outbox;

  std::string write(const std::string& type) {
    TransactionManager tx(pool, tx_context);
    auto t = tx.begin();
    auto id = outbox->writer().write(EventType::of(type), "{}");
    t.commit();
    return *id;
  }
  bool holds() const { return leases->token("leader").has_value(); }
};

class LeaseOutbox : public ::testing::TestWithParam<testing::Engine> {
 protected:
  void SetUp() override {
    const auto url = GetParam().url();
    OUTBOX_REQUIRE_SERVER(url, testing::display_name(GetParam().name));
    url_ = GetParam().name == "sqlite" ? "sqlite://" + dir_.file("lease.db") : *url;
    table_ = testing::unique_table("leased");
    auto pool = open_pool(url_, 1);
    create_schema_for(*pool->acquire(), table_);
  }
  void TearDown() override {
    if (!table_.empty() && GetParam().name != "sqlite" && !url_.empty()) {
      auto conn = open_pool(url_, 1)->acquire();
      conn->execute("DROP TABLE IF EXISTS " + sql::lease_table_name(table_));
      conn->execute("DROP TABLE IF EXISTS " + table_);
    }
  }

  std::unique_ptr<Node> node(const std::string& name,
                             std::chrono::milliseconds renew_interval = 200ms) {
    auto n = std::make_unique<Node>();
    n->name = name;
    n->pool = open_pool(url_, 4);
    auto conn = n->pool->acquire();
    n->leases = std::make_shared<LeaseManager>(
        LeaseManager::Options{.connection_provider = n->pool,
                              .store = detect_lease_store(*conn, table_),
                              .owner = name,
                              .ttl = 3000ms,
                              .renew_interval = renew_interval,
                              .metrics = n->metrics});
    n->store = engine_for(conn->dialect())
                   .make_store({.table = table_, .fence = n->leases->fence("leader")});
    n->listeners->register_listener(EventType::of("E"), [this, name](const EventEnvelope& e) {
      ledger_.record(name, e.event_id());
    });
    n->outbox = std::make_unique<Outbox>(Outbox::single_node(
        {.connection_provider = n->pool,
         .tx_context = n->tx_context,
         .store = n->store,
         .listeners = n->listeners,
         .metrics = n->metrics,
         .lease = Outbox::Lease{.manager = n->leases},
         .dispatcher = {.retry_policy =
                            std::make_shared<ExponentialBackoffRetryPolicy>(10ms, 10ms, false),
                        .worker_count = 2},
         .poller = {.interval = 100ms}}));
    return n;
  }
  std::optional<OutboxEvent> row(Node& n, const std::string& id) {
    return n.store->find(*n.pool->acquire(), id);
  }

  testing::TempDir dir_;
  std::string url_;
  std::string table_;
  Ledger ledger_;
};

TEST_P(LeaseOutbox, OnlyTheHolderDeliversAndAStandbyTakesOverWhenItCloses) {
  auto a = node("node-a");
  auto b = node("node-b");
  a->outbox->start();
  ASSERT_TRUE(wait_until([&] { return a->holds(); }));
  b->outbox->start();
  std::vector<std::string> ids;
  for (int i = 0; i < 10; ++i) {
    ids.push_back(a->write("E"));
    ids.push_back(b->write("E"));  // the standby writes too; the holder delivers
  }
  ASSERT_TRUE(wait_until([&] { return ledger_.snapshot().size() == ids.size(); }));
  EXPECT_FALSE(b->holds());
  for (const auto& [id, nodes] : ledger_.snapshot()) {
    EXPECT_EQ(nodes, std::vector<std::string>{"node-a"}) << id;
  }
  a->outbox->close();  // drains, then releases: the standby takes over at its next attempt
  ASSERT_TRUE(wait_until([&] { return b->holds(); }));
  const auto later = b->write("E");
  ASSERT_TRUE(wait_until([&] { return ledger_.snapshot().count(later) == 1; }));
  EXPECT_EQ(ledger_.snapshot().at(later), std::vector<std::string>{"node-b"});
  EXPECT_EQ(b->leases->holder("leader")->epoch, 2);
  EXPECT_EQ(b->metrics->snapshot().lease_takeovers, 0);  // released, not taken over
  for (const auto& id : ids) {
    EXPECT_EQ(row(*b, id)->status, EventStatus::Done) << id;
  }
}

// The database ends node A's holding while A still trusts it (its deadline has not passed) and
// node B takes the lease. A's listeners then finish: the RETRY and DONE it writes are fenced and
// change nothing, A gives the lease up, and B delivers both events.
TEST_P(LeaseOutbox, ADeposedHolderChangesNoRow) {
  // Renewing seldom: A must not learn of its deposition from a renewal between B's acquire and
  // the check that it does not know yet (a window of 200 ms at the usual interval).
  auto a = node("node-a", 1000ms);
  Gate gate;
  std::atomic<int> running{0};
  a->listeners->register_listener(EventType::of("Slow"), [&](const EventEnvelope& e) {
    ++running;
    gate.wait();
    if (e.payload_json() == R"("fail")") {
      throw std::runtime_error("failed after the lease was lost");
    }
  });
  a->outbox->start();
  ASSERT_TRUE(wait_until([&] { return a->holds(); }));
  std::string failing;
  std::string succeeding;
  {
    TransactionManager tx(a->pool, a->tx_context);
    auto t = tx.begin();
    failing = *a->outbox->writer().write(EventType::of("Slow"), R"("fail")");
    succeeding = *a->outbox->writer().write(EventType::of("Slow"), R"("ok")");
    t.commit();
  }
  ASSERT_TRUE(wait_until([&] { return running.load() == 2; }));
  // The database hands the lease over behind A's back; B takes it (its Outbox not started yet).
  // A renewal between the two statements keeps the lease A's, and the handover is tried again
  // (once, on a loaded machine, B came too late and the test failed).
  auto b = node("node-b");
  std::optional<LeaseToken> b_token;
  ASSERT_TRUE(wait_until([&] {
    a->pool->acquire()->execute("UPDATE " + sql::lease_table_name(table_) +
                                " SET expires_at = acquired_at WHERE name = 'leader'");
    b_token = b->leases->try_acquire("leader");
    return b_token.has_value();
  }));
  EXPECT_TRUE(a->holds());  // A does not know yet
  gate.open();
  ASSERT_TRUE(wait_until([&] { return !a->holds(); }));  // a fenced write told it
  a->outbox->close();
  for (const auto& id : {failing, succeeding}) {
    const auto r = row(*b, id);
    EXPECT_EQ(r->status, EventStatus::New) << id;  // neither RETRY nor DONE from A
    EXPECT_EQ(r->attempts, 0) << id;
    EXPECT_FALSE(r->last_error) << id;
  }
  EXPECT_EQ(a->metrics->snapshot().lease_lost, 1);
  // B delivers both (its listener succeeds).
  b->listeners->register_listener(EventType::of("Slow"), [&](const EventEnvelope& e) {
    ledger_.record("node-b", e.event_id());
  });
  b->outbox->start();
  ASSERT_TRUE(wait_until([&] {
    return row(*b, failing)->status == EventStatus::Done &&
           row(*b, succeeding)->status == EventStatus::Done;
  }));
  EXPECT_EQ(b->leases->holder("leader")->epoch, b_token->epoch);
}

INSTANTIATE_TEST_SUITE_P(Engines, LeaseOutbox, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
