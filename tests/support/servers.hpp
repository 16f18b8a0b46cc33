#pragma once
// Where the throwaway servers started by scripts/with-test-servers are. Without them, server tests
// skip — unless OUTBOX_REQUIRE_SERVERS=1 (set by scripts/test), which turns a skip into a failure.

#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <optional>
#include <string>

#include <unistd.h>

namespace outbox::testing {

inline std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr || *v == '\0') {
    return std::nullopt;
  }
  return std::string(v);
}

inline bool servers_required() {
  return env("OUTBOX_REQUIRE_SERVERS").value_or("") == "1";
}

/// The URL of the throwaway server for `engine` ("postgres" or "mysql"); nullopt when unset.
inline std::optional<std::string> server_url(const std::string& engine) {
  return env(engine == "postgres" ? "OUTBOX_TEST_PG_URL" : "OUTBOX_TEST_MYSQL_URL");
}

/// A table name no other test process uses.
inline std::string unique_table(const std::string& prefix) {
  static std::atomic<int> counter{0};
  return prefix + "_" + std::to_string(getpid()) + "_" + std::to_string(++counter);
}

}  // namespace outbox::testing

/// Every skip for want of something only scripts/with-test-servers provides (a server's URL, its
/// control command) starts with this phrase, and no other skip does: tests/CMakeLists.txt reports a
/// ctest test skipped when its output holds it (SKIP_REGULAR_EXPRESSION; keep the two in step). A
/// case that skips itself because it does not apply to an engine ("not on SQLite: ...") leaves its
/// ctest test passing.
#define OUTBOX_NO_TEST_SERVER "no test server: "

/// Skips the current test for want of a test server; stream the reason after it.
#define OUTBOX_SKIP_NO_SERVER() GTEST_SKIP() << OUTBOX_NO_TEST_SERVER

/// Skips (or fails, when servers are required) the current test if `url` is empty.
#define OUTBOX_REQUIRE_SERVER(url, name)                                                        \
  do {                                                                                          \
    if (!(url)) {                                                                               \
      if (::outbox::testing::servers_required()) {                                              \
        FAIL() << (name) << " is required but its URL variable is not set";                     \
      }                                                                                         \
      OUTBOX_SKIP_NO_SERVER() << (name) << " is not available (see scripts/with-test-servers)"; \
    }                                                                                           \
  } while (0)
