#pragma once
// The `outbox` command as a child process: one-shot commands, a relay process, a migrated SQLite
// file. Needs OUTBOX_CLI_PATH defined to the built command.

#include <gtest/gtest.h>
#include <signal.h>

#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "outbox/detect/detect.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/process.hpp"
#include "tests/support/servers.hpp"
#include "tests/support/tables.hpp"
#include "tests/support/test_support.hpp"

namespace outbox::testing {

inline std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

struct CommandResult {
  int exit_code;
  std::string out, err;
};

// Runs `outbox args…` to completion, capturing its output.
inline CommandResult run_cli(const TempDir& dir, const std::string& args) {
  const auto out = dir.file("cli.out"), err = dir.file("cli.err");
  const pid_t pid = spawn(
      {"/bin/sh", "-c", "exec '" OUTBOX_CLI_PATH "' " + args + " >'" + out + "' 2>'" + err + "'"});
  const auto code = wait_exit(pid, std::chrono::seconds(60));
  return {code.value_or(-1), read_file(out), read_file(err)};
}

// A relay process; killed if the test ends without stopping it. `name` names its files, so
// several relays can share a directory; `environment` is "NAME=value ..." for the relay only
// (the relay is exec'ed, so its pid is the child's and a kill reaches it).
class RelayProcess {
 public:
  RelayProcess(const TempDir& dir, const std::string& config, const std::string& name = "relay",
               const std::string& environment = "")
      : log_(dir.file(name + ".log")) {
    const auto path = dir.file(name + ".toml");
    std::ofstream(path) << config;
    pid_ = spawn(
        {"/bin/sh", "-c",
         environment + " exec '" OUTBOX_CLI_PATH "' relay -c '" + path + "' 2>'" + log_ + "'"});
  }
  ~RelayProcess() {
    if (pid_ > 0) {
      kill_hard(pid_);
    }
  }
  // The admin port from the start-up line (admin.port = 0 picks a free one).
  int admin_port() {
    static const std::regex kLine("admin on 127\\.0\\.0\\.1:([0-9]+)");
    std::smatch m;
    std::string log;
    EXPECT_TRUE(wait_until([&] {
      log = read_file(log_);
      return std::regex_search(log, m, kLine);
    })) << log;
    return m.empty() ? 0 : std::stoi(m[1]);
  }
  // Once started (signals are handled from then on): SIGTERM, then the exit code (nullopt if it
  // did not exit in time).
  std::optional<int> terminate() {
    EXPECT_TRUE(wait_until([&] { return log().find("relay started") != std::string::npos; }));
    kill(pid_, SIGTERM);
    auto code = wait_exit(pid_, std::chrono::seconds(60));
    pid_ = -1;
    return code;
  }
  std::string log() const { return read_file(log_); }
  // Waits until the relay has started (signals are handled from then on), then sends `sig`.
  void signal_when_started(int sig) {
    EXPECT_TRUE(wait_until([&] { return log().find("relay started") != std::string::npos; }));
    kill(pid_, sig);
  }
  pid_t pid() const { return pid_; }
  // Waits for an exit already asked for; the exit code (nullopt if not in time).
  std::optional<int> wait() {
    auto code = wait_exit(pid_, std::chrono::seconds(60));
    pid_ = -1;
    return code;
  }

 private:
  std::string log_;
  pid_t pid_ = -1;
};

// A database for relay processes per engine parameter ("sqlite", "postgres", "mysql"): the
// throwaway server (a SQLite file otherwise), and outbox tables migrated by the CLI, dropped with
// their side tables after the test. A derived SetUp calls this one first and returns when it
// skipped.
class RelayDatabaseTest : public ::testing::TestWithParam<std::string> {
 protected:
  // Skips (or fails, when servers are required) without the engine's server.
  void SetUp() override {
    if (GetParam() == "sqlite") {
      url_ = "sqlite://" + dir_.file("relay.db");
      return;
    }
    auto url = server_url(GetParam());
    OUTBOX_REQUIRE_SERVER(url, display_name(GetParam()));
    url_ = *url;
  }
  void TearDown() override {
    if (GetParam() != "sqlite" && !url_.empty() && !migrated_.empty()) {
      auto pool = open_pool(url_, 1);
      for (const auto& table : migrated_) {
        drop_outbox_tables(*pool->acquire(), table);
      }
    }
  }
  // Runs `outbox migrate` for a table and returns its name: `sqlite_name` in the SQLite file, a
  // name of its own ("<prefix>_<pid>_<n>") on a server. `result` receives the command's output.
  std::string migrate_table(const std::string& prefix,
                            const std::string& sqlite_name = "outbox_event",
                            CommandResult* result = nullptr) {
    const auto table = GetParam() == "sqlite" ? sqlite_name : unique_table(prefix);
    auto migrated = run_cli(dir_, "migrate --db '" + url_ + "' --table " + table);
    EXPECT_EQ(migrated.exit_code, 0) << migrated.err;
    migrated_.push_back(table);
    if (result != nullptr) {
      *result = std::move(migrated);
    }
    return table;
  }
  bool skipped_or_failed() const { return IsSkipped() || HasFatalFailure(); }

  TempDir dir_;
  std::string url_;

 private:
  std::vector<std::string> migrated_;
};

// A SQLite file migrated by the CLI, for the tests that need only one engine.
class MigratedSqlite : public ::testing::Test {
 protected:
  void SetUp() override {
    url = "sqlite://" + dir.file("relay.db");
    ASSERT_EQ(run_cli(dir, "migrate --db " + url).exit_code, 0);
    pool = open_pool(url, 1);
    store = detect_store(*pool->acquire());
  }

  TempDir dir;
  std::string url;
  std::shared_ptr<sql::ConnectionPool> pool;
  std::shared_ptr<OutboxStore> store;
};

}  // namespace outbox::testing
