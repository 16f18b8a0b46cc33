#pragma once
// The three engines as a test parameter: a name and where its server is (SQLite needs none).

#include <gtest/gtest.h>

#include <functional>
#include <optional>
#include <ostream>
#include <string>

#include "tests/support/servers.hpp"

namespace outbox::testing {

struct Engine {
  std::string name;
  std::function<std::optional<std::string>()> url;  ///< nullopt: no server to test against
};

inline std::ostream& operator<<(std::ostream& os, const Engine& e) {
  return os << e.name;
}

/// SQLite, PostgreSQL and MariaDB, for INSTANTIATE_TEST_SUITE_P (name the cases with
/// engine_name).
inline auto all_engines() {
  return ::testing::Values(Engine{"sqlite", [] { return std::optional<std::string>(""); }},
                           Engine{"postgres", [] { return env("OUTBOX_TEST_PG_URL"); }},
                           Engine{"mysql", [] { return env("OUTBOX_TEST_MYSQL_URL"); }});
}

inline std::string engine_name(const ::testing::TestParamInfo<Engine>& info) {
  return info.param.name;
}

/// An engine as the documentation names it, for the reasons of cases that skip themselves where
/// they do not apply ("not on SQLite: ...").
inline std::string display_name(const std::string& engine) {
  if (engine == "sqlite") {
    return "SQLite";
  }
  if (engine == "postgres") {
    return "PostgreSQL";
  }
  if (engine == "mysql") {
    return "MariaDB";
  }
  return engine;
}

}  // namespace outbox::testing
