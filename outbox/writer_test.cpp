// OutboxWriter on the in-memory outbox: a transaction is required, hooks see what commits and
// what rolls back, write_all is one transaction.

#include "outbox/writer.hpp"

#include <gtest/gtest.h>

#include "outbox/outbox.hpp"
#include "tests/support/memory_fixture.hpp"
#include "tests/support/outbox_fixture.hpp"

namespace outbox {
namespace {

using testing::wait_until;

class WriterTest : public testing::OutboxFixture<testing::MemoryFixture> {};

TEST_F(WriterTest, RequiresATransactionAndHonoursHooks) {
  listeners->register_listener(EventType::of("E"), [](const auto&) {});
  auto ob = Outbox::single_node(options());
  ob.start();
  EXPECT_THROW(ob.writer().write(EventType::of("E"), "{}"), std::logic_error);
  EXPECT_THROW(OutboxWriter(nullptr, store), std::invalid_argument);

  struct Suppress : WriterHook {
    std::vector<EventEnvelope> before_write(std::vector<EventEnvelope> events) override {
      std::erase_if(events, [](const auto& e) { return e.event_type() == "Secret"; });
      return events;
    }
    void after_commit(const std::vector<EventEnvelope>& events) override {
      ++commits;
      seen += static_cast<int>(events.size());
      throw std::runtime_error("hook failure must not propagate");
    }
    void after_rollback(const std::vector<EventEnvelope>&) override { ++rollbacks; }
    std::atomic<int> commits{0}, rollbacks{0}, seen{0};
  };
  auto hook = std::make_shared<Suppress>();
  OutboxWriter w(tx_context, store, hook);
  {
    auto t = tx->begin();
    EXPECT_FALSE(w.write(EventType::of("Secret"), "{}"));
    auto ids = w.write_all({EventEnvelope::of_json(EventType::of("E"), "{}"),
                            EventEnvelope::of_json(EventType::of("Secret"), "{}"),
                            EventEnvelope::of_json(EventType::of("E"), "{}")});
    EXPECT_EQ(ids.size(), 2u);
    t.commit();
  }
  EXPECT_EQ(hook->commits.load(), 1);  // one callback per write_all batch; suppressed write: none
  EXPECT_EQ(hook->seen.load(), 2);
  {
    auto t = tx->begin();
    w.write(EventType::of("E"), "{}");
  }
  EXPECT_EQ(hook->rollbacks.load(), 1);
  EXPECT_EQ(count(EventStatus::New), 2);
}

// The caller's trace context travels in the row's headers; an invalid one is removed and counted,
// and the business transaction commits all the same.
TEST_F(WriterTest, StampsTheCallersTraceContextAndDropsInvalidOnes) {
  listeners->register_listener(EventType::of("E"), [](const auto&) {});
  auto metrics = std::make_shared<InMemoryMetrics>();
  auto o = options();
  o.metrics = metrics;
  o.trace_context = thread_trace_context();
  auto ob = Outbox::single_node(o);
  const std::string parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  std::string traced, untraced, bad;
  {
    auto t = tx->begin();
    {
      ScopedTraceContext scope({parent, "rojo=00f067aa0ba902b7"});
      traced = *ob.writer().write(EventType::of("E"), "{}");
    }
    untraced = *ob.writer().write(EventType::of("E"), "{}");
    bad = *ob.writer().write(EventEnvelope::builder(EventType::of("E"))
                                 .header("traceparent", "00-not-a-trace")
                                 .header("tracestate", "rojo=1")
                                 .header("k", "v")
                                 .payload_json("{}")
                                 .build());
    t.commit();
  }
  auto conn = pool->acquire();
  const auto row = [&](const std::string& id) { return *store->find(*conn, id); };
  EXPECT_NE(row(traced).headers_json->find(parent), std::string::npos);
  EXPECT_NE(row(traced).headers_json->find("rojo=00f067aa0ba902b7"), std::string::npos);
  EXPECT_FALSE(row(untraced).headers_json &&
               row(untraced).headers_json->find("traceparent") != std::string::npos);
  EXPECT_EQ(*row(bad).headers_json, "{\"k\":\"v\"}");
  EXPECT_EQ(metrics->snapshot().trace_context_dropped, 1);
}

TEST_F(WriterTest, WriteAllUsesOneTransactionAndOneHotEnqueuePerEvent) {
  std::atomic<int> calls{0};
  listeners->register_listener(EventType::of("E"), [&](const auto&) { ++calls; });
  auto ob = Outbox::single_node(options());
  ob.start();
  std::vector<EventEnvelope> batch;
  for (int i = 0; i < 25; ++i) {
    batch.push_back(EventEnvelope::of_json(EventType::of("E"), "{}"));
  }
  {
    auto t = tx->begin();
    EXPECT_EQ(ob.writer().write_all(batch).size(), 25u);
    t.commit();
  }
  ASSERT_TRUE(wait_until([&] { return count(EventStatus::Done) == 25; }));
  ob.close();
  EXPECT_EQ(calls.load(), 25);
}

}  // namespace
}  // namespace outbox
