// The Debezium connector derived from a relay's routes: only options the outbox event router
// documents, the topic rule the route implies, and a clear refusal for routes it cannot express.

#include "outbox/relay/debezium_config.hpp"

#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <set>
#include <sstream>

namespace outbox::relay {
namespace {

// The EventRouter's options as Debezium documents them (transformations/outbox-event-router).
const std::set<std::string> kDocumentedRouterOptions = {
    "type",
    "table.op.invalid.behavior",
    "table.field.event.id",
    "table.field.event.key",
    "table.field.event.timestamp",
    "table.field.event.payload",
    "table.expand.json.payload",
    "table.json.payload.null.behavior",
    "table.fields.additional.placement",
    "table.fields.additional.error.on.missing",
    "table.field.event.schema.version",
    "route.by.field",
    "route.topic.regex",
    "route.topic.replacement",
    "route.tombstone.on.empty.payload",
    "tracing.span.context.field",
    "tracing.operation.name",
    "tracing.with.context.field.only",
};

// Our table's columns after `outbox migrate` (schema version 7) that the router may name.
const std::set<std::string> kColumns = {"event_id",      "event_type", "aggregate_type",
                                        "aggregate_id",  "tenant_id",  "payload",
                                        "message_group", "headers",    "tracingspancontext"};

RelayConfig config_with(const std::string& routes, const std::string& publishers = "") {
  return parse_config(
      "[database]\nurl = \"postgresql://app@db/app\"\n[publishers.kafka]\ntype = \"kafka\"\n"
      "brokers = \"k1:9092\"\n[publishers.hook]\ntype = \"http\"\n" +
      publishers + routes);
}

const DebeziumSource kPostgres{.engine = "postgres",
                               .host = "db",
                               .port = 5432,
                               .user = "app",
                               .database = "app",
                               .schema = "public",
                               .table = "outbox_event"};

std::map<std::string, std::string> options(const std::string& json) {
  std::map<std::string, std::string> out;
  static const std::regex kLine("\"([^\"]+)\": \"((?:[^\"\\\\]|\\\\.)*)\"");
  for (auto it = std::sregex_iterator(json.begin(), json.end(), kLine);
       it != std::sregex_iterator(); ++it) {
    out[(*it)[1]] = (*it)[2];
  }
  return out;
}

TEST(DebeziumConnector, UsesOnlyDocumentedRouterOptionsOverOurColumns) {
  const auto c = debezium_connector(
      config_with("[[routes]]\npublisher = \"kafka\"\ntarget = \"orders.{aggregate_type}\"\n"),
      kPostgres);
  const auto o = options(c.json);
  EXPECT_EQ(o.at("name"), "outbox-outbox_event");
  EXPECT_EQ(o.at("connector.class"), "io.debezium.connector.postgresql.PostgresConnector");
  EXPECT_EQ(o.at("table.include.list"), "public.outbox_event");
  EXPECT_EQ(o.at("transforms"), "outbox");
  int router_options = 0;
  for (const auto& [key, value] : o) {
    if (key.rfind("transforms.outbox.", 0) != 0) {
      continue;
    }
    ++router_options;
    EXPECT_TRUE(kDocumentedRouterOptions.count(key.substr(18))) << key << " is not documented";
  }
  EXPECT_GE(router_options, 10);
  EXPECT_EQ(o.at("transforms.outbox.type"), "io.debezium.transforms.outbox.EventRouter");
  for (const auto* field :
       {"table.field.event.id", "table.field.event.key", "table.field.event.payload",
        "route.by.field", "tracing.span.context.field"}) {
    EXPECT_TRUE(kColumns.count(o.at(std::string("transforms.outbox.") + field))) << field;
  }
  // column:header:name, each column one of ours.
  const auto placement = o.at("transforms.outbox.table.fields.additional.placement");
  std::stringstream in(placement);
  for (std::string item; std::getline(in, item, ',');) {
    EXPECT_TRUE(kColumns.count(item.substr(0, item.find(':')))) << item;
    EXPECT_NE(item.find(":header:outbox-"), std::string::npos) << item;
  }
  EXPECT_EQ(o.at("transforms.outbox.table.expand.json.payload"), "true");
  EXPECT_EQ(o.at("transforms.outbox.route.by.field"), "aggregate_type");
  EXPECT_EQ(o.at("transforms.outbox.route.topic.regex"), "(?<routedByValue>.*)");
  EXPECT_EQ(o.at("transforms.outbox.route.topic.replacement"), "orders.${routedByValue}");
  EXPECT_EQ(o.at("tombstones.on.delete"), "false");  // the rows deleted after insert
  EXPECT_FALSE(c.notes.empty());
}

TEST(DebeziumConnector, TheTopicFollowsTheRoutesOnePlaceholderOrIsConstant) {
  auto topic = [](const std::string& target) {
    const auto o =
        options(debezium_connector(
                    config_with("[[routes]]\npublisher = \"kafka\"\ntarget = \"" + target + "\"\n"),
                    kPostgres)
                    .json);
    return o.at("transforms.outbox.route.by.field") + " -> " +
           o.at("transforms.outbox.route.topic.replacement");
  };
  EXPECT_EQ(topic("{event_type}"), "event_type -> ${routedByValue}");
  EXPECT_EQ(topic("t-{aggregate_type}-events"), "aggregate_type -> t-${routedByValue}-events");
  EXPECT_EQ(topic("orders"), "aggregate_type -> orders");  // every value to one topic
}

TEST(DebeziumConnector, WithoutARelayConfigurationEveryEventGoesWhereTheRouterWouldSendIt) {
  const auto o =
      options(debezium_connector(debezium_default_config("postgresql://app@db/app", "outbox_event"),
                                 kPostgres)
                  .json);
  EXPECT_EQ(o.at("transforms.outbox.route.by.field"), "aggregate_type");
  EXPECT_EQ(o.at("transforms.outbox.route.topic.replacement"), "outbox.event.${routedByValue}");
}

TEST(DebeziumConnector, MariaDbNamesItsDatabaseAndSchemaHistoryOnTheRoutesBrokers) {
  const DebeziumSource maria{.engine = "mysql",
                             .host = "db",
                             .port = 3306,
                             .user = "app",
                             .database = "shop",
                             .table = "outbox_event"};
  const auto o =
      options(debezium_connector(
                  config_with("[[routes]]\npublisher = \"kafka\"\ntarget = \"all\"\n"), maria)
                  .json);
  EXPECT_EQ(o.at("connector.class"), "io.debezium.connector.mysql.MySqlConnector");
  EXPECT_EQ(o.at("table.include.list"), "shop.outbox_event");
  EXPECT_EQ(o.at("schema.history.internal.kafka.bootstrap.servers"), "k1:9092");
  // Two tables' connectors share nothing that must be unique.
  auto other = maria;
  other.table = "jobs";
  const auto p =
      options(debezium_connector(config_with("[[routes]]\npublisher = \"kafka\"\ntarget = \"all\"\n"
                                             "table = \"jobs\"\n"),
                                 other)
                  .json);
  for (const auto* key :
       {"database.server.id", "topic.prefix", "schema.history.internal.kafka.topic"}) {
    EXPECT_NE(o.at(key), p.at(key)) << key;
  }
  const auto q =
      options(debezium_connector(
                  config_with("[[routes]]\npublisher = \"kafka\"\ntarget = \"all\"\n"), kPostgres)
                  .json);
  EXPECT_EQ(q.at("slot.name"), "outbox_outbox_event");
  EXPECT_EQ(q.at("publication.name"), "outbox_outbox_event");
  // PostgreSQL cuts names at 63 bytes: two long names sharing their start stay apart, whole.
  auto long_name = [&](const std::string& table) {
    auto source = kPostgres;
    source.table = table;
    return options(debezium_connector(
                       config_with("[[routes]]\npublisher = \"kafka\"\ntarget = \"all\"\n"
                                   "table = \"" +
                                   table + "\"\n"),
                       source)
                       .json)
        .at("slot.name");
  };
  const auto a = long_name(std::string(56, 'a') + "_one");
  const auto b = long_name(std::string(56, 'a') + "_two");
  EXPECT_LE(a.size(), 63u);
  EXPECT_LE(b.size(), 63u);
  EXPECT_NE(a, b);
}

TEST(DebeziumConnector, RoutesTheRouterCannotExpressAreRefusedByName) {
  auto refusal = [](const std::string& routes) {
    try {
      debezium_connector(config_with(routes), kPostgres);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(refusal("[[routes]]\npublisher = \"hook\"\ntarget = \"http://x/{event_type}\"\n")
                .find("'hook' is not a Kafka publisher"),
            std::string::npos);
  EXPECT_NE(refusal("[[routes]]\npublisher = \"kafka\"\nevent_type = \"Order*\"\ntarget = \"o\"\n")
                .find("event_type = 'Order*'"),
            std::string::npos);
  EXPECT_NE(
      refusal("[[routes]]\npublisher = \"kafka\"\ntarget = \"{aggregate_type}.{event_type}\"\n")
          .find("several placeholders"),
      std::string::npos);
  // The router fails on a NULL routing value: tenant and aggregate ids may be NULL.
  EXPECT_NE(refusal("[[routes]]\npublisher = \"kafka\"\ntarget = \"t-{tenant_id}\"\n")
                .find("routes by tenant_id, which may be NULL"),
            std::string::npos);
  EXPECT_NE(refusal("[[routes]]\npublisher = \"kafka\"\ntarget = \"{aggregate_id}\"\n")
                .find("routes by aggregate_id, which may be NULL"),
            std::string::npos);
  EXPECT_NE(refusal("[[routes]]\npublisher = \"kafka\"\nevent_type = \"A\"\ntarget = \"a\"\n"
                    "[[routes]]\npublisher = \"kafka\"\ntarget = \"b\"\n")
                .find("2 [[routes]] on table outbox_event"),
            std::string::npos);
  // Both problems of one route are listed, with its line.
  const auto both =
      refusal("[[routes]]\npublisher = \"hook\"\naggregate_type = \"Order\"\ntarget = \"x\"\n");
  EXPECT_NE(both.find("route at line"), std::string::npos) << both;
  EXPECT_NE(both.find("not a Kafka publisher"), std::string::npos) << both;
  EXPECT_NE(both.find("aggregate_type = 'Order'"), std::string::npos) << both;
}

}  // namespace
}  // namespace outbox::relay
