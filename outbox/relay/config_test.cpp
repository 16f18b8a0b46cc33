#include "outbox/relay/config.hpp"

#include <gtest/gtest.h>

#include <stdlib.h>

namespace outbox::relay {
namespace {

using namespace std::chrono_literals;

constexpr const char* kFull = R"(
[database]
url = "sqlite:///tmp/x.db"
table = "events_out"

[poller]
interval = "250ms"
batch = 500
lock_expiry = "1m"
wakeup = "adaptive"

[dispatcher]
workers = 32
batch = 250
max_attempts = 5
backoff_base = "2s"
backoff_max = "10m"

[admin]
port = 0
token = "${OUTBOX_TEST_ADMIN_TOKEN}"

[publishers.kafka-main]
type = "kafka"
brokers = "k1:9092,k2:9092"
properties = { "linger.ms" = "20", "compression.type" = "zstd", "batch.num.messages" = 1000 }

[publishers.hooks]
type = "http"
mode = "batch"
batch_size = 50
bearer_token = "tok"
request_timeout = "3s"

[publishers.dev]
type = "log"

[[routes]]
event_type = "Order*"
aggregate_type = "Order"
publisher = "kafka-main"
target = "{event_type}-out-0"

[[routes]]
publisher = "hooks"
target = "http://127.0.0.1:1/api/events/batch"
)";

TEST(RelayConfig, ParsesEveryTableWithDefaultsAndEnvironment) {
  setenv("OUTBOX_TEST_ADMIN_TOKEN", "from-env", 1);
  auto c = parse_config(kFull, "relay.toml");
  EXPECT_EQ(c.database.url, "sqlite:///tmp/x.db");
  EXPECT_EQ(c.database.table, "events_out");
  EXPECT_EQ(c.database.pool_size, 8);
  EXPECT_EQ(c.poller.interval, 250ms);
  EXPECT_EQ(c.poller.batch, 500);
  EXPECT_EQ(c.poller.lock_expiry, 60s);
  EXPECT_EQ(c.poller.wakeup, RelayConfig::Poller::Wakeup::Adaptive);
  EXPECT_EQ(c.dispatcher.workers, 32);
  EXPECT_EQ(c.dispatcher.batch, 250);
  EXPECT_EQ(c.dispatcher.max_attempts, 5);
  EXPECT_EQ(c.dispatcher.backoff_max, 600s);
  EXPECT_FALSE(c.dispatcher.ordered);
  EXPECT_FALSE(c.relay.standby);  // active by default
  EXPECT_EQ(c.relay.lease_ttl, 15s);
  EXPECT_EQ(c.relay.lease_renew, 5s);
  EXPECT_EQ(c.admin.host, "127.0.0.1");
  EXPECT_EQ(c.admin.port, 0);
  EXPECT_EQ(c.admin.token, "from-env");
  ASSERT_EQ(c.publishers.size(), 3u);
  const auto& hooks = c.publishers[0].name == "hooks" ? c.publishers[0] : c.publishers[1];
  EXPECT_EQ(hooks.type, PublisherConfig::Type::Http);
  EXPECT_TRUE(hooks.batch);
  EXPECT_EQ(hooks.batch_size, 50u);
  EXPECT_EQ(hooks.request_timeout, 3s);
  const PublisherConfig* kafka = nullptr;
  for (const auto& p : c.publishers) {
    if (p.name == "kafka-main")
      kafka = &p;
  }
  ASSERT_NE(kafka, nullptr);
  EXPECT_EQ(kafka->brokers, "k1:9092,k2:9092");
  EXPECT_EQ(kafka->properties.at("linger.ms"), "20");
  EXPECT_EQ(kafka->properties.at("batch.num.messages"), "1000");
  ASSERT_EQ(c.routes.size(), 2u);
  EXPECT_EQ(c.routes[0].target, "{event_type}-out-0");
  EXPECT_EQ(c.routes[0].line, 38);
  EXPECT_EQ(c.routes[1].event_type, "*");
}

// Each bad file must name the line of the problem.
void expect_error(const std::string& text, const std::string& where, const std::string& what) {
  try {
    parse_config(text, "relay.toml");
    ADD_FAILURE() << "accepted:\n" << text;
  } catch (const ConfigError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.rfind("relay.toml:" + where, 0), 0u) << message;
    EXPECT_NE(message.find(what), std::string::npos) << message;
  }
}

TEST(RelayConfig, ErrorsNameTheLine) {
  const std::string head = "[database]\nurl = \"sqlite:///x.db\"\n[publishers.p]\ntype = \"log\"\n";
  const std::string route = "[[routes]]\npublisher = \"p\"\n";
  expect_error("[database\nurl = 1\n", "1:", "");  // TOML syntax
  expect_error(head + route + "[poller]\nintervall = \"1s\"\n",
               "8:", "unknown key 'poller.intervall'");
  expect_error(head + route + "[poller]\ninterval = 5\n", "8:", "duration string");
  expect_error(head + route + "[poller]\ninterval = \"5 parsecs\"\n", "8:", "not a duration");
  expect_error(head + route + "[dispatcher]\nworkers = 0\n", "8:", "between 1 and 1024");
  expect_error(head + route + "[poller]\nwakeup = \"notify\"\n",
               "8:", "'notify' is not one of auto, listen, data_version, adaptive, off");
  expect_error(head + "[[routes]]\npublisher = \"kafak\"\n", "5:", "'kafak' is not a [publishers");
  expect_error(head + "[[routes]]\npublisher = \"p\"\ntarget = \"{evnt_type}\"\n",
               "5:", "unknown placeholder {evnt_type}");
  expect_error(head + "[publishers.k]\ntype = \"kafka\"\n" + route, "5:", "brokers is required");
  expect_error(head + "[publishers.h]\ntype = \"http\"\nmode = \"bulk\"\n" + route,
               "7:", "webhook");
  expect_error(head + "[publishers.h]\ntype = \"smtp\"\n" + route, "6:", "not one of kafka");
  expect_error(head + route + "[admin]\ntoken = \"${OUTBOX_TEST_UNSET_VARIABLE}\"\n",
               "8:", "OUTBOX_TEST_UNSET_VARIABLE is not set");
  expect_error(head + route + "[relay]\nmode = \"passive\"\n",
               "8:", "relay.mode must be \"active\" or \"standby\"");
  expect_error(
      head + route + "[relay]\nmode = \"standby\"\nlease_ttl = \"10s\"\nlease_renew = \"5s\"\n",
      "1:1:", "relay.lease_renew (5s) must be at most 0.4 × relay.lease_ttl (10s)");
  expect_error(head + route + "[poller]\nowner = \"relay a\"\n[relay]\nmode = \"standby\"\n",
               "8:", "poller.owner must be printable ASCII without spaces in standby mode");
  expect_error(head, "1:1:", "[[routes]] or [[subscriptions]]");
  const std::string sub = "[[subscriptions]]\nname = \"s\"\npublisher = \"p\"\n";
  expect_error(head + sub + sub, "8:", "subscriptions.name 's' is defined twice");
  expect_error(head + "[[subscriptions]]\nname = \"a b\"\npublisher = \"p\"\n",
               "5:", "printable ASCII");
  expect_error(head + "[[subscriptions]]\nname = \"s\"\npublisher = \"q\"\n",
               "5:", "'q' is not a [publishers");
  expect_error(head + sub + "required_tags = [\"=v\"]\n", "5:", "has no tag name");
  expect_error(head + sub + "event_types = [1]\n", "8:", "must hold strings only");
  expect_error(head + sub + "start = \"middle\"\n", "8:", "\"beginning\" or \"end\"");
  expect_error(head + sub + "batch = 0\n", "8:", "between 1 and 10000");
  expect_error(head + sub + "[poller]\nowner = \"relay a\"\n", "9:", "with [[subscriptions]]");
  expect_error(head + "[publishers.k]\ntype = \"kafka\"\nbrokers = \"b:1\"\n" +
                   "[[subscriptions]]\nname = \"s\"\npublisher = \"k\"\n",
               "8:", "subscriptions.target (topic or URL) is required");
  expect_error(head + route + "[purge]\nenabled = true\ninclude_pending = true\n",
               "5:", "purge.include_pending deletes rows [[routes]] have not delivered");
  expect_error(head + sub + "[stream]\nmax_lag_retention = \"forever\"\n", "9:", "not a duration");
  expect_error("[publishers.p]\ntype = \"log\"\n" + route, "1:1:", "database.url is required");
  EXPECT_THROW(load_config("/nonexistent/relay.toml"), ConfigError);
}

TEST(RelayConfig, SubscriptionsWithoutRoutesAndTheirDefaults) {
  const auto c = parse_config(R"(
[database]
url = "sqlite:///x.db"
[publishers.stats]
type = "statistics"
log_interval = "10s"
[publishers.hooks]
type = "http"
[stream]
max_lag_retention = "2d"
fail_lagging = true
[[subscriptions]]
name = "wallets"
publisher = "hooks"
target = "http://127.0.0.1:1/{event_type}"
event_types = "Wallet*"
required_tags = ["wallet_id", "currency=EUR"]
any_of_tags = ["a", "b"]
start = "end"
interval = "1s"
batch = 500
backoff_threshold = 5
backoff_multiplier = 3
backoff_max = "2m"
max_errors = 0
retry_base = "50ms"
retry_max = "5s"
[[subscriptions]]
name = "all"
publisher = "stats"
)");
  EXPECT_TRUE(c.routes.empty());
  ASSERT_EQ(c.subscriptions.size(), 2u);
  const auto& w = c.subscriptions[0];
  EXPECT_EQ(w.name, "wallets");
  EXPECT_EQ(w.event_types, (std::vector<std::string>{"Wallet*"}));
  EXPECT_EQ(w.required_tags, (std::vector<std::string>{"wallet_id", "currency=EUR"}));
  EXPECT_EQ(w.any_of_tags, (std::vector<std::string>{"a", "b"}));
  EXPECT_TRUE(w.start_at_end);
  EXPECT_EQ(w.interval, 1s);
  EXPECT_EQ(w.batch, 500);
  EXPECT_EQ(w.backoff_threshold, 5);
  EXPECT_EQ(w.backoff_multiplier, 3);
  EXPECT_EQ(w.backoff_max, 2min);
  EXPECT_EQ(w.max_errors, 0);
  EXPECT_EQ(w.retry_base, 50ms);
  EXPECT_EQ(w.retry_max, 5s);
  const auto& a = c.subscriptions[1];
  EXPECT_FALSE(a.start_at_end);
  EXPECT_EQ(a.interval, 500ms);
  EXPECT_EQ(a.batch, 100);
  EXPECT_EQ(a.max_errors, 10);
  EXPECT_TRUE(a.event_types.empty());
  EXPECT_EQ(c.stream.max_lag_retention, std::chrono::hours(48));
  EXPECT_TRUE(c.stream.fail_lagging);
  EXPECT_EQ(c.publishers[1].type, PublisherConfig::Type::Statistics);
  EXPECT_EQ(c.publishers[1].log_interval, 10s);
}

TEST(RelayConfig, ShippedExampleIsValid) {
  auto c = load_config(OUTBOX_SOURCE_DIR "/examples/relay.toml");
  EXPECT_EQ(c.publishers.size(), 3u);
  EXPECT_EQ(c.routes.size(), 3u);
  EXPECT_EQ(c.routes[0].target, "{event_type}-out-0");
}

TEST(RelayConfig, Durations) {
  EXPECT_EQ(parse_duration("250ms"), 250ms);
  EXPECT_EQ(parse_duration("7d"), std::chrono::hours(168));
  for (const char* bad : {"", "s", "1.5s", "10", "-1s", "1w", "1 s"}) {
    EXPECT_THROW(parse_duration(bad), std::invalid_argument) << bad;
  }
  EXPECT_EQ(parse_duration("3650d"), kMaxDuration);
  EXPECT_EQ(parse_duration("315360000000ms"), kMaxDuration);
  // Longer values would wrap nanosecond clocks (999999d once purged every row): refused, with
  // the limit in the message, however many digits.
  for (const char* big :
       {"3651d", "999999d", "87601h", "315360000001ms", "99999999999999999999999999s"}) {
    try {
      parse_duration(big);
      ADD_FAILURE() << big;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("at most 3650d"), std::string::npos) << e.what();
    }
  }
  EXPECT_EQ(format_duration(std::chrono::hours(168)), "7d");
  EXPECT_EQ(format_duration(90s), "90s");
  EXPECT_EQ(format_duration(1500ms), "1500ms");
}

TEST(RelayConfig, StandbyModeAndItsLease) {
  const auto c = parse_config(
      "[database]\nurl = \"sqlite:///x.db\"\n[relay]\nmode = \"standby\"\nlease_ttl = \"30s\"\n"
      "lease_renew = \"10s\"\n[publishers.p]\ntype = \"log\"\n[[routes]]\npublisher = \"p\"\n");
  EXPECT_TRUE(c.relay.standby);
  EXPECT_EQ(c.relay.lease_ttl, 30s);
  EXPECT_EQ(c.relay.lease_renew, 10s);
}

TEST(RelayConfig, RoutesNameTheirTable) {
  const std::string head =
      "[database]\nurl = \"sqlite:///x.db\"\ntable = \"outbox_events\"\n"
      "[publishers.p]\ntype = \"log\"\n";
  const auto c = parse_config(head +
                              "[[routes]]\npublisher = \"p\"\n"
                              "[[routes]]\npublisher = \"p\"\ntable = \"outbox_dispatch_jobs\"\n");
  EXPECT_EQ(c.routes[0].table, "outbox_events");  // database.table when left out
  EXPECT_EQ(c.routes[1].table, "outbox_dispatch_jobs");
  try {
    parse_config(head + "[[routes]]\npublisher = \"p\"\ntable = \"jobs; DROP TABLE x\"\n");
    FAIL() << "a table name that is not an identifier was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("config:8:9:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("routes.table"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_config("[database]\nurl = \"sqlite:///x.db\"\ntable = \"1x\"\n"
                            "[publishers.p]\ntype = \"log\"\n[[routes]]\npublisher = \"p\"\n"),
               ConfigError);
  EXPECT_THROW(parse_config(head + "[[routes]]\npublisher = \"p\"\ntable = \"\"\n"), ConfigError);
  // One table in two spellings would be two pollers of it, each without the other's routes.
  try {
    parse_config(head + "[[routes]]\npublisher = \"p\"\ntable = \"OUTBOX_EVENTS\"\n");
    FAIL() << "database.table in another case was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("another case"), std::string::npos) << e.what();
  }
  EXPECT_THROW(parse_config(head + "[[routes]]\npublisher = \"p\"\ntable = \"jobs\"\n"
                                   "[[routes]]\npublisher = \"p\"\ntable = \"Jobs\"\n"),
               ConfigError);
  // purge.include_pending is for database.table when no route takes it.
  const std::string purge = "[purge]\nenabled = true\ninclude_pending = true\n";
  EXPECT_NO_THROW(parse_config(head + purge + "[[routes]]\npublisher = \"p\"\ntable = \"jobs\"\n"));
  EXPECT_THROW(parse_config(head + purge + "[[routes]]\npublisher = \"p\"\n"), ConfigError);
}

TEST(RelayConfig, GroupsAndTheFailurePolicyOfRoutes) {
  const std::string head = "[database]\nurl = \"sqlite:///x.db\"\n[publishers.p]\ntype = \"log\"\n";
  const auto defaults = parse_config(head + "[[routes]]\npublisher = \"p\"\n");
  EXPECT_TRUE(defaults.groups.enabled);
  EXPECT_FALSE(defaults.groups.configured);
  EXPECT_EQ(defaults.poller.wakeup, RelayConfig::Poller::Wakeup::Auto);
  EXPECT_EQ(defaults.groups.max_concurrent_groups, 64);
  EXPECT_EQ(defaults.routes[0].on_failure, "block");
  const auto c = parse_config(head +
                              "[groups]\nmax_concurrent_groups = 8\nper_group = 3\n[[routes]]\n"
                              "publisher = \"p\"\non_failure = \"dead_letter_group\"\n");
  EXPECT_EQ(c.groups.max_concurrent_groups, 8);
  EXPECT_EQ(c.groups.per_group, 3);
  EXPECT_EQ(c.routes[0].on_failure, "dead_letter_group");
  try {
    parse_config(head + "[[routes]]\npublisher = \"p\"\non_failure = \"retry\"\n");
    FAIL() << "an unknown policy was accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("config:7:"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("block, skip or dead_letter_group"), std::string::npos);
  }
  // Standby and ordered relays deliver no groups: a [groups] table there is a mistake...
  EXPECT_THROW(parse_config(head + "[relay]\nmode = \"standby\"\n[groups]\n[[routes]]\n"
                                   "publisher = \"p\"\n"),
               ConfigError);
  EXPECT_THROW(parse_config(head + "[dispatcher]\nordered = true\n[groups]\nper_group = 2\n"
                                   "[[routes]]\npublisher = \"p\"\n"),
               ConfigError);
  // ...unless it turns them off.
  EXPECT_FALSE(parse_config(head + "[relay]\nmode = \"standby\"\n[groups]\nenabled = false\n"
                                   "[[routes]]\npublisher = \"p\"\n")
                   .groups.enabled);
  EXPECT_THROW(parse_config(head + "[groups]\nmax_concurrent_groups = 0\n[[routes]]\n"
                                   "publisher = \"p\"\n"),
               ConfigError);
}

TEST(RelayConfig, EveryDurationKeyIsBoundedAndNamesItsLimits) {
  const std::string head = "[database]\nurl = \"sqlite:///tmp/x.db\"\n";
  const std::string tail =
      "[publishers.p]\ntype = \"http\"\n[[routes]]\npublisher = \"p\"\ntarget = \"http://h/\"\n";
  struct Case {
    const char* table;
    const char* key;
    const char* value;
    const char* limit;
  };
  for (const Case& c : {Case{"poller", "interval", "2h", "between 1ms and 1h"},
                        Case{"poller", "lock_expiry", "2d", "between 1s and 1d"},
                        Case{"poller", "lock_expiry", "10ms", "between 1s and 1d"},
                        Case{"dispatcher", "drain_timeout", "999999d", "at most 3650d"},
                        Case{"dispatcher", "drain_timeout", "2h", "between 1ms and 1h"},
                        Case{"dispatcher", "backoff_max", "31d", "between 1ms and 30d"},
                        Case{"purge", "retention", "3651d", "at most 3650d"},
                        Case{"purge", "interval", "31d", "between 1s and 30d"},
                        Case{"purge", "interval", "0s", "between 1s and 30d"},
                        Case{"relay", "lease_ttl", "500ms", "between 1s and 1h"},
                        Case{"relay", "lease_renew", "50ms", "between 100ms and 20m"}}) {
    const std::string text =
        head + "[" + c.table + "]\n" + c.key + " = \"" + c.value + "\"\n" + tail;
    try {
      parse_config(text);
      ADD_FAILURE() << c.table << "." << c.key << " = " << c.value;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(std::string(c.table) + "." + c.key), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find(c.limit), std::string::npos) << e.what();
    }
  }
  try {
    parse_config(head +
                 "[publishers.p]\ntype = \"http\"\nconnect_timeout = \"2h\"\n[[routes]]\n"
                 "publisher = \"p\"\ntarget = \"http://h/\"\n");
    ADD_FAILURE();
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("publishers.p.connect_timeout must be between 1ms and 1h"),
              std::string::npos)
        << e.what();
  }
}

TEST(RelayConfig, DurationsExpandEnvironmentVariables) {
  setenv("OUTBOX_TEST_RETENTION", "3d", 1);
  const auto c = parse_config(
      "[database]\nurl = \"sqlite:///tmp/x.db\"\n[purge]\nretention = "
      "\"${OUTBOX_TEST_RETENTION}\"\n"
      "[publishers.p]\ntype = \"log\"\n[[routes]]\npublisher = \"p\"\n");
  EXPECT_EQ(c.purge.retention, std::chrono::hours(72));
  setenv("OUTBOX_TEST_RETENTION", "9999999d", 1);
  EXPECT_THROW(parse_config("[database]\nurl = \"sqlite:///tmp/x.db\"\n[purge]\nretention = "
                            "\"${OUTBOX_TEST_RETENTION}\"\n[publishers.p]\ntype = \"log\"\n"
                            "[[routes]]\npublisher = \"p\"\n"),
               ConfigError);
  unsetenv("OUTBOX_TEST_RETENTION");
}

}  // namespace
}  // namespace outbox::relay
