// Message groups delivered to batch listeners (a group's run in one call, as Kafka and HTTP batch
// publishers take them): a refusal stops only its own group, a group whose events go partly to a
// batch listener keeps its order, and a head whose batch route, lookup or interceptor changes at
// delivery still goes first, on every engine.

#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "tests/support/group_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::number_of;
using testing::wait_until;

class GroupBatch : public testing::GroupFixture {
 protected:
  // Group "flip" (H, E, E) in one take for the batch listener; the second lookup of H's batch
  // listener, as the take is delivered (the first was as it was queued), calls `fail`. The head
  // must still go first, and the worker live on.
  void head_lookup_fails_at_delivery(const std::function<void()>& fail) {
    // Shared: the node's workers may still ask after this returns, until TearDown stops them.
    auto asked = std::make_shared<std::atomic<int>>(0);
    batch_for_ = [asked, fail](std::string_view type) {
      if (type == "H" && ++*asked == 2) {
        fail();
      }
      return true;
    };
    auto& a = node("node-a", GroupFailurePolicy::Block, 3, true);
    a.listeners->register_listener(EventType::of("H"),
                                   [this](const EventEnvelope& e) { ledger_.record("single", e); });
    insert_typed(a, "flip", {"H", "E", "E"});
    a.outbox->start();
    ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(3) == 1; }))
        << ::testing::PrintToString(ledger_.seen("flip"));
    EXPECT_EQ(asked->load(), 2);
    EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
  }
};

// With a batch listener (a group's run in one call): an event it refuses stops only its own
// group (blocked behind it, nothing after it delivered); the other groups go on in order.
TEST_P(GroupBatch, ABatchRefusalStopsOnlyItsOwnGroup) {
  auto& a = node("node-a", GroupFailurePolicy::Block, 2, true);
  std::atomic<bool> broken{true};
  std::mutex ids_mutex;
  std::map<int, std::string> key0_ids;  // the key's events the listener was handed, by number
  fail_ = [&](const EventEnvelope& e) {
    if (*e.message_group() == "key-0") {
      std::lock_guard lock(ids_mutex);
      key0_ids[number_of(e)] = e.event_id();
    }
    return broken.load() && *e.message_group() == "key-0" && number_of(e) == 1;
  };
  write_groups(a, 20, 5, 2);  // written first: the first claims see many groups at once
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(5) == 19; }));
  auto conn = a.pool->acquire();
  ASSERT_TRUE(wait_until([&] {
    const auto info = a.groups->find(*conn, "key-0");
    return info && info->blocked;
  }));
  EXPECT_EQ(ledger_.seen("key-0"), (std::set<int>{0}));
  // The events the batch failed behind the head (when a claim took them with it) lost no attempt:
  // only the head's failures count, so none of them can block the group in the head's place (or
  // again after the retry below).
  const auto blocked = a.groups->find(*conn, "key-0");
  EXPECT_EQ(blocked->attempts, 2);
  EXPECT_EQ(blocked->head_event_id, key0_ids.at(1));
  {
    std::lock_guard lock(ids_mutex);
    for (const auto& [n, id] : key0_ids) {
      if (n > 1) {
        EXPECT_EQ(a.store->find(*conn, id)->attempts, 0) << "event " << n;
      }
    }
  }
  EXPECT_LE(a.outbox->dispatcher()->max_active_groups_seen(), max_groups_);
  broken = false;
  ASSERT_TRUE(a.groups->retry(*conn, "key-0", Clock::system()->now()));
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(5) == 20; }));
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// A group whose events go partly to a batch listener and partly one by one (one route to Kafka,
// another to a webhook), taken together: delivered in the group's order, not the batch first.
TEST_P(GroupBatch, AGroupsEventsForABatchListenerAndForSingleOnesKeepTheGroupsOrder) {
  batch_for_ = [](std::string_view type) { return type == "B"; };
  auto& a = node("node-a", GroupFailurePolicy::Block, 3, true);
  // Known one by one too (as a relay's batch publishers are): the batch listener is what runs.
  a.listeners->register_listener(EventType::of("B"),
                                 [this](const EventEnvelope& e) { ledger_.record("single", e); });
  std::vector<std::string> types;
  for (int n = 0; n < 20; ++n) {
    types.emplace_back(n % 3 == 1 ? "E" : "B");
  }
  insert_typed(a, "mixed", types);
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(20) == 1; }))
      << ::testing::PrintToString(ledger_.seen("mixed"))
      << ::testing::PrintToString(ledger_.violations());
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
  EXPECT_EQ(ledger_.repeats(), 0);
}

// A take is formed of events queued for one batch listener, and the registry is asked again as it
// is delivered: a head whose lookup then throws once, or whose batch route is gone, goes one by
// one, and still before the group's later events. (Found by a hostile round: the batch went
// first, on every engine.)
TEST_P(GroupBatch, AHeadWhoseBatchLookupFailsAtDeliveryStillGoesFirst) {
  head_lookup_fails_at_delivery([] { throw std::runtime_error("registry lookup failed once"); });
}

TEST_P(GroupBatch, AHeadWhoseBatchRouteIsGoneAtDeliveryStillGoesFirst) {
  std::atomic<int> asked{0};
  batch_for_ = [&](std::string_view type) { return type != "H" || ++asked < 2; };
  auto& a = node("node-a", GroupFailurePolicy::Block, 3, true);
  a.listeners->register_listener(EventType::of("H"),
                                 [this](const EventEnvelope& e) { ledger_.record("single", e); });
  insert_typed(a, "flip", {"H", "E", "E", "E"});
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(4) == 1; }))
      << ::testing::PrintToString(ledger_.seen("flip"));
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
  EXPECT_EQ(ledger_.repeats(), 0);
}

// An interceptor refuses a group's head once, in a batch: the head's later events stay out of
// that call and go after it. (Hostile round: they went in the same call, before the head.)
TEST_P(GroupBatch, AHeadAnInterceptorRefusesInABatchStillGoesFirst) {
  struct RefuseHeadOnce final : EventInterceptor {
    std::atomic<int> refused{0};
    void before_dispatch(const EventEnvelope& e) override {
      if (number_of(e) == 0 && refused.fetch_add(1) == 0) {
        throw std::runtime_error("interceptor refused the head once");
      }
    }
  };
  auto refuse = std::make_shared<RefuseHeadOnce>();
  interceptors_ = {refuse};
  auto& a = node("node-a", GroupFailurePolicy::Block, 3, true);
  insert_rows(a, {"refused-head"}, 4);
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(4) == 1; }))
      << ::testing::PrintToString(ledger_.seen("refused-head"));
  EXPECT_GE(refuse->refused.load(), 1);
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
  EXPECT_EQ(ledger_.repeats(), 0);
}

// A registry throwing what is not a std::exception at delivery: the event goes one by one, the
// worker lives on. (Hostile round: std::terminate.)
TEST_P(GroupBatch, ARegistryThrowingANonStandardExceptionAtDeliveryStopsNothing) {
  head_lookup_fails_at_delivery([] { throw 42; });
}

// A registry whose batch answer changes at every lookup: the batch listener, another one that
// refuses what it is handed in its first two calls, none, a throw. Every group keeps its order.
TEST_P(GroupBatch, ARegistryChangingItsAnswerAtEveryLookupKeepsEveryGroupsOrder) {
  class Flapping final : public ListenerRegistry {
   public:
    explicit Flapping(std::shared_ptr<ListenerRegistry> inner) : inner_(std::move(inner)) {
      other_ = std::make_shared<const BatchEventListener>(
          [this](std::span<const EventEnvelope* const> events) {
            if (other_calls_++ < 2) {
              return std::vector<DeliveryResult>(events.size(),
                                                 DeliveryResult::failed("other refuses"));
            }
            return (*inner_->batch_listener_for("", "E"))(events);
          });
    }
    std::shared_ptr<const EventListener> listener_for(std::string_view a,
                                                      std::string_view t) const override {
      return inner_->listener_for(a, t);
    }
    std::shared_ptr<const BatchEventListener> batch_listener_for(
        std::string_view a, std::string_view t) const override {
      switch (n_++ % 4) {
        case 0:
          return inner_->batch_listener_for(a, t);
        case 1:
          return other_;
        case 2:
          return nullptr;
        default:
          throw std::runtime_error("flap");
      }
    }

   private:
    std::shared_ptr<ListenerRegistry> inner_;
    std::shared_ptr<const BatchEventListener> other_;
    mutable std::atomic<int> n_{0};
    std::atomic<int> other_calls_{0};
  };
  wrap_registry_ = [](std::shared_ptr<ListenerRegistry> inner) {
    return std::make_shared<Flapping>(std::move(inner));
  };
  per_group_ = 20;
  std::atomic<int> refusals{0};
  fail_ = [&](const EventEnvelope& e) { return number_of(e) % 7 == 3 && refusals++ < 6; };
  auto& a = node("node-a", GroupFailurePolicy::Block, 10, true);
  std::vector<std::string> keys;
  for (int g = 0; g < 6; ++g) {
    keys.push_back("k" + std::to_string(g));
  }
  insert_rows(a, keys, 12);
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(12) == 6; }));
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
  EXPECT_EQ(ledger_.repeats(), 0);
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupBatch, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
