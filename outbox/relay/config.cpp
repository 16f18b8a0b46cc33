#include "outbox/relay/config.hpp"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>

#include "outbox/groups.hpp"
#include "outbox/lease.hpp"
#include "outbox/relay/router.hpp"
#include "outbox/store.hpp"
#include "outbox/stream.hpp"

namespace outbox::relay {
namespace {

using std::chrono::days;
using std::chrono::hours;
using std::chrono::milliseconds;
using std::chrono::minutes;
using std::chrono::seconds;

std::string place(const std::string& source, const toml::source_region& where) {
  return source + ":" + std::to_string(where.begin.line) + ":" +
         std::to_string(where.begin.column) + ": ";
}

// Reads one TOML table, remembering which keys were used so leftovers (typos) can be reported.
class TableReader {
 public:
  TableReader(const toml::table& table, std::string name, const std::string& source)
      : table_(table), name_(std::move(name)), source_(source) {}

  [[noreturn]] void fail(const toml::node& node, const std::string& message) const {
    throw ConfigError(place(source_, node.source()) + message);
  }
  [[noreturn]] void fail(const std::string& message) const { fail(table_, message); }

  const toml::node* get(const std::string& key) {
    used_.insert(key);
    return table_.get(key);
  }
  std::string key_name(const std::string& key) const {
    return name_.empty() ? key : name_ + "." + key;
  }

  std::optional<std::string> string(const std::string& key) {
    const toml::node* node = get(key);
    if (node == nullptr) {
      return std::nullopt;
    }
    if (!node->is_string()) {
      fail(*node, key_name(key) + " must be a string");
    }
    return expand(*node, **node->as_string());
  }
  void string(const std::string& key, std::string& out) {
    if (auto v = string(key)) {
      out = *v;
    }
  }
  template <typename Int>
  void integer(const std::string& key, Int& out, std::int64_t min, std::int64_t max) {
    const toml::node* node = get(key);
    if (node == nullptr) {
      return;
    }
    if (!node->is_integer()) {
      fail(*node, key_name(key) + " must be an integer");
    }
    const std::int64_t v = **node->as_integer();
    if (v < min || v > max) {
      fail(*node, key_name(key) + " must be between " + std::to_string(min) + " and " +
                      std::to_string(max));
    }
    out = static_cast<Int>(v);
  }
  void boolean(const std::string& key, bool& out) {
    const toml::node* node = get(key);
    if (node == nullptr) {
      return;
    }
    if (!node->is_boolean()) {
      fail(*node, key_name(key) + " must be true or false");
    }
    out = **node->as_boolean();
  }
  // Reads a duration bounded to [min, max]; the error names the bounds.
  void duration(const std::string& key, std::chrono::milliseconds& out,
                std::chrono::milliseconds min, std::chrono::milliseconds max) {
    const toml::node* node = get(key);
    if (node == nullptr) {
      return;
    }
    if (!node->is_string()) {
      fail(*node, key_name(key) + " must be a duration string such as \"500ms\", \"30s\", \"5m\"");
    }
    try {
      out = parse_duration(expand(*node, **node->as_string()));
    } catch (const std::invalid_argument& e) {
      fail(*node, key_name(key) + ": " + e.what());
    }
    if (out < min || out > max) {
      fail(*node, key_name(key) + " must be between " + format_duration(min) + " and " +
                      format_duration(max));
    }
  }
  // A string or an array of strings.
  void string_list(const std::string& key, std::vector<std::string>& out) {
    const toml::node* node = get(key);
    if (node == nullptr) {
      return;
    }
    if (node->is_string()) {
      out = {expand(*node, **node->as_string())};
      return;
    }
    if (!node->is_array()) {
      fail(*node, key_name(key) + " must be a string or an array of strings");
    }
    out.clear();
    for (const auto& item : *node->as_array()) {
      if (!item.is_string()) {
        fail(item, key_name(key) + " must hold strings only");
      }
      out.push_back(expand(item, **item.as_string()));
    }
  }
  void string_map(const std::string& key, std::map<std::string, std::string>& out) {
    const toml::node* node = get(key);
    if (node == nullptr) {
      return;
    }
    if (!node->is_table()) {
      fail(*node, key_name(key) + " must be a table of strings");
    }
    for (const auto& [k, v] : *node->as_table()) {
      if (v.is_string()) {
        out[std::string(k.str())] = expand(v, v.as_string()->get());
      } else if (v.is_integer()) {
        out[std::string(k.str())] = std::to_string(v.as_integer()->get());
      } else if (v.is_boolean()) {
        out[std::string(k.str())] = v.as_boolean()->get() ? "true" : "false";
      } else {
        fail(v, key_name(key) + "." + std::string(k.str()) + " must be a string");
      }
    }
  }
  // Every key of the table must have been read.
  void finish() const {
    for (const auto& [k, v] : table_) {
      if (!used_.contains(std::string(k.str()))) {
        fail(v, "unknown key '" + key_name(std::string(k.str())) + "'");
      }
    }
  }

 private:
  std::string expand(const toml::node& node, const std::string& text) const {
    std::string out;
    std::size_t pos = 0;
    for (;;) {
      const auto start = text.find("${", pos);
      if (start == std::string::npos) {
        out.append(text, pos);
        return out;
      }
      const auto end = text.find('}', start);
      if (end == std::string::npos) {
        fail(node, "unterminated ${ in '" + text + "'");
      }
      out.append(text, pos, start - pos);
      const std::string variable = text.substr(start + 2, end - start - 2);
      const char* value = std::getenv(variable.c_str());
      if (value == nullptr) {
        fail(node, "environment variable " + variable + " is not set");
      }
      out += value;
      pos = end + 1;
    }
  }

  const toml::table& table_;
  std::string name_;
  const std::string& source_;
  std::set<std::string> used_;
};

// A sub-table that must be a table if present; an empty one otherwise.
const toml::table& sub_table(TableReader& parent, const std::string& key) {
  static const toml::table kEmpty;
  const toml::node* node = parent.get(key);
  if (node == nullptr) {
    return kEmpty;
  }
  if (!node->is_table()) {
    parent.fail(*node, "[" + key + "] must be a table");
  }
  return *node->as_table();
}

const PublisherConfig* find_publisher(const RelayConfig& c, const std::string& name) {
  for (const auto& p : c.publishers) {
    if (p.name == name) {
      return &p;
    }
  }
  return nullptr;
}

void read_subscriptions(TableReader& top, const std::string& source, RelayConfig& c) {
  const toml::node* subs = top.get("subscriptions");
  if (subs == nullptr) {
    return;
  }
  if (!subs->is_array_of_tables()) {
    top.fail(*subs, "subscriptions must be [[subscriptions]] tables");
  }
  std::set<std::string> names;
  for (const auto& node : *subs->as_array()) {
    TableReader r(*node.as_table(), "subscriptions", source);
    SubscriptionConfig sub;
    sub.line = static_cast<int>(node.source().begin.line);
    r.string("name", sub.name);
    try {
      validate_subscription_name(sub.name);
    } catch (const std::invalid_argument& e) {
      r.fail(std::string("subscriptions.name: ") + e.what());
    }
    if (!names.insert(sub.name).second) {
      r.fail("subscriptions.name '" + sub.name + "' is defined twice");
    }
    r.string("publisher", sub.publisher);
    r.string("target", sub.target);
    r.string_list("event_types", sub.event_types);
    r.string_list("aggregate_types", sub.aggregate_types);
    r.string_list("required_tags", sub.required_tags);
    r.string_list("any_of_tags", sub.any_of_tags);
    if (auto start = r.string("start")) {
      if (*start != "beginning" && *start != "end") {
        r.fail(*r.get("start"), "subscriptions.start must be \"beginning\" or \"end\"");
      }
      sub.start_at_end = *start == "end";
    }
    r.duration("interval", sub.interval, milliseconds(1), hours(1));
    r.integer("batch", sub.batch, 1, 10000);
    r.integer("backoff_threshold", sub.backoff_threshold, 0, 1000);
    r.integer("backoff_multiplier", sub.backoff_multiplier, 1, 10);
    r.duration("backoff_max", sub.backoff_max, milliseconds(1), hours(24));
    r.integer("max_errors", sub.max_errors, 0, 1000000);
    r.duration("retry_base", sub.retry_base, milliseconds(1), hours(1));
    r.duration("retry_max", sub.retry_max, milliseconds(1), days(1));
    r.finish();
    const PublisherConfig* publisher = find_publisher(c, sub.publisher);
    if (publisher == nullptr) {
      r.fail(sub.publisher.empty() ? "subscriptions.publisher is required"
                                   : "subscriptions.publisher '" + sub.publisher +
                                         "' is not a [publishers.<name>] table");
    }
    if (sub.target.empty() && publisher->type != PublisherConfig::Type::Log &&
        publisher->type != PublisherConfig::Type::Statistics) {
      r.fail("subscriptions.target (topic or URL) is required for publisher '" + sub.publisher +
             "'");
    }
    if (auto problem = template_problem(sub.target)) {
      r.fail("subscriptions.target: " + *problem);
    }
    try {
      SubscriptionFilter{sub.event_types, sub.aggregate_types, sub.required_tags, sub.any_of_tags}
          .validate();
    } catch (const std::invalid_argument& e) {
      r.fail(std::string("subscriptions.") + sub.name + ": " + e.what());
    }
    c.subscriptions.push_back(std::move(sub));
  }
}

PublisherConfig read_publisher(const std::string& name, const toml::table& table,
                               const std::string& source) {
  TableReader r(table, "publishers." + name, source);
  PublisherConfig p;
  p.name = name;
  const auto type = r.string("type");
  if (!type) {
    r.fail("publishers." + name + ".type is required (kafka, http or log)");
  }
  if (*type == "kafka") {
    p.type = PublisherConfig::Type::Kafka;
    r.string("brokers", p.brokers);
    if (p.brokers.empty()) {
      r.fail("publishers." + name + ".brokers is required for a kafka publisher");
    }
    r.string_map("properties", p.properties);
    r.duration("delivery_timeout", p.delivery_timeout, milliseconds(1), hours(1));
  } else if (*type == "http") {
    p.type = PublisherConfig::Type::Http;
    if (auto mode = r.string("mode")) {
      if (*mode != "webhook" && *mode != "batch") {
        r.fail(*r.get("mode"), "publishers." + name + ".mode must be \"webhook\" or \"batch\"");
      }
      p.batch = *mode == "batch";
    }
    r.integer("batch_size", p.batch_size, 1, 10000);
    r.string("bearer_token", p.bearer_token);
    r.duration("connect_timeout", p.connect_timeout, milliseconds(1), hours(1));
    r.duration("request_timeout", p.request_timeout, milliseconds(1), hours(1));
    r.string("hmac_secret", p.hmac_secret);
    r.string("signature_header", p.signature_header);
    r.string_map("headers", p.headers);
  } else if (*type == "log") {
    p.type = PublisherConfig::Type::Log;
    r.string("path", p.path);
  } else if (*type == "statistics") {
    p.type = PublisherConfig::Type::Statistics;
    r.duration("log_interval", p.log_interval, seconds(1), days(1));
  } else {
    r.fail(*r.get("type"), "publishers." + name + ".type '" + *type +
                               "' is not one of kafka, http, log, statistics");
  }
  r.finish();
  return p;
}

RelayConfig read(const toml::table& root, const std::string& source) {
  RelayConfig c;
  TableReader top(root, "", source);

  TableReader db(sub_table(top, "database"), "database", source);
  db.string("url", c.database.url);
  if (c.database.url.empty()) {
    top.fail("database.url is required");
  }
  db.string("table", c.database.table);
  try {
    validate_table_name(c.database.table);
  } catch (const std::invalid_argument& e) {
    db.fail(*db.get("table"), std::string("database.table: ") + e.what());
  }
  db.integer("pool_size", c.database.pool_size, 1, 1000);
  db.duration("connect_timeout", c.database.connect_timeout, seconds(1), minutes(5));
  db.duration("keepalive_idle", c.database.keepalive_idle, seconds(1), hours(1));
  db.duration("io_timeout", c.database.io_timeout, seconds(1), hours(1));
  db.finish();

  TableReader poller(sub_table(top, "poller"), "poller", source);
  poller.duration("interval", c.poller.interval, milliseconds(1), hours(1));
  poller.integer("batch", c.poller.batch, 1, 100000);
  poller.duration("lock_expiry", c.poller.lock_expiry, seconds(1), days(1));
  poller.string("owner", c.poller.owner);
  if (c.poller.owner.size() > 128) {
    poller.fail(*poller.get("owner"), "poller.owner must be at most 128 bytes");
  }
  if (auto wakeup = poller.string("wakeup")) {
    using W = RelayConfig::Poller::Wakeup;
    static const std::pair<std::string_view, W> kWakeups[] = {{"auto", W::Auto},
                                                              {"listen", W::Listen},
                                                              {"data_version", W::DataVersion},
                                                              {"adaptive", W::Adaptive},
                                                              {"off", W::Off}};
    const auto* it = std::find_if(std::begin(kWakeups), std::end(kWakeups),
                                  [&](const auto& w) { return w.first == *wakeup; });
    if (it == std::end(kWakeups)) {
      poller.fail(*poller.get("wakeup"), "poller.wakeup '" + *wakeup +
                                             "' is not one of auto, listen, data_version, "
                                             "adaptive, off");
    }
    c.poller.wakeup = it->second;
  }
  poller.finish();

  TableReader d(sub_table(top, "dispatcher"), "dispatcher", source);
  d.integer("workers", c.dispatcher.workers, 1, 1024);
  d.integer("batch", c.dispatcher.batch, 1, 10000);
  d.integer("queue", c.dispatcher.queue, 1, 1000000);
  d.integer("max_attempts", c.dispatcher.max_attempts, 1, 1000);
  d.duration("backoff_base", c.dispatcher.backoff_base, milliseconds(1), days(30));
  d.duration("backoff_max", c.dispatcher.backoff_max, milliseconds(1), days(30));
  d.duration("drain_timeout", c.dispatcher.drain_timeout, milliseconds(1), hours(1));
  d.boolean("ordered", c.dispatcher.ordered);
  d.finish();
  if (c.dispatcher.backoff_max < c.dispatcher.backoff_base) {
    top.fail("dispatcher.backoff_max must not be less than dispatcher.backoff_base");
  }

  TableReader relay(sub_table(top, "relay"), "relay", source);
  std::string mode = "active";
  relay.string("mode", mode);
  if (mode != "active" && mode != "standby") {
    relay.fail(*relay.get("mode"), "relay.mode must be \"active\" or \"standby\"");
  }
  c.relay.standby = mode == "standby";
  if (c.relay.standby && !c.poller.owner.empty()) {
    try {
      validate_lease_name(c.poller.owner);
    } catch (const std::invalid_argument&) {
      poller.fail(*poller.get("owner"),
                  "poller.owner must be printable ASCII without spaces in standby mode (it is the "
                  "lease owner)");
    }
  }
  relay.duration("lease_ttl", c.relay.lease_ttl, seconds(1), hours(1));
  relay.duration("lease_renew", c.relay.lease_renew, milliseconds(100), minutes(20));
  relay.finish();
  // One failed renewal must not lose the lease: the holding is trusted until ttl − ttl/5.
  if (c.relay.lease_renew * 5 > c.relay.lease_ttl * 2) {
    top.fail("relay.lease_renew (" + format_duration(c.relay.lease_renew) +
             ") must be at most 0.4 × relay.lease_ttl (" + format_duration(c.relay.lease_ttl) +
             "), so that one failed renewal does not lose the lease");
  }

  TableReader groups(sub_table(top, "groups"), "groups", source);
  c.groups.configured = top.get("groups") != nullptr;
  groups.boolean("enabled", c.groups.enabled);
  groups.integer("max_concurrent_groups", c.groups.max_concurrent_groups, 1, 100000);
  groups.integer("per_group", c.groups.per_group, 1, 1000);
  groups.finish();
  if (c.groups.configured && c.groups.enabled && (c.relay.standby || c.dispatcher.ordered)) {
    top.fail(*top.get("groups"),
             "[groups] needs relay.mode = \"active\" without dispatcher.ordered: the partitions "
             "of message groups are leased to active relays (set groups.enabled = false, or use "
             "active mode)");
  }

  TableReader purge(sub_table(top, "purge"), "purge", source);
  purge.boolean("enabled", c.purge.enabled);
  purge.boolean("include_pending", c.purge.include_pending);
  purge.duration("retention", c.purge.retention, seconds(1), days(3650));
  purge.duration("interval", c.purge.interval, seconds(1), days(30));
  purge.finish();

  TableReader admin(sub_table(top, "admin"), "admin", source);
  admin.boolean("enabled", c.admin.enabled);
  admin.string("host", c.admin.host);
  admin.integer("port", c.admin.port, 0, 65535);
  admin.duration("alert_oldest_pending", c.admin.alert_oldest_pending, std::chrono::seconds(1),
                 days(3650));
  if (auto token = admin.string("token")) {
    // An empty ${VAR} must not silently open the API.
    if (token->empty()) {
      admin.fail(*admin.get("token"),
                 "admin.token is empty (an empty environment variable?); leave the key out to run "
                 "without a token");
    }
    c.admin.token = *token;
  }
  admin.finish();

  const toml::node* publishers = top.get("publishers");
  if (publishers == nullptr || !publishers->is_table() || publishers->as_table()->empty()) {
    top.fail(publishers ? *publishers : static_cast<const toml::node&>(root),
             "at least one [publishers.<name>] table is required");
  }
  for (const auto& [name, node] : *publishers->as_table()) {
    if (!node.is_table()) {
      top.fail(node, "publishers." + std::string(name.str()) + " must be a table");
    }
    c.publishers.push_back(read_publisher(std::string(name.str()), *node.as_table(), source));
  }

  TableReader stream(sub_table(top, "stream"), "stream", source);
  stream.duration("max_lag_retention", c.stream.max_lag_retention, milliseconds(0), days(3650));
  stream.boolean("fail_lagging", c.stream.fail_lagging);
  stream.finish();

  read_subscriptions(top, source, c);
  if (!c.subscriptions.empty() && !c.poller.owner.empty()) {
    try {
      validate_lease_name(c.poller.owner);
    } catch (const std::invalid_argument&) {
      poller.fail(*poller.get("owner"),
                  "poller.owner must be printable ASCII without spaces with [[subscriptions]] (it "
                  "is the owner of their leases)");
    }
  }
  const toml::node* routes = top.get("routes");
  if ((routes == nullptr && c.subscriptions.empty()) ||
      (routes != nullptr && (!routes->is_array_of_tables() || routes->as_array()->empty()))) {
    top.fail(routes ? *routes : static_cast<const toml::node&>(root),
             "at least one [[routes]] or [[subscriptions]] entry is required");
  }
  static const toml::array kNoRoutes;
  for (const auto& node : routes ? *routes->as_array() : kNoRoutes) {
    TableReader r(*node.as_table(), "routes", source);
    RouteConfig route;
    route.line = static_cast<int>(node.source().begin.line);
    r.string("event_type", route.event_type);
    r.string("aggregate_type", route.aggregate_type);
    r.string("publisher", route.publisher);
    r.string("target", route.target);
    r.string("on_failure", route.on_failure);
    r.string("table", route.table);
    r.finish();
    if (route.table.empty() && r.get("table") == nullptr) {
      route.table = c.database.table;
    }
    try {
      validate_table_name(route.table);
    } catch (const std::invalid_argument& e) {
      r.fail(*r.get("table"), std::string("routes.table: ") + e.what());
    }
    // SQLite and PostgreSQL (unquoted) take names in any case: two spellings would be two
    // pollers of one table, each finding no route for the other's events.
    auto same_but_case = [&](const std::string& other) {
      return other != route.table && other.size() == route.table.size() &&
             std::equal(other.begin(), other.end(), route.table.begin(), [](char a, char b) {
               return std::tolower(static_cast<unsigned char>(a)) ==
                      std::tolower(static_cast<unsigned char>(b));
             });
    };
    std::string clash = same_but_case(c.database.table) ? c.database.table : "";
    for (const auto& other : c.routes) {
      if (clash.empty() && same_but_case(other.table)) {
        clash = other.table;
      }
    }
    if (!clash.empty()) {
      const std::string message =
          "routes.table '" + route.table + "' is '" + clash +
          "' written in another case: spell a table the same way everywhere";
      if (const auto* node = r.get("table")) {
        r.fail(*node, message);
      }
      r.fail(message);  // the route took database.table by default
    }
    try {
      parse_group_failure_policy(route.on_failure);
    } catch (const std::invalid_argument& e) {
      r.fail(*r.get("on_failure"), std::string("routes.on_failure: ") + e.what());
    }
    const PublisherConfig* publisher = nullptr;
    for (const auto& p : c.publishers) {
      if (p.name == route.publisher) {
        publisher = &p;
      }
    }
    if (publisher == nullptr) {
      r.fail(route.publisher.empty()
                 ? "routes.publisher is required"
                 : "routes.publisher '" + route.publisher + "' is not a [publishers.<name>] table");
    }
    if (route.target.empty() && publisher->type != PublisherConfig::Type::Log &&
        publisher->type != PublisherConfig::Type::Statistics) {
      r.fail("routes.target (topic or URL) is required for publisher '" + route.publisher + "'");
    }
    if (auto problem = template_problem(route.target)) {
      r.fail("routes.target: " + *problem);
    }
    c.routes.push_back(std::move(route));
  }
  for (const auto& route : c.routes) {
    if (c.purge.include_pending && route.table == c.database.table) {
      top.fail(*routes,
               "purge.include_pending deletes rows [[routes]] have not delivered: it is for "
               "tables only subscriptions read (here a route takes database.table)");
    }
  }
  top.finish();
  return c;
}

}  // namespace

std::chrono::milliseconds parse_duration(std::string_view text) {
  const auto not_a_duration = [&] {
    return std::invalid_argument("'" + std::string(text) +
                                 "' is not a duration (a whole number and ms, s, m, h or d)");
  };
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') {
    ++digits;
  }
  if (digits == 0) {
    throw not_a_duration();
  }
  const std::string_view unit = text.substr(digits);
  std::int64_t unit_ms = 0;
  if (unit == "ms") {
    unit_ms = 1;
  } else if (unit == "s") {
    unit_ms = 1000;
  } else if (unit == "m") {
    unit_ms = 60'000;
  } else if (unit == "h") {
    unit_ms = 3'600'000;
  } else if (unit == "d") {
    unit_ms = 86'400'000;
  } else {
    throw not_a_duration();
  }
  // Bounded before any clock sees it: a longer value would wrap nanosecond time points.
  const std::int64_t limit = kMaxDuration.count() / unit_ms;
  std::int64_t n = 0;
  for (std::size_t i = 0; i < digits; ++i) {
    n = n * 10 + (text[i] - '0');
    if (n > limit) {
      throw std::invalid_argument("'" + std::string(text) + "' is too long (at most " +
                                  format_duration(kMaxDuration) + ")");
    }
  }
  return std::chrono::milliseconds(n * unit_ms);
}

std::string format_duration(std::chrono::milliseconds d) {
  const std::int64_t ms = d.count();
  for (const auto& [unit, size] : {std::pair<const char*, std::int64_t>{"d", 86'400'000},
                                   {"h", 3'600'000},
                                   {"m", 60'000},
                                   {"s", 1000}}) {
    if (ms != 0 && ms % size == 0) {
      return std::to_string(ms / size) + unit;
    }
  }
  return std::to_string(ms) + "ms";
}

RelayConfig parse_config(std::string_view text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    throw ConfigError(place(source, e.source()) + std::string(e.description()));
  }
  return read(root, source);
}

RelayConfig load_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) {
    throw ConfigError(path + ": cannot be read");
  }
  std::stringstream text;
  text << in.rdbuf();
  return parse_config(text.str(), path);
}

}  // namespace outbox::relay
