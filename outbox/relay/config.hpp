#pragma once
// The relay's configuration file (TOML), validated at load with file:line:column errors.

#include <chrono>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/clock.hpp"

namespace outbox::relay {

/// A configuration problem; what() starts with "<source>:<line>:<column>: " when it has a place.
class ConfigError : public std::invalid_argument {
 public:
  using std::invalid_argument::invalid_argument;
};

/// One [publishers.<name>] table. Fields not used by its type keep their defaults.
struct PublisherConfig {
  enum class Type { Kafka, Http, Log, Statistics };
  std::string name;
  Type type = Type::Log;
  // kafka
  std::string brokers;
  std::map<std::string, std::string> properties;  ///< [publishers.<name>.properties]
  std::chrono::milliseconds delivery_timeout{30000};
  // http
  bool batch = false;  ///< mode = "batch" (JSON array per request) or "webhook" (default)
  std::size_t batch_size = 100;
  std::string bearer_token;
  std::chrono::milliseconds connect_timeout{2000};
  std::chrono::milliseconds request_timeout{10000};
  std::string hmac_secret;
  std::string signature_header = "X-Outbox-Signature";
  std::map<std::string, std::string> headers;  ///< [publishers.<name>.headers]
  // log
  std::string path;  ///< empty: standard output
  // statistics
  std::chrono::milliseconds log_interval{60000};
};

/// One [[routes]] entry: the first route matching an event decides where it goes.
struct RouteConfig {
  std::string event_type = "*";      ///< exact name or glob (* and ?)
  std::string aggregate_type = "*";  ///< exact name or glob
  std::string publisher;             ///< a [publishers.<name>] name
  /// Topic or URL; may use {event_type}, {aggregate_type}, {aggregate_id}, {tenant_id}.
  std::string target;
  /// Message groups: what a head that failed for good does to its group: "block" (the group
  /// waits for an operator), "skip" (the head goes DEAD, the group goes on) or
  /// "dead_letter_group" (the head and the group's pending events go DEAD together).
  std::string on_failure = "block";
  /// The outbox table whose events this route takes (empty: database.table). A relay drains
  /// every table its routes name, each with its own claims, message groups and purge.
  std::string table;
  int line = 0;  ///< where it was defined, for messages
};

/// One [[subscriptions]] entry (stream mode): a named reader of the stream with its own cursor.
struct SubscriptionConfig {
  std::string name;
  std::string publisher;                 ///< a [publishers.<name>] name
  std::string target;                    ///< topic or URL; the same placeholders as routes.target
  std::vector<std::string> event_types;  ///< globs; empty: every type
  std::vector<std::string> aggregate_types;  ///< globs; empty: every aggregate type
  std::vector<std::string> required_tags;    ///< "name" or "name=value"; all must hold
  std::vector<std::string> any_of_tags;      ///< at least one must hold (when any are given)
  bool start_at_end = false;                 ///< start = "end" (default "beginning")
  std::chrono::milliseconds interval{500};
  int batch = 100;
  int backoff_threshold = 3;
  int backoff_multiplier = 2;
  std::chrono::milliseconds backoff_max{60000};
  int max_errors = 10;  ///< 0: never FAILED
  std::chrono::milliseconds retry_base{1000};
  std::chrono::milliseconds retry_max{60000};
  int line = 0;
};

/// The whole file. Defaults are what a key left out means.
struct RelayConfig {
  struct Database {
    std::string url;  ///< required: sqlite:///path.db, postgresql://…, mysql://…
    std::string table = "outbox_event";
    int pool_size = 8;
    std::chrono::milliseconds connect_timeout{10000};  ///< PostgreSQL, MariaDB
    std::chrono::milliseconds keepalive_idle{30000};   ///< PostgreSQL TCP keepalives
    /// PostgreSQL tcp_user_timeout; MariaDB read and write timeouts.
    std::chrono::milliseconds io_timeout{30000};
  } database;
  struct Poller {
    std::chrono::milliseconds interval{500};
    int batch = 200;
    std::chrono::milliseconds lock_expiry{30000};
    std::string owner;  ///< empty: host name, process id and a random part
    /// How a poll starts before its interval: Listen (PostgreSQL LISTEN for writers' NOTIFY),
    /// DataVersion (SQLite: another connection committed), Adaptive (10 ms after a cycle that
    /// found work, doubling back to the interval), Off; Auto picks the engine's (MariaDB:
    /// Adaptive).
    enum class Wakeup { Auto, Listen, DataVersion, Adaptive, Off } wakeup = Wakeup::Auto;
  } poller;
  struct Dispatcher {
    int workers = 16;
    /// Events handed to a Kafka, HTTP-batch or log publisher in one call (webhooks: one each).
    int batch = 100;
    std::size_t queue = 1000;
    int max_attempts = 10;
    std::chrono::milliseconds backoff_base{1000};
    std::chrono::milliseconds backoff_max{300000};
    std::chrono::milliseconds drain_timeout{10000};
    /// One worker, no claim locking, one attempt: per-aggregate order on a single relay.
    bool ordered = false;
  } dispatcher;
  struct Relay {
    /// "active": every relay delivers, rows spread between relays by claims. "standby": only the
    /// relay holding the lease "leader" delivers (no claims); the others wait and take over when it
    /// stops (at once) or dies (after lease_ttl).
    bool standby = false;
    std::chrono::milliseconds lease_ttl{15000};
    std::chrono::milliseconds lease_renew{5000};  ///< at most 0.4 × lease_ttl
  } relay;
  struct Groups {
    /// Active mode with [[routes]]: events with a message group are delivered per key in order,
    /// their partitions leased over the live relays. False leaves them in the table.
    bool enabled = true;
    bool configured = false;  ///< a [groups] table was given
    int max_concurrent_groups = 64;
    int per_group = 10;  ///< events claimed behind a due group head
  } groups;
  struct Purge {
    bool enabled = false;
    /// Also NEW and RETRY rows of database.table (by age): for tables only subscriptions read,
    /// where nothing marks rows DONE. Refused when a route takes database.table; no other process
    /// may deliver the table in claim mode.
    bool include_pending = false;
    std::chrono::milliseconds retention{std::chrono::hours(24 * 7)};
    std::chrono::milliseconds interval{std::chrono::hours(1)};
  } purge;
  struct Admin {
    bool enabled = true;
    std::string host = "127.0.0.1";
    int port = 9090;  ///< 0: any free port
    /// Bearer token for /api/*; absent: reads open, POSTs refused. An empty value is an error.
    std::string token;
    /// The dashboard shows the oldest pending event's age in red from this age on.
    std::chrono::milliseconds alert_oldest_pending{std::chrono::minutes(5)};
  } admin;
  struct Stream {
    /// A subscription whose first unread event is older than this is reported as lagging (and,
    /// with fail_lagging, FAILED and released: it stops keeping its unread rows from purge). 0:
    /// never.
    std::chrono::milliseconds max_lag_retention{0};
    bool fail_lagging = false;
  } stream;
  std::vector<PublisherConfig> publishers;
  std::vector<RouteConfig> routes;                ///< claim mode; may be empty with subscriptions
  std::vector<SubscriptionConfig> subscriptions;  ///< stream mode
};

/// Parses and validates `text`. Every string value (durations too) may be "${VAR}" (or contain it):
/// replaced by the environment variable, an error when unset. Durations are bounded per key.
/// Unknown keys are errors. Throws ConfigError.
RelayConfig parse_config(std::string_view text, const std::string& source = "config");

/// Reads and parses a file. Throws ConfigError (also when the file cannot be read).
RelayConfig load_config(const std::string& path);

/// "250ms", "30s", "5m", "2h", "7d" → milliseconds, at most kMaxDuration (3650d). Throws
/// std::invalid_argument otherwise (the message names the limit).
std::chrono::milliseconds parse_duration(std::string_view text);

/// The largest whole unit that represents `d` exactly: "7d", "90s", "250ms".
std::string format_duration(std::chrono::milliseconds d);

}  // namespace outbox::relay
