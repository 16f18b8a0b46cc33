#include "outbox/relay/debezium_config.hpp"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <regex>

#include "outbox/internal/redact.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::relay {
namespace {

constexpr std::string_view kPlaceholders[] = {"event_type", "aggregate_type", "aggregate_id",
                                              "tenant_id"};
// The router builds the topic from the routing column's value and fails on a NULL one: only
// columns that are never NULL can route.
constexpr std::string_view kNullable[] = {"aggregate_id", "tenant_id"};

// Our columns as the headers the Kafka publisher sends (outbox/kafka/publisher.hpp); the
// envelope's own headers travel as one JSON header (the router maps columns, not maps).
constexpr std::string_view kPlacement =
    "event_id:header:outbox-event-id,event_type:header:outbox-event-type,"
    "aggregate_type:header:outbox-aggregate-type,aggregate_id:header:outbox-aggregate-id,"
    "tenant_id:header:outbox-tenant-id,message_group:header:outbox-message-group,"
    "headers:header:outbox-headers";

// A literal part of a topic in java.util.regex.Matcher's replacement syntax.
std::string java_replacement_literal(std::string_view text) {
  std::string out;
  for (char c : text) {
    if (c == '\\' || c == '$') {
      out += '\\';
    }
    out += c;
  }
  return out;
}

// A MariaDB replica id of its own per database and table (FNV-1a), in 1 … 2^31 - 1: two
// connectors with one id would take each other's binlog stream.
std::uint32_t server_id(const DebeziumSource& s) {
  std::uint32_t h = 2166136261u;
  for (char c : s.database + "." + s.table) {
    h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  }
  return 1 + h % 2147483646u;
}

// "outbox_<table>" within PostgreSQL's 63-byte names (a longer slot name would be cut by the
// server and no longer match the connector's): long names keep their start and gain a hash.
std::string object_name(const std::string& lower_table) {
  std::string name = "outbox_" + lower_table;
  if (name.size() <= 63) {
    return name;
  }
  std::uint32_t h = 2166136261u;
  for (char c : lower_table) {
    h = (h ^ static_cast<unsigned char>(c)) * 16777619u;
  }
  char suffix[10];
  std::snprintf(suffix, sizeof suffix, "_%08x", h);
  return name.substr(0, 63 - 9) + suffix;
}

std::string where(const RouteConfig& r) {
  return r.line > 0 ? "route at line " + std::to_string(r.line) : "route to " + r.target;
}

void add(std::string& json, std::string_view key, std::string_view value, bool last = false) {
  json += "    ";
  append_json_string(json, std::string(key));
  json += ": ";
  append_json_string(json, std::string(value));
  json += last ? "\n" : ",\n";
}

}  // namespace

DebeziumSource debezium_source(sql::Connection& conn, const std::string& url,
                               const std::string& table) {
  DebeziumSource s;
  s.engine = std::string(conn.dialect());
  s.table = table;
  if (s.engine == "sqlite") {
    throw ConfigError("Debezium has no SQLite connector: use `outbox relay` for SQLite tables");
  }
  bool tracing_column = false;
  if (s.engine == "postgres") {
    const auto row = conn.query(
        "SELECT current_database(), current_user, current_schema(), "
        "COALESCE(host(inet_server_addr()), 'localhost'), current_setting('port')")[0];
    s.database = row.get_text(0);
    s.user = row.get_text(1);
    s.schema = row.get_text(2);
    s.host = row.get_text(3);
    s.port = std::stoi(row.get_text(4));
    const sql::Value params[] = {table};
    tracing_column = !conn.query(
                              "SELECT 1 FROM information_schema.columns WHERE table_schema = "
                              "current_schema() AND table_name = lower($1) AND column_name = "
                              "'tracingspancontext'",
                              params)
                          .empty();
  } else {
    // As the MariaDB driver reads it: the password runs to the last '@', the user defaults to root.
    static const std::regex kUrl(
        "(?:mysql|mariadb)://(?:([^:@/]*)(?::.*)?@)?([^:/@]+)(?::([0-9]+))?/([^?]+).*");
    std::smatch m;
    if (!std::regex_match(url, m, kUrl)) {
      throw ConfigError("cannot read host, user and database from '" +
                        outbox::internal::redact_url(url) + "'");
    }
    s.user = m[1].matched && m[1].length() > 0 ? std::string(m[1]) : "root";
    s.host = m[2];
    s.port = m[3].matched ? std::stoi(m[3]) : 3306;
    s.database = m[4];
    const sql::Value params[] = {table};
    tracing_column = !conn.query(
                              "SELECT 1 FROM information_schema.columns WHERE table_schema = "
                              "DATABASE() AND table_name = ? AND column_name = "
                              "'tracingspancontext'",
                              params)
                          .empty();
  }
  if (!tracing_column) {
    throw ConfigError("table " + table +
                      " has no tracingspancontext column (or does not exist): run `outbox migrate "
                      "--table " +
                      table + "` (schema version 7)");
  }
  return s;
}

RelayConfig debezium_default_config(const std::string& url, const std::string& table) {
  RelayConfig config;
  config.database.url = url;
  config.database.table = table;
  config.publishers.push_back(
      {.name = "kafka", .type = PublisherConfig::Type::Kafka, .brokers = "CHANGE_ME:9092"});
  config.routes.push_back(
      {.publisher = "kafka", .target = "outbox.event.{aggregate_type}", .table = table});
  return config;
}

DebeziumConnector debezium_connector(const RelayConfig& config, const DebeziumSource& source) {
  std::vector<const RouteConfig*> routes;
  for (const auto& r : config.routes) {
    const auto& table = r.table.empty() ? config.database.table : r.table;
    if (table == source.table) {
      routes.push_back(&r);
    }
  }
  if (routes.size() != 1) {
    throw ConfigError(
        routes.empty()
            ? "no [[routes]] on table " + source.table + ": nothing to derive the topics from"
            : std::to_string(routes.size()) + " [[routes]] on table " + source.table +
                  ": the outbox event router routes every row by one rule; keep one route, or "
                  "write the connector by hand (a Filter SMT per route)");
  }
  const RouteConfig& route = *routes.front();
  std::vector<std::string> refused;
  const PublisherConfig* publisher = nullptr;
  for (const auto& p : config.publishers) {
    if (p.name == route.publisher) {
      publisher = &p;
    }
  }
  if (publisher == nullptr || publisher->type != PublisherConfig::Type::Kafka) {
    refused.push_back(where(route) + ": publisher '" + route.publisher +
                      "' is not a Kafka publisher (Debezium writes to Kafka only)");
  }
  if (route.event_type != "*" || route.aggregate_type != "*") {
    refused.push_back(where(route) + ": it takes only some events (event_type = '" +
                      route.event_type + "', aggregate_type = '" + route.aggregate_type +
                      "'); the router sends every row of the table");
  }
  // The topic: at most one placeholder, whose column the router routes by.
  std::string by_field = "aggregate_type";
  std::string replacement;
  int placeholders = 0;
  for (std::size_t i = 0; i < route.target.size();) {
    bool matched = false;
    if (route.target[i] == '{') {
      for (const auto name : kPlaceholders) {
        if (route.target.compare(i + 1, name.size() + 1, std::string(name) + "}") == 0) {
          ++placeholders;
          by_field = std::string(name);
          replacement += "${routedByValue}";
          i += name.size() + 2;
          matched = true;
          break;
        }
      }
    }
    if (!matched) {
      replacement += java_replacement_literal(std::string_view(route.target).substr(i, 1));
      ++i;
    }
  }
  if (placeholders > 1) {
    refused.push_back(where(route) + ": target '" + route.target +
                      "' uses several placeholders; the router builds a topic from one column");
  } else if (std::find(std::begin(kNullable), std::end(kNullable), by_field) !=
             std::end(kNullable)) {
    refused.push_back(where(route) + ": target '" + route.target + "' routes by " + by_field +
                      ", which may be NULL; the router fails on an event without it (route by "
                      "{event_type} or {aggregate_type})");
  }
  if (!refused.empty()) {
    std::string message = "the outbox event router cannot express this relay's routes:";
    for (const auto& r : refused) {
      message += "\n  " + r;
    }
    throw ConfigError(message);
  }

  std::string lower = source.table;
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  DebeziumConnector out;
  std::string& j = out.json;
  j = "{\n  \"name\": ";
  append_json_string(j, "outbox-" + source.table);
  j += ",\n  \"config\": {\n";
  if (source.engine == "postgres") {
    add(j, "connector.class", "io.debezium.connector.postgresql.PostgresConnector");
    add(j, "plugin.name", "pgoutput");
    add(j, "database.hostname", source.host);
    add(j, "database.port", std::to_string(source.port));
    add(j, "database.user", source.user);
    add(j, "database.password", "CHANGE_ME");
    add(j, "database.dbname", source.database);
    add(j, "topic.prefix", object_name(lower));
    add(j, "table.include.list", source.schema + "." + source.table);
    // One slot and publication per connector: two tables' connectors must not share them.
    add(j, "slot.name", object_name(lower));
    add(j, "publication.name", object_name(lower));
    add(j, "publication.autocreate.mode", "filtered");
    out.notes.push_back(
        "PostgreSQL must run with wal_level = logical, and the user needs the REPLICATION "
        "attribute; watch the replication slot's retained WAL (docs/debezium.md)");
  } else {
    add(j, "connector.class", "io.debezium.connector.mysql.MySqlConnector");
    add(j, "database.hostname", source.host);
    add(j, "database.port", std::to_string(source.port));
    add(j, "database.user", source.user);
    add(j, "database.password", "CHANGE_ME");
    add(j, "database.server.id", std::to_string(server_id(source)));
    add(j, "topic.prefix", object_name(lower));
    add(j, "database.include.list", source.database);
    add(j, "table.include.list", source.database + "." + source.table);
    add(j, "schema.history.internal.kafka.bootstrap.servers", publisher->brokers);
    add(j, "schema.history.internal.kafka.topic", "outbox-schema-history." + lower);
    out.notes.push_back(
        "MariaDB must write a row-based binary log (log_bin, binlog_format = ROW, "
        "binlog_row_image = FULL); database.server.id must be unique among its replicas");
  }
  add(j, "tombstones.on.delete", "false");
  add(j, "key.converter", "org.apache.kafka.connect.storage.StringConverter");
  add(j, "value.converter", "org.apache.kafka.connect.json.JsonConverter");
  add(j, "value.converter.schemas.enable", "false");
  add(j, "transforms", "outbox");
  add(j, "transforms.outbox.type", "io.debezium.transforms.outbox.EventRouter");
  add(j, "transforms.outbox.table.op.invalid.behavior", "warn");
  add(j, "transforms.outbox.table.field.event.id", "event_id");
  add(j, "transforms.outbox.table.field.event.key", "aggregate_id");
  add(j, "transforms.outbox.table.field.event.payload", "payload");
  add(j, "transforms.outbox.table.expand.json.payload", "true");
  add(j, "transforms.outbox.table.fields.additional.placement", kPlacement);
  add(j, "transforms.outbox.route.by.field", by_field);
  add(j, "transforms.outbox.route.topic.regex", "(?<routedByValue>.*)");
  add(j, "transforms.outbox.route.topic.replacement", replacement);
  add(j, "transforms.outbox.tracing.span.context.field", "tracingspancontext", true);
  j += "  }\n}\n";
  out.notes.push_back("set database.password (or a config provider reference) before creating it");
  out.notes.push_back(
      "the message key is aggregate_id (the relay keys by message_group when an event has one)");
  return out;
}

}  // namespace outbox::relay
