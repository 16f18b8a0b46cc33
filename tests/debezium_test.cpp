// Debezium in place of the relay: a writer_only Outbox with the Debezium layout writes rows the
// outbox event router reads — insert-only, the trace context in tracingspancontext, deleted again
// in the same transaction when asked — and PostgreSQL's logical decoding (test_decoding, what
// Debezium's pgoutput stream carries too) shows exactly that: committed inserts, never a rolled
// back one, never an UPDATE. `outbox debezium-config` prints the connector for the table, naming
// only columns the table has; on SQLite it refuses.

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "outbox/detect/detect.hpp"
#include "outbox/envelope.hpp"
#include "outbox/outbox.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/transaction.hpp"
#include "tests/support/relay_cli.hpp"

namespace outbox {
namespace {

using testing::run_cli;

constexpr std::string_view kTraceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

class Debezium : public testing::RelayDatabaseTest {
 protected:
  void SetUp() override {
    RelayDatabaseTest::SetUp();
    if (skipped_or_failed()) {
      return;
    }
    table_ = migrate_table("dbz");
    pool_ = open_pool(url_, 2);
  }
  void TearDown() override {
    if (!slot_.empty()) {
      const sql::Value name[] = {slot_};
      pool_->acquire()->query("SELECT pg_drop_replication_slot($1)", name);
    }
    pool_.reset();
    RelayDatabaseTest::TearDown();
  }

  std::shared_ptr<OutboxStore> debezium_store(bool delete_after_insert) {
    return engine_for(pool_->acquire()->dialect())
        .make_store(
            {.table = table_,
             .debezium = sql::StoreOptions::Debezium{.delete_after_insert = delete_after_insert}});
  }

  std::string write_config(const std::string& target) {
    const auto path = dir_.file("relay.toml");
    std::ofstream(path) << "[database]\nurl = \"" << url_ << "\"\ntable = \"" << table_
                        << "\"\n[publishers.kafka]\ntype = \"kafka\"\nbrokers = \"k1:9092\"\n"
                        << "[[routes]]\npublisher = \"kafka\"\ntarget = \"" << target << "\"\n";
    return path;
  }

  std::string table_, slot_;
  std::shared_ptr<sql::ConnectionPool> pool_;
};

TEST_P(Debezium, LogicalDecodingSeesInsertOnlyRowsWithTheirTraceAndNothingRolledBack) {
  if (GetParam() != "postgres") {
    GTEST_SKIP() << "logical decoding is PostgreSQL's";
  }
  slot_ = "dbz_" + table_;
  {
    const sql::Value name[] = {slot_};
    pool_->acquire()->query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')", name);
  }
  auto context = std::make_shared<ThreadLocalTxContext>();
  TransactionManager transactions(pool_, context);
  auto kept = Outbox::writer_only({.tx_context = context, .store = debezium_store(false)});
  auto emptied = Outbox::writer_only({.tx_context = context, .store = debezium_store(true)});
  {
    auto tx = transactions.begin();
    kept.writer().write(EventEnvelope::builder(EventType::of("OrderPlaced"))
                            .event_id("dbz-kept")
                            .aggregate_type(AggregateType::of("Order"))
                            .aggregate_id("o-1")
                            .header("traceparent", std::string(kTraceparent))
                            .header("tracestate", "vendor=a1")
                            .payload_json("{\"order\": \"o-1\"}")
                            .build());
    emptied.writer().write(EventEnvelope::builder(EventType::of("OrderPaid"))
                               .event_id("dbz-emptied")
                               .aggregate_type(AggregateType::of("Order"))
                               .aggregate_id("o-1")
                               .payload_json("{\"paid\": 12}")
                               .build());
    // One payload column: a binary payload is refused and the transaction goes on — also at
    // the end of a batch of several statements, none of which may be left behind.
    EXPECT_THROW(emptied.writer().write(EventEnvelope::builder(EventType::of("Blob"))
                                            .event_id("dbz-binary")
                                            .payload_bytes({0x00, 0xff})
                                            .build()),
                 std::invalid_argument);
    std::vector<EventEnvelope> mixed;
    for (int i = 0; i < 600; ++i) {
      auto b =
          EventEnvelope::builder(EventType::of("Bulk")).event_id("dbz-bulk-" + std::to_string(i));
      mixed.push_back(i == 550 ? b.payload_bytes({0x01}).build() : b.payload_json("{}").build());
    }
    EXPECT_THROW(kept.writer().write_all(std::move(mixed)), std::invalid_argument);
    // A tracestate java.util.Properties would misread unescaped (a backslash starts an escape).
    kept.writer().write(EventEnvelope::builder(EventType::of("Traced"))
                            .event_id("dbz-escaped")
                            .header("traceparent", std::string(kTraceparent))
                            .header("tracestate", "k=a\\uZZZZ")
                            .payload_json("{}")
                            .build());
    tx.commit();
  }
  {
    auto tx = transactions.begin();
    kept.writer().write(EventType::of("OrderCancelled"), "{\"rolled\": \"back\"}");
    tx.rollback();
  }
  std::vector<std::string> changes;
  {
    const sql::Value name[] = {slot_};
    for (const auto& row : pool_->acquire()->query(
             "SELECT data FROM pg_logical_slot_get_changes($1, NULL, NULL)", name)) {
      changes.push_back(row.get_text(0));
    }
  }
  std::string all;
  for (const auto& c : changes) {
    all += c + "\n";
  }
  auto count = [&](const std::string& what) {
    return std::count_if(changes.begin(), changes.end(),
                         [&](const auto& c) { return c.find(what) != std::string::npos; });
  };
  const std::string prefix = "table public." + table_ + ": ";
  EXPECT_EQ(count(prefix + "INSERT:"), 3) << all;
  EXPECT_EQ(count("dbz-bulk-"), 0) << all;
  EXPECT_EQ(count(prefix + "UPDATE:"), 0) << all;
  EXPECT_EQ(count(prefix + "DELETE:"), 1) << all;  // the emptied table's row
  // The rolled-back transaction is not there: one transaction touched the table. Other tests'
  // transactions in the same database (ctest runs two at a time) appear as their own BEGINs.
  int ours = 0;
  bool touched = false;
  for (const auto& c : changes) {
    if (c.rfind("BEGIN", 0) == 0) {
      touched = false;
    } else if (c.rfind(prefix, 0) == 0 && !touched) {
      touched = true;
      ++ours;
    }
  }
  EXPECT_EQ(ours, 1) << all;
  EXPECT_EQ(count("rolled"), 0) << all;
  EXPECT_EQ(count("dbz-binary"), 0) << all;
  // What the router reads: id, key, routing field, payload and the trace in Properties text.
  const auto kept_insert = std::find_if(changes.begin(), changes.end(), [](const auto& c) {
    return c.find("INSERT:") != std::string::npos && c.find("'dbz-kept'") != std::string::npos;
  });
  ASSERT_NE(kept_insert, changes.end()) << all;
  for (const std::string& column : std::vector<std::string>{
           "event_id[text]:'dbz-kept'", "aggregate_id[text]:'o-1'", "aggregate_type[text]:'Order'",
           "payload[jsonb]:'{\"order\": \"o-1\"}'",
           "tracingspancontext[text]:'traceparent=" + std::string(kTraceparent) +
               "\ntracestate=vendor=a1\n'"}) {
    EXPECT_NE(kept_insert->find(column), std::string::npos) << column << "\n" << *kept_insert;
  }
  EXPECT_NE(all.find("event_id[text]:'dbz-emptied'"), std::string::npos) << all;
  // Escaped as Properties text (two backslashes): the reader gets "k=a\\uZZZZ" back.
  EXPECT_NE(all.find("tracestate=k=a\\\\uZZZZ\n'"), std::string::npos) << all;
  EXPECT_NE(all.find("tracingspancontext[text]:null"), std::string::npos) << all;
  // In the table: the kept row only, still NEW (nothing here updates it).
  auto store = detect_store(*pool_->acquire(), table_);
  const auto counts = store->count_by_status(*pool_->acquire());
  EXPECT_EQ(counts[0], 2);
  EXPECT_FALSE(store->find(*pool_->acquire(), "dbz-emptied").has_value());
}

TEST_P(Debezium, TheConnectorNamesColumnsTheTableHasOrIsRefused) {
  const auto config = write_config("outbox.{aggregate_type}");
  const auto out = run_cli(dir_, "debezium-config --config '" + config + "'");
  if (GetParam() == "sqlite") {
    EXPECT_EQ(out.exit_code, 2) << out.out << out.err;
    EXPECT_NE(out.err.find("Debezium has no SQLite connector"), std::string::npos) << out.err;
    return;
  }
  ASSERT_EQ(out.exit_code, 0) << out.err;
  EXPECT_NE(out.err.find("note: "), std::string::npos);
  EXPECT_NE(out.out.find("\"transforms.outbox.route.topic.replacement\": "
                         "\"outbox.${routedByValue}\""),
            std::string::npos)
      << out.out;
  EXPECT_NE(out.out.find("." + table_ + "\""), std::string::npos) << out.out;
  // Every column the connector names exists in the migrated table.
  auto conn = pool_->acquire();
  const std::string columns_sql =
      GetParam() == "postgres"
          ? "SELECT column_name FROM information_schema.columns WHERE table_schema = "
            "current_schema() AND table_name = '" +
                table_ + "'"
          : "SELECT column_name FROM information_schema.columns WHERE table_schema = DATABASE() "
            "AND table_name = '" +
                table_ + "'";
  std::set<std::string> columns;
  for (const auto& row : conn->query(columns_sql)) {
    columns.insert(row.get_text(0));
  }
  static const std::regex kField(
      "\"transforms\\.outbox\\.(?:table\\.field\\.event\\.[a-z]+|route\\.by\\.field|tracing\\."
      "span\\.context\\.field)\": \"([a-z_]+)\"");
  int named = 0;
  for (auto it = std::sregex_iterator(out.out.begin(), out.out.end(), kField);
       it != std::sregex_iterator(); ++it, ++named) {
    EXPECT_TRUE(columns.count((*it)[1])) << (*it)[1];
  }
  EXPECT_EQ(named, 5);
  static const std::regex kPlacement(
      "\"transforms\\.outbox\\.table\\.fields\\.additional\\."
      "placement\": \"([^\"]+)\"");
  std::smatch m;
  ASSERT_TRUE(std::regex_search(out.out, m, kPlacement)) << out.out;
  std::stringstream placement(m[1]);
  for (std::string item; std::getline(placement, item, ',');) {
    EXPECT_TRUE(columns.count(item.substr(0, item.find(':')))) << item;
  }
  // With the URL alone: the router's default topics.
  const auto bare = run_cli(dir_, "debezium-config --db '" + url_ + "' --table " + table_);
  ASSERT_EQ(bare.exit_code, 0) << bare.err;
  EXPECT_NE(bare.out.find("\"outbox.event.${routedByValue}\""), std::string::npos) << bare.out;
  EXPECT_NE(bare.err.find("no --config"), std::string::npos) << bare.err;
  // A route the router cannot express: refused with the reason.
  const auto http = dir_.file("http.toml");
  std::ofstream(http) << "[database]\nurl = \"" << url_ << "\"\ntable = \"" << table_
                      << "\"\n[publishers.hook]\ntype = \"http\"\n[[routes]]\npublisher = "
                         "\"hook\"\ntarget = \"http://127.0.0.1:1/x\"\n";
  const auto refused = run_cli(dir_, "debezium-config --config '" + http + "'");
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_NE(refused.err.find("not a Kafka publisher"), std::string::npos) << refused.err;
}

INSTANTIATE_TEST_SUITE_P(Engines, Debezium, ::testing::Values("sqlite", "postgres", "mysql"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace outbox
