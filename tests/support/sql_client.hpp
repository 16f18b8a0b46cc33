#pragma once
// A database's own command-line client (sqlite3, psql, mariadb) as a child process: what a
// service in another language does to the outbox table, from outside our code.

#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <string>

#include "tests/support/process.hpp"
#include "tests/support/relay_cli.hpp"

namespace outbox::testing {

/// Runs `sql` as a script through the client of `engine` ("sqlite", "postgres", "mysql") against
/// `url`; its exit code and output.
inline CommandResult run_sql_client(const TempDir& dir, const std::string& engine,
                                    const std::string& url, const std::string& sql) {
  const auto script = dir.file("client.sql");
  std::ofstream(script) << sql;
  std::string command;
  if (engine == "sqlite") {
    // As every writer beside a relay should: wait for the write lock instead of failing at once.
    command = "sqlite3 -bail -cmd '.timeout 10000' '" +
              url.substr(std::string("sqlite://").size()) + "' < '" + script + "'";
  } else if (engine == "postgres") {
    command = "psql -X -q -v ON_ERROR_STOP=1 '" + url + "' -f '" + script + "'";
  } else {
    static const std::regex kUrl("mysql://([^:@]+)(?::([^@]*))?@([^:/]+):([0-9]+)/(.+)");
    std::smatch m;
    EXPECT_TRUE(std::regex_match(url, m, kUrl)) << url;
    command = "mariadb --protocol=tcp -h " + std::string(m[3]) + " -P " + std::string(m[4]) +
              " -u " + std::string(m[1]) +
              (m[2].matched ? " -p'" + std::string(m[2]) + "'" : std::string()) + " " +
              std::string(m[5]) + " < '" + script + "'";
  }
  const auto out = dir.file("client.out"), err = dir.file("client.err");
  const pid_t pid = spawn({"/bin/sh", "-c", command + " >'" + out + "' 2>'" + err + "'"});
  const auto code = wait_exit(pid, std::chrono::seconds(60));
  return {code.value_or(-1), read_file(out), read_file(err)};
}

}  // namespace outbox::testing
