// The `outbox` command: relay, migrate, status, dead-event handling, purge, subscriptions,
// message groups.

#include <pthread.h>
#include <signal.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <unistd.h>
#include <CLI/CLI.hpp>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iostream>
#include <memory>
#include <thread>

#include "db_options.hpp"
#include "dead_commands.hpp"
#include "group_commands.hpp"
#include "outbox/clock.hpp"
#include "outbox/detect/detect.hpp"
#include "outbox/errors.hpp"
#include "outbox/log.hpp"
#include "outbox/purge.hpp"
#include "outbox/relay/config.hpp"
#include "outbox/relay/debezium_config.hpp"
#include "outbox/relay/operations.hpp"
#include "outbox/relay/relay.hpp"
#include "progress.hpp"
#include "stream_commands.hpp"
#include "terminal_text.hpp"

namespace {

using namespace outbox;
using cli::add_db_options;
using cli::DbOptions;

// Exit codes: 0 done, 1 runtime failure (database, network; a relay stopped by a second
// signal), 2 bad input (usage, configuration).
constexpr int kFailure = 1;
constexpr int kBadInput = 2;

void install_logging(const std::string& level) {
  auto logger = spdlog::stderr_color_mt("outbox");
  logger->set_pattern("%Y-%m-%dT%H:%M:%S.%e %^%l%$ %v");
  static const std::map<std::string, std::pair<LogLevel, spdlog::level::level_enum>> kLevels = {
      {"debug", {LogLevel::Debug, spdlog::level::debug}},
      {"info", {LogLevel::Info, spdlog::level::info}},
      {"warning", {LogLevel::Warning, spdlog::level::warn}},
      {"error", {LogLevel::Error, spdlog::level::err}}};
  const auto& [ours, theirs] = kLevels.at(level);
  logger->set_level(theirs);
  set_log_level(ours);
  set_log_sink([logger](LogLevel l, std::string_view message) {
    switch (l) {
      case LogLevel::Debug:
        logger->debug(message);
        break;
      case LogLevel::Info:
        logger->info(message);
        break;
      case LogLevel::Warning:
        logger->warn(message);
        break;
      case LogLevel::Error:
        logger->error(message);
        break;
    }
  });
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT:
      return "SIGINT";
    case SIGTERM:
      return "SIGTERM";
    case SIGHUP:
      return "SIGHUP";
    default:
      return "a signal";
  }
}

// SIGINT, SIGTERM and SIGHUP: the relay's stop signals (SIGHUP, a closed terminal or a
// supervisor's reload, stops gracefully too, never abruptly).
sigset_t stop_signal_set() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGHUP);
  return set;
}

// Runs with the stop signals blocked since main began, so only the waits below receive them.
int run_relay(const std::string& config_path) {
  sigset_t stop_signals = stop_signal_set();

  const timespec poll_period{0, 50'000'000};
  // Starting may wait for a database up to database.connect_timeout: it runs beside the signal
  // wait, so a stop asked for meanwhile ends the process at once (nothing is claimed yet).
  std::unique_ptr<relay::Relay> started;
  std::exception_ptr start_failure;
  std::atomic<bool> start_done{false};
  std::thread starter([&] {
    try {
      auto r = std::make_unique<relay::Relay>(relay::load_config(config_path));
      r->start();
      started = std::move(r);
    } catch (...) {
      start_failure = std::current_exception();
    }
    start_done = true;
  });
  int received = 0;
  while (!start_done) {
    const int sig = sigtimedwait(&stop_signals, nullptr, &poll_period);
    if (sig > 0 && !start_done) {
      log(LogLevel::Info, std::string("received ") + signal_name(sig) + " while starting: exiting");
      std::fflush(nullptr);
      std::_Exit(0);
    }
    if (sig > 0) {
      received = sig;  // the relay started meanwhile: stop it like any other
    }
  }
  starter.join();
  if (start_failure) {
    std::rethrow_exception(start_failure);
  }
  relay::Relay& relay = *started;
  if (received == 0) {
    sigwait(&stop_signals, &received);
  }
  log(LogLevel::Info, std::string("received ") + signal_name(received) +
                          ": draining (a second signal exits at once)");
  std::atomic<bool> stopped{false};
  std::thread stopper([&] {
    relay.stop();
    stopped = true;
  });
  // The drain may hang on an unreachable database or broker: a second signal ends the process.
  while (!stopped) {
    const int again = sigtimedwait(&stop_signals, nullptr, &poll_period);
    if (again > 0) {
      log(LogLevel::Error, std::string("received ") + signal_name(again) +
                               " again: exiting without draining (claimed events are "
                               "delivered again after poller.lock_expiry)");
      std::fflush(nullptr);
      std::_Exit(kFailure);
    }
  }
  stopper.join();
  return 0;
}

// `outbox status --watch`: the report again every `interval` until Ctrl-C, with what changed per
// second; redrawn in place on a terminal, one frame after another otherwise (JSON: one per line).
int watch_status(const std::string& table, const std::function<relay::StatusReport()>& read,
                 std::chrono::milliseconds interval, bool json) {
  if (interval < std::chrono::milliseconds(100)) {
    throw std::invalid_argument("--interval must be at least 100ms");
  }
  cli::InterruptGuard guard;
  const bool tty = isatty(STDOUT_FILENO) == 1;
  std::optional<relay::StatusReport> previous;
  auto previous_at = std::chrono::steady_clock::now();
  while (!cli::InterruptGuard::requested()) {
    const auto report = read();
    const auto now = std::chrono::steady_clock::now();
    if (json) {
      std::printf("%s\n", relay::to_json(report).c_str());
    } else {
      std::string rates = "delivered/s –   dead/s –";
      if (previous) {
        const double s = std::max(0.001, std::chrono::duration<double>(now - previous_at).count());
        char line[128];
        std::snprintf(line, sizeof line, "delivered/s %.1f   dead/s %.1f",
                      std::max<double>(0, static_cast<double>(report.done - previous->done)) / s,
                      std::max<double>(0, static_cast<double>(report.dead - previous->dead)) / s);
        rates = line;
      }
      std::printf("%s%s  %s  (every %s; Ctrl-C to quit)\n%s\n%s%s", tty ? "\x1b[H\x1b[2J" : "",
                  table.c_str(), format_rfc3339(Clock::system()->now()).c_str(),
                  relay::format_duration(interval).c_str(), rates.c_str(),
                  cli::for_terminal(relay::to_text(report)).c_str(), tty ? "" : "\n");
    }
    if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
      // The reader went away (`| head`, a closed terminal): SIGPIPE is ignored, so say so and stop.
      std::fprintf(stderr, "outbox: cannot write the status any more: %s\n", std::strerror(errno));
      return kFailure;
    }
    previous = report;
    previous_at = now;
    for (auto until = now + interval;
         std::chrono::steady_clock::now() < until && !cli::InterruptGuard::requested();) {
      // The wait's tick: Ctrl-C is answered within it.
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  // A closed pipe (stdout of the log publisher, a client gone) is an error to handle where it
  // happens (EPIPE, retried), not a reason to die without draining.
  std::signal(SIGPIPE, SIG_IGN);
  // Blocked from the first moment (a stop asked for while the command line is read must reach
  // the relay's wait, not kill it); the other commands unblock them after parsing.
  const sigset_t stop_signals = stop_signal_set();
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  CLI::App app{"outbox: transactional-outbox relay and operator tools"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "debug, info, warning or error")
      ->check(CLI::IsMember({"debug", "info", "warning", "error"}))
      ->capture_default_str();

  std::string config_path;
  auto* relay_cmd =
      app.add_subcommand("relay", "run the relay until SIGTERM, SIGINT or SIGHUP, then drain");
  relay_cmd->add_option("--config,-c", config_path, "relay configuration file (TOML)")->required();

  DbOptions migrate_db;
  auto* migrate_cmd = app.add_subcommand("migrate", "create or upgrade the outbox schema");
  add_db_options(*migrate_cmd, migrate_db);

  DbOptions status_db;
  bool status_json = false;
  auto* status_cmd =
      app.add_subcommand("status", "counts by status, oldest pending age, dead events by type");
  add_db_options(*status_cmd, status_db);
  status_cmd->add_flag("--json", status_json, "print JSON (with --watch: one object per line)");
  bool status_watch = false;
  std::string status_interval = "1s";
  status_cmd->add_flag("--watch", status_watch,
                       "refresh until Ctrl-C, with delivered and DEAD per second");
  status_cmd->add_option("--interval", status_interval, "how often --watch refreshes")
      ->capture_default_str();

  DbOptions purge_db;
  std::string older_than;
  auto* purge_cmd =
      app.add_subcommand("purge", "delete DONE and DEAD events older than a duration");
  add_db_options(*purge_cmd, purge_db);
  purge_cmd->add_option("--older-than", older_than, "e.g. 7d, 12h, 30m")->required();

  std::string dbz_config, dbz_url, dbz_table;
  auto* dbz_cmd = app.add_subcommand(
      "debezium-config",
      "print the Debezium connector (outbox event router) that delivers a table as the relay's "
      "routes would");
  dbz_cmd->add_option("--config,-c", dbz_config,
                      "relay configuration file (TOML) whose routes it follows (default: every "
                      "event to outbox.event.<aggregate type>)");
  dbz_cmd->add_option("--db", dbz_url, "database URL (default: the configuration's database.url)");
  dbz_cmd->add_option("--table", dbz_table, "outbox table (default: database.table)");

  cli::StreamCommands stream_commands(app);
  cli::GroupCommands group_commands(app);
  cli::DeadCommands dead_commands(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  install_logging(log_level);
  if (!relay_cmd->parsed()) {
    pthread_sigmask(SIG_UNBLOCK, &stop_signals, nullptr);
  }

  try {
    if (relay_cmd->parsed()) {
      return run_relay(config_path);
    }
    if (auto code = stream_commands.run()) {
      return *code;
    }
    if (auto code = dead_commands.run()) {
      return *code;
    }
    if (auto code = group_commands.run()) {
      return *code;
    }
    if (migrate_cmd->parsed()) {
      auto pool = open_pool(migrate_db.url, 1);
      auto conn = pool->acquire();
      cli::InterruptGuard guard;
      std::optional<cli::Progress> bar;
      const auto r = migrate(*conn, migrate_db.table, [&](int version, std::string_view what) {
        cli::InterruptGuard::check();  // between steps: the migration stops as a failure would
        if (!bar) {
          bar.emplace("migrate " + migrate_db.table, kSchemaVersion);
        }
        bar->update(version - 1, "v" + std::to_string(version) + ": " + std::string(what));
      });
      if (bar) {
        bar->update(r.to);
        bar->finish();
      }
      if (r.from == r.to) {
        std::printf("%s: already at schema version %d\n", migrate_db.table.c_str(), r.to);
      } else {
        std::printf("%s: schema version %d -> %d\n", migrate_db.table.c_str(), r.from, r.to);
      }
      return 0;
    }
    if (dbz_cmd->parsed()) {
      if (dbz_config.empty() && dbz_url.empty()) {
        throw std::invalid_argument("debezium-config needs --config or --db");
      }
      const auto config = dbz_config.empty()
                              ? relay::debezium_default_config(
                                    dbz_url, dbz_table.empty() ? "outbox_event" : dbz_table)
                              : relay::load_config(dbz_config);
      const auto url = dbz_url.empty() ? config.database.url : dbz_url;
      const auto table = dbz_table.empty() ? config.database.table : dbz_table;
      auto pool = open_pool(url, 1, false);
      const auto source = relay::debezium_source(*pool->acquire(), url, table);
      const auto connector = relay::debezium_connector(config, source);
      std::fputs(connector.json.c_str(), stdout);
      if (dbz_config.empty()) {
        std::fputs("note: no --config: every event goes to outbox.event.<aggregate type>\n",
                   stderr);
      }
      for (const auto& note : connector.notes) {
        std::fprintf(stderr, "note: %s\n", note.c_str());
      }
      return 0;
    }
    if (status_cmd->parsed()) {
      auto pool = open_pool(status_db.url, 1, false);
      auto conn = pool->acquire();
      auto store = detect_store(*conn, status_db.table);
      const auto leases = detect_lease_store(*conn, status_db.table);
      const auto groups = detect_group_store(*conn, status_db.table);
      const auto read = [&] {
        auto report =
            relay::read_status(*conn, *store, Clock::system()->now(), leases.get(), groups.get());
        try {
          const auto stream = detect_stream_store(*conn, status_db.table);
          report.stream = relay::read_stream(*conn, *stream, leases.get());
        } catch (const StoreError&) {
          // A table before schema version 4 has no stream: the rest of the report stands.
        }
        return report;
      };
      if (!status_watch) {
        const auto report = read();
        std::fputs(status_json ? (relay::to_json(report) + "\n").c_str()
                               : cli::for_terminal(relay::to_text(report)).c_str(),
                   stdout);
        return 0;
      }
      return watch_status(status_db.table, read, relay::parse_duration(status_interval),
                          status_json);
    }
    if (purge_cmd->parsed()) {
      const auto age = relay::parse_duration(older_than);
      auto pool = open_pool(purge_db.url, 1, false);
      auto conn = pool->acquire();
      auto purger = detect_purger(*conn, purge_db.table);
      const auto now = Clock::system()->now();
      long total = 0;
      cli::InterruptGuard guard;
      cli::Progress bar("purge", std::nullopt);
      for (;;) {
        if (cli::InterruptGuard::requested()) {
          // Each batch is one statement: what it deleted is complete, the rest untouched.
          bar.finish("interrupted between batches; run it again for the rest");
          std::printf("purged %ld\n", total);
          return cli::kInterruptedExit;
        }
        const int n = purger->purge_older_than(*conn, age, now, 1000);
        total += n;
        bar.update(total);
        if (n < 1000) {
          break;
        }
      }
      bar.finish();
      std::printf("purged %ld\n", total);
      return 0;
    }
  } catch (const cli::Interrupted&) {
    std::fprintf(stderr,
                 "outbox: interrupted; nothing half-done (a migration stopped between steps: "
                 "PostgreSQL and SQLite keep none of it, MariaDB keeps the steps done, which the "
                 "next run repeats harmlessly)\n");
    return cli::kInterruptedExit;
  } catch (const relay::ConfigError& e) {
    std::fprintf(stderr, "outbox: %s\n", e.what());
    return kBadInput;
  } catch (const std::invalid_argument& e) {
    std::fprintf(stderr, "outbox: %s\n", e.what());
    return kBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox: %s\n", e.what());
    return kFailure;
  }
  return kBadInput;
}
