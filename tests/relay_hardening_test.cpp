// The `outbox` command under hostile input and a hostile environment: durations that would wrap,
// ids that try to leave their URL path, empty secrets, receivers that answer "retry now",
// replays racing a running relay, signals and closed pipes, missing files.

#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>
#include <regex>

#include "outbox/detect/detect.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/relay_cli.hpp"
#include "tests/support/tarpit.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::MigratedSqlite;
using testing::RelayProcess;
using testing::run_cli;
using testing::wait_until;

EventEnvelope event(const std::string& type, const std::string& aggregate_id) {
  return EventEnvelope::builder(EventType::of(type))
      .aggregate_type(AggregateType::of("Customer"))
      .aggregate_id(aggregate_id)
      .payload_json("{}")
      .build();
}

class RelayHardening : public MigratedSqlite {
 protected:
  std::string config(const std::string& rest) const {
    return "[database]\nurl = \"" + url + "\"\n" + rest;
  }
  // A webhook relay; `extra` adds tables before the publisher, `publisher` keys to it.
  std::string webhook_config(const std::string& target, const std::string& extra = "",
                             const std::string& publisher = "") const {
    return config("[poller]\ninterval = \"100ms\"\n[admin]\nenabled = false\n" + extra +
                  "[publishers.hooks]\ntype = \"http\"\n" + publisher +
                  "[[routes]]\npublisher = \"hooks\"\ntarget = \"" + target + "\"\n");
  }
  std::optional<OutboxEvent> row(const std::string& id) {
    return store->find(*pool->acquire(), id);
  }
  std::int64_t count(int status) { return store->count_by_status(*pool->acquire())[status]; }
};

TEST_F(RelayHardening, DurationsThatWouldWrapAreRefusedAndPurgeNothing) {
  std::vector<EventEnvelope> events = {event("A", "1"), event("A", "2")};
  store->insert_batch(*pool->acquire(), events);
  store->mark_done_batch(*pool->acquire(), {events[0].event_id(), events[1].event_id()},
                         Clock::system()->now() - std::chrono::hours(24 * 8));
  // 999999d once wrapped the clock and purged every DONE and DEAD row.
  auto wrapped = run_cli(dir, "purge --older-than 999999d --db " + url);
  EXPECT_EQ(wrapped.exit_code, 2);
  EXPECT_NE(wrapped.err.find("at most 3650d"), std::string::npos) << wrapped.err;
  EXPECT_EQ(count(1), 2);
  auto longest = run_cli(dir, "purge --older-than 3650d --db " + url);
  EXPECT_EQ(longest.out, "purged 0\n") << longest.err;

  std::ofstream(dir.file("wrap.toml")) << config(
      "[purge]\nenabled = true\nretention = \"999999d\"\n[publishers.p]\ntype = \"log\"\n"
      "[[routes]]\npublisher = \"p\"\n");
  auto relay = run_cli(dir, "relay -c " + dir.file("wrap.toml"));
  EXPECT_EQ(relay.exit_code, 2);
  EXPECT_NE(relay.err.find("purge.retention"), std::string::npos) << relay.err;
  EXPECT_NE(relay.err.find("at most 3650d"), std::string::npos) << relay.err;
  EXPECT_EQ(count(1), 2);
}

TEST_F(RelayHardening, WebhookTargetsKeepIdsInsideTheirPathSegment) {
  testing::HttpTestServer http;
  const auto attack = event("CustomerChanged", "../../admin/delete-all?confirm=yes#");
  const auto dots = event("CustomerChanged", "..");
  store->insert_batch(*pool->acquire(), {attack, dots});
  RelayProcess relay(dir, webhook_config(http.url("/customers/{aggregate_id}/events")));
  ASSERT_TRUE(wait_until([&] { return count(1) == 1 && count(3) == 1; })) << relay.log();
  const auto received = http.received();
  ASSERT_EQ(received.size(), 1u);
  EXPECT_EQ(received[0].target,
            "/customers/..%2F..%2Fadmin%2Fdelete-all%3Fconfirm%3Dyes%23/events");
  EXPECT_EQ(received[0].header("X-Outbox-Event-Id"), attack.event_id());
  // ".." cannot be placed at all: refused, never sent to the parent path.
  const auto refused = row(dots.event_id());
  EXPECT_EQ(refused->status, EventStatus::Dead);
  EXPECT_NE(refused->last_error->find("target:"), std::string::npos) << *refused->last_error;
  EXPECT_EQ(relay.terminate(), 0);
}

TEST_F(RelayHardening, AnEmptyAdminTokenIsAConfigurationError) {
  setenv("OUTBOX_TEST_EMPTY_TOKEN", "", 1);
  std::ofstream(dir.file("token.toml")) << config(
      "[admin]\nport = 0\ntoken = \"${OUTBOX_TEST_EMPTY_TOKEN}\"\n[publishers.p]\n"
      "type = \"log\"\n[[routes]]\npublisher = \"p\"\n");
  auto relay = run_cli(dir, "relay -c " + dir.file("token.toml"));
  unsetenv("OUTBOX_TEST_EMPTY_TOKEN");
  EXPECT_EQ(relay.exit_code, 2);
  EXPECT_NE(relay.err.find("admin.token is empty"), std::string::npos) << relay.err;
}

TEST_F(RelayHardening, NoTokenOnAnOpenAddressIsWarnedAbout) {
  RelayProcess relay(dir, config("[admin]\nhost = \"0.0.0.0\"\nport = 0\n[publishers.p]\n"
                                 "type = \"log\"\npath = \"" +
                                 dir.file("events.jsonl") + "\"\n[[routes]]\npublisher = \"p\"\n"));
  ASSERT_TRUE(wait_until([&] { return relay.log().find("relay started") != std::string::npos; }))
      << relay.log();
  EXPECT_NE(relay.log().find("admin.token is not set"), std::string::npos) << relay.log();
  EXPECT_EQ(relay.terminate(), 0);
}

TEST_F(RelayHardening, RetryAfterZeroBacksOffAndCountsAttemptsUntilDead) {
  testing::HttpTestServer http;
  http.respond([](const testing::ReceivedRequest&, httplib::Response& res) {
    res.status = 503;
    res.set_header("Retry-After", "0");
  });
  const auto e = event("CustomerChanged", "c-1");
  store->insert_batch(*pool->acquire(), {e});
  RelayProcess relay(dir, webhook_config(http.url("/in"),
                                         "[dispatcher]\nmax_attempts = 3\nbackoff_base = \"50ms\"\n"
                                         "backoff_max = \"100ms\"\n"));
  // Once: 16 POSTs in 8 s and never DEAD. Now: three counted attempts, then DEAD.
  ASSERT_TRUE(wait_until([&] { return row(e.event_id())->status == EventStatus::Dead; }))
      << relay.log();
  EXPECT_EQ(row(e.event_id())->attempts, 3);
  EXPECT_EQ(http.count(), 3u);
  EXPECT_EQ(relay.terminate(), 0);
}

TEST_F(RelayHardening, ReplayAllReplaysEachEventOnceWhileTheRelaySendsThemDeadAgain) {
  testing::HttpTestServer http;
  http.respond([](const testing::ReceivedRequest&, httplib::Response& res) {
    res.status = 400;
    res.set_content("no", "text/plain");
  });
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 20; ++i) {
    events.push_back(event("CustomerChanged", "c-" + std::to_string(i)));
  }
  store->insert_batch(*pool->acquire(), events);
  RelayProcess relay(dir, webhook_config(http.url("/in")));
  ASSERT_TRUE(wait_until([&] { return count(3) == 20; })) << relay.log();
  auto replay = run_cli(dir, "dead replay-all --db " + url);
  EXPECT_EQ(replay.exit_code, 0) << replay.err;
  EXPECT_NE(replay.out.find("replayed 20"), std::string::npos) << replay.out;
  // Each event: its first POST and exactly one more after the replay (once ~50 each).
  ASSERT_TRUE(wait_until([&] { return count(3) == 20 && http.count() == 40; }))
      << http.count() << "\n"
      << relay.log();
  EXPECT_EQ(relay.terminate(), 0);
  EXPECT_EQ(http.count(), 40u);
}

TEST_F(RelayHardening, SighupDrainsAndExitsLikeSigterm) {
  RelayProcess relay(dir, config("[poller]\ninterval = \"100ms\"\n[admin]\nenabled = false\n"
                                 "[publishers.p]\ntype = \"log\"\npath = \"" +
                                 dir.file("events.jsonl") + "\"\n[[routes]]\npublisher = \"p\"\n"));
  const auto e = event("CustomerChanged", "c-1");
  store->insert_batch(*pool->acquire(), {e});
  ASSERT_TRUE(wait_until([&] { return count(1) == 1; })) << relay.log();
  relay.signal_when_started(SIGHUP);
  EXPECT_EQ(relay.wait(), 0);
  EXPECT_NE(relay.log().find("received SIGHUP: draining"), std::string::npos) << relay.log();
  EXPECT_NE(relay.log().find("relay stopped"), std::string::npos) << relay.log();
}

TEST_F(RelayHardening, ASecondSignalEndsADrainThatCannotFinish) {
  testing::HttpTestServer http;
  http.stall();  // a receiver that never answers in time
  const auto e = event("CustomerChanged", "c-1");
  store->insert_batch(*pool->acquire(), {e});
  RelayProcess relay(dir, webhook_config(http.url("/in"), "[dispatcher]\ndrain_timeout = \"1h\"\n",
                                         "request_timeout = \"1h\"\n"));
  ASSERT_TRUE(wait_until([&] { return http.count() == 1; })) << relay.log();
  relay.signal_when_started(SIGTERM);
  ASSERT_TRUE(wait_until([&] { return relay.log().find("draining") != std::string::npos; }));
  kill(relay.pid(), SIGTERM);
  EXPECT_EQ(relay.wait(), 1);
  EXPECT_NE(relay.log().find("again: exiting without draining"), std::string::npos) << relay.log();
}

TEST_F(RelayHardening, DrainTimeoutBoundsAPublishAlreadyInProgress) {
  testing::HttpTestServer http;
  http.stall();
  const auto e = event("CustomerChanged", "c-1");
  store->insert_batch(*pool->acquire(), {e});
  RelayProcess relay(dir, webhook_config(http.url("/in"), "[dispatcher]\ndrain_timeout = \"1s\"\n",
                                         "request_timeout = \"1h\"\n"));
  ASSERT_TRUE(wait_until([&] { return http.count() == 1; })) << relay.log();
  // The default owner has a random part: host-pid alone collided between containers (same host
  // name, both PID 1), which then renewed and marked each other's claims.
  const auto owner = row(e.event_id())->locked_by.value_or("");
  EXPECT_TRUE(std::regex_match(owner, std::regex(".+-[0-9]+-[0-9A-Z]{10}"))) << owner;
  // Once the stop waited for the request's whole hour; now the drain budget cancels it.
  EXPECT_EQ(relay.terminate(), 0);
  EXPECT_NE(relay.log().find("cancelling publishes still in progress"), std::string::npos)
      << relay.log();
  const auto after = row(e.event_id());
  EXPECT_EQ(after->status, EventStatus::Retry);
  EXPECT_EQ(after->attempts, 0);  // the relay stopped; the receiver did not fail
  EXPECT_NE(after->last_error->find("cancelled"), std::string::npos) << *after->last_error;
}

TEST_F(RelayHardening, ASignalWhileStartingEndsTheWaitForTheDatabase) {
  // A database that accepts connections and never answers: starting waits connect_timeout.
  testing::Tarpit tarpit;
  RelayProcess relay(
      dir, "[database]\nurl = \"postgresql://u@127.0.0.1:" + std::to_string(tarpit.port()) +
               "/db\"\nconnect_timeout = \"5m\"\n[admin]\nenabled = false\n"
               "[publishers.p]\ntype = \"log\"\n[[routes]]\npublisher = \"p\"\n");
  ASSERT_TRUE(wait_until([&] { return tarpit.accepted_one(); }));
  // Once the signals were only read after the start: SIGTERM waited out the whole 5 minutes.
  kill(relay.pid(), SIGTERM);
  EXPECT_EQ(relay.wait(), 0);
  EXPECT_NE(relay.log().find("received SIGTERM while starting: exiting"), std::string::npos)
      << relay.log();
}

TEST_F(RelayHardening, AClosedStdoutIsARetriableFailureNotADeath) {
  std::ofstream(dir.file("stdout.toml")) << config(
      "[poller]\ninterval = \"100ms\"\n[admin]\nenabled = false\n[dispatcher]\n"
      "backoff_base = \"1h\"\nbackoff_max = \"1h\"\n[publishers.p]\ntype = \"log\"\n"
      "[[routes]]\npublisher = \"p\"\n");
  const auto e = event("CustomerChanged", "c-1");
  store->insert_batch(*pool->acquire(), {e});
  // stdout is a pipe whose reader is gone: every write fails with EPIPE (once: exit 141).
  int fds[2];
  ASSERT_EQ(pipe(fds), 0);
  const std::string log_path = dir.file("relay.log");
  const pid_t pid = fork();
  if (pid == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/sh", "sh", "-c",
          ("exec '" OUTBOX_CLI_PATH "' relay -c '" + dir.file("stdout.toml") + "' 2>'" + log_path +
           "'")
              .c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[0]);
  close(fds[1]);
  ASSERT_TRUE(wait_until([&] { return row(e.event_id())->status == EventStatus::Retry; }))
      << testing::read_file(log_path);
  EXPECT_NE(row(e.event_id())->last_error->find("Broken pipe"), std::string::npos);
  kill(pid, SIGTERM);
  EXPECT_EQ(testing::wait_exit(pid, 60s), 0) << testing::read_file(log_path);
}

TEST_F(RelayHardening, ReadOnlyCommandsDoNotCreateAMissingSqliteFile) {
  const std::string missing = dir.file("typo.db");
  for (const std::string& command :
       {"status --db sqlite://" + missing, "dead list --db sqlite://" + missing,
        "purge --older-than 7d --db sqlite://" + missing}) {
    auto result = run_cli(dir, command);
    EXPECT_EQ(result.exit_code, 1) << command;
    EXPECT_NE(result.err.find("no database at " + missing), std::string::npos) << result.err;
    EXPECT_FALSE(std::filesystem::exists(missing)) << command;
  }
}

TEST_F(RelayHardening, PasswordsInDatabaseUrlsNeverReachMessages) {
  setenv("OUTBOX_TEST_DB_URL", "mysql://app:Sup3rSecret@db.example:99999/shop", 1);
  auto result = run_cli(dir, "status --db \"$OUTBOX_TEST_DB_URL\"");
  unsetenv("OUTBOX_TEST_DB_URL");
  EXPECT_EQ(result.exit_code, 2);
  EXPECT_NE(result.err.find("bad port"), std::string::npos) << result.err;
  EXPECT_EQ(result.err.find("Sup3rSecret"), std::string::npos) << result.err;
  EXPECT_NE(result.err.find("app:***@db.example"), std::string::npos) << result.err;
}

}  // namespace
}  // namespace outbox
