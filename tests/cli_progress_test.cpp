// Long `outbox` commands as an operator runs them: a progress bar redrawn in place on a terminal
// (a pseudo-terminal from util-linux's `script`), plain lines when the output is a file, Ctrl-C
// that stops a bulk replay between two events with nothing half-done, and `status --watch`.

#include <gtest/gtest.h>
#include <signal.h>

#include <nlohmann/json.hpp>
#include <sstream>

#include "outbox/detect/detect.hpp"
#include "outbox/sql/connection.hpp"
#include "tests/support/process.hpp"
#include "tests/support/relay_cli.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using testing::read_file;
using testing::run_cli;

class CliProgress : public testing::MigratedSqlite {
 protected:
  // `n` rows of `status` written as another client would (one INSERT … SELECT).
  void seed(int n, EventStatus status) {
    pool->acquire()->execute(
        "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < " +
        std::to_string(n) +
        ") INSERT INTO outbox_event (event_id, event_type, aggregate_type, payload, status, "
        "attempts, available_at, created_at, done_at, last_error) SELECT 'e' || i, 'T', 'A', "
        "'{}', " +
        std::to_string(static_cast<int>(status)) + ", 1, 0, 0, 0, 'HTTP 500: item ' || i FROM n");
  }
  std::int64_t count(EventStatus status) {
    return store->count_by_status(*pool->acquire())[static_cast<std::size_t>(status)];
  }
  // Runs `outbox args` on a pseudo-terminal: what the terminal received.
  std::string on_terminal(const std::string& args) {
    const auto out = dir.file("tty.out");
    const auto code = std::system(
        ("script -qfec \"'" OUTBOX_CLI_PATH "' " + args + "\" /dev/null > '" + out + "' 2>&1")
            .c_str());
    EXPECT_EQ(code, 0);
    return read_file(out);
  }
  // Starts `outbox args` in the background, its output in <name>.out and <name>.err (no
  // terminal).
  pid_t start(const std::string& args, const std::string& name = "bg") {
    return testing::spawn({"/bin/sh", "-c",
                           "exec '" OUTBOX_CLI_PATH "' " + args + " >'" + dir.file(name + ".out") +
                               "' 2>'" + dir.file(name + ".err") + "'"});
  }
};

TEST_F(CliProgress, PurgeDrawsABarOnATerminalAndPlainLinesInAFile) {
  seed(5000, EventStatus::Done);
  const auto tty = on_terminal("purge --older-than 1d --db " + url);
  EXPECT_NE(tty.find("\r\x1b[2Kpurge  5,000"), std::string::npos) << tty;
  EXPECT_NE(tty.find("purged 5000"), std::string::npos) << tty;
  seed(3000, EventStatus::Done);
  const auto file = run_cli(dir, "purge --older-than 1d --db " + url);
  ASSERT_EQ(file.exit_code, 0) << file.err;
  EXPECT_EQ(file.out, "purged 3000\n");
  EXPECT_EQ(file.err.find('\r'), std::string::npos) << file.err;
  EXPECT_EQ(file.err.find("\x1b["), std::string::npos) << file.err;
  EXPECT_NE(file.err.find("purge  3,000"), std::string::npos) << file.err;
  EXPECT_EQ(count(EventStatus::Done), 0);
}

TEST_F(CliProgress, ReplayAllShowsCountsAndAPercentOnATerminal) {
  seed(3000, EventStatus::Dead);
  const auto tty = on_terminal("dead replay-all --db " + url);
  EXPECT_NE(tty.find("replay-all  3,000 / 3,000  [##############################]  100%"),
            std::string::npos)
      << tty;
  EXPECT_EQ(count(EventStatus::New), 3000);
  const auto migrated = run_cli(dir, "migrate --db sqlite://" + dir.file("fresh.db"));
  EXPECT_NE(migrated.err.find("migrate outbox_event  " + std::to_string(kSchemaVersion) + " / " +
                              std::to_string(kSchemaVersion) + "  100%"),
            std::string::npos)
      << migrated.err;
}

// Ctrl-C in the middle of a bulk replay: it stops between two events, says so, exits 130, and
// every event is either replayed or still DEAD (the count it prints is the database's).
TEST_F(CliProgress, CtrlCStopsABulkReplayBetweenTwoEventsWithNothingHalfDone) {
  seed(100000, EventStatus::Dead);
  const pid_t pid = start("dead replay-all --db " + url);
  ASSERT_TRUE(testing::wait_until([&] { return count(EventStatus::New) > 0; }));
  kill(pid, SIGINT);
  EXPECT_EQ(testing::wait_exit(pid, std::chrono::seconds(60)), 130);
  const auto out = read_file(dir.file("bg.out"));
  const auto err = read_file(dir.file("bg.err"));
  EXPECT_NE(err.find("interrupted between two events"), std::string::npos) << err;
  const auto replayed = count(EventStatus::New);
  EXPECT_LT(replayed, 100000) << "the replay ended before the signal: nothing was interrupted";
  EXPECT_EQ(out, "replayed " + std::to_string(replayed) + "\n");
  EXPECT_EQ(replayed + count(EventStatus::Dead), 100000);
  // Run again: the rest.
  const auto rest = run_cli(dir, "dead replay-all --db " + url);
  ASSERT_EQ(rest.exit_code, 0) << rest.err;
  EXPECT_EQ(count(EventStatus::Dead), 0);
}

// What other clients wrote is printed safely: a NUL does not cut the output short, an escape
// sequence does not reach the terminal, bytes that are not UTF-8 do not break the JSON.
TEST_F(CliProgress, RowsWithControlBytesAndInvalidUtf8PrintSafely) {
  pool->acquire()->execute(
      "INSERT INTO outbox_event (event_id, event_type, aggregate_type, payload, status, attempts, "
      "available_at, created_at, done_at, last_error) VALUES "
      "('x1', 'T' || char(0) || 'NUL', 'A', '{}', 3, 1, 0, 0, 0, 'boom'), "
      "('x2', 'Bad' || CAST(X'FF' AS TEXT) || 'Type', 'A', '{}', 3, 1, 0, 0, 0, "
      "'title ' || char(27) || ']0;PWNED' || char(7) || char(27) || '[2J'), "
      "('x3', 'Last', 'A', '{}', 3, 1, 0, 0, 0, 'the last group')");
  const auto groups = run_cli(dir, "dead groups --db " + url);
  ASSERT_EQ(groups.exit_code, 0) << groups.err;
  EXPECT_EQ(groups.out.find('\x1b'), std::string::npos) << groups.out;
  EXPECT_EQ(groups.out.find('\0'), std::string::npos);
  EXPECT_NE(groups.out.find("Last"), std::string::npos) << groups.out;  // not cut at the NUL
  EXPECT_NE(groups.out.find("title ?]N;PWNED??[2J"), std::string::npos) << groups.out;
  const auto status = run_cli(dir, "status --db " + url);
  EXPECT_EQ(status.out.find('\x1b'), std::string::npos);
  EXPECT_NE(status.out.find("Last"), std::string::npos) << status.out;
  // JSON: parsed strictly (nlohmann refuses invalid UTF-8).
  for (const auto& args : {"status --json", "dead groups --json", "dead list --json"}) {
    const auto r = run_cli(dir, std::string(args) + " --db " + url);
    ASSERT_EQ(r.exit_code, 0) << args << ": " << r.err;
    EXPECT_NO_THROW({
      const auto parsed = nlohmann::json::parse(r.out);
      EXPECT_FALSE(parsed.is_null());
    }) << args
       << ": " << r.out;
  }
}

// A watch whose reader went away (`| head`) stops instead of polling forever.
TEST_F(CliProgress, StatusWatchStopsWhenItsReaderGoesAway) {
  const pid_t pid = testing::spawn({"/bin/sh", "-c",
                                    "'" OUTBOX_CLI_PATH "' status --watch --interval 100ms --db " +
                                        url + " 2>/dev/null | head -c 10 >/dev/null"});
  EXPECT_TRUE(testing::wait_exit(pid, std::chrono::seconds(30)).has_value());
}

// A rewind (one statement) shows how long it has been running, and the cursor moved.
TEST_F(CliProgress, ARewindShowsItsElapsedTime) {
  ASSERT_EQ(run_cli(dir, "subscriptions add audit --publisher dev --db " + url).exit_code, 0);
  const auto r = run_cli(dir, "subscriptions rewind audit --to end --db " + url);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("rewind audit  "), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("subscription audit: ACTIVE, cursor"), std::string::npos) << r.out;
}

TEST_F(CliProgress, StatusWatchRefreshesUntilCtrlC) {
  seed(10, EventStatus::Dead);
  const pid_t pid = start("status --watch --interval 200ms --db " + url);
  const auto frames = [&] {
    const auto out = read_file(dir.file("bg.out"));
    std::size_t n = 0;
    for (auto at = out.find("(every 200ms"); at != std::string::npos;
         at = out.find("(every 200ms", at + 1)) {
      ++n;
    }
    return n;
  };
  ASSERT_TRUE(testing::wait_until([&] { return frames() >= 2; }));
  pool->acquire()->execute("UPDATE outbox_event SET status = 1 WHERE event_id = 'e1'");
  const auto seen = frames();
  ASSERT_TRUE(testing::wait_until([&] { return frames() > seen + 1; }));
  kill(pid, SIGINT);
  EXPECT_EQ(testing::wait_exit(pid, std::chrono::seconds(10)), 0);
  const auto out = read_file(dir.file("bg.out"));
  EXPECT_NE(out.find("delivered/s"), std::string::npos) << out;
  EXPECT_NE(out.find("dead   10\n"), std::string::npos) << out;
  EXPECT_NE(out.find("dead   9\n"), std::string::npos) << out;
  EXPECT_EQ(out.find("\x1b["), std::string::npos);  // not a terminal: frames one after another
  // On a terminal each frame clears the screen; with --json every line is one report.
  const pid_t json = start("status --watch --json --interval 200ms --db " + url, "json");
  ASSERT_TRUE(testing::wait_until([&] {
    const auto text = read_file(dir.file("json.out"));
    return std::count(text.begin(), text.end(), '\n') >= 2;
  }));
  kill(json, SIGINT);
  EXPECT_EQ(testing::wait_exit(json, std::chrono::seconds(10)), 0);
  std::istringstream lines(read_file(dir.file("json.out")));
  for (std::string line; std::getline(lines, line);) {
    EXPECT_EQ(nlohmann::json::parse(line).at("dead"), 9);
  }
  // (timeout ends it with Ctrl-C's signal after a second; its own status is the command's.)
  const auto out_tty = dir.file("watch.tty");
  ASSERT_EQ(std::system(("script -qfec \"timeout --preserve-status -s INT 1 '" OUTBOX_CLI_PATH
                         "' status --watch --interval 100ms --db " +
                         url + "\" /dev/null > '" + out_tty + "' 2>&1")
                            .c_str()),
            0);
  const auto tty = read_file(out_tty);
  EXPECT_NE(tty.find("\x1b[H\x1b[2J"), std::string::npos) << tty;
}

}  // namespace
}  // namespace outbox
