// Failure fingerprints on error texts as the publishers and drivers write them.

#include "outbox/failure_fingerprint.hpp"

#include <gtest/gtest.h>

namespace outbox {
namespace {

TEST(FailureFingerprint, HttpBodiesWithIdsShareOneAndTheStatusSeparatesThem) {
  const auto a = fingerprint_failure(
      "OrderPlaced",
      R"(HTTP 500: {"error":"order 12345 not found","request_id":"7f9c0a2e-1b2c-4d5e-8f90-a1b2c3d4e5f6"})");
  const auto b = fingerprint_failure(
      "OrderPlaced",
      R"(HTTP 500: {"error":"order 987 not found","request_id":"0b1c2d3e-4f50-6172-8394-a5b6c7d8e9f0"})");
  EXPECT_EQ(a.pattern, R"(HTTP 500: {"error":"order N not found","request_id":"<id>"})");
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(a.id.size(), 16U);
  const auto c =
      fingerprint_failure("OrderPlaced", R"(HTTP 404: {"error":"order 12345 not found"})");
  EXPECT_NE(a.id, c.id);
  // The same failure of another event type is another group.
  EXPECT_NE(
      a.id,
      fingerprint_failure(
          "OrderShipped",
          R"(HTTP 500: {"error":"order 12345 not found","request_id":"7f9c0a2e-1b2c-4d5e-8f90-a1b2c3d4e5f6"})")
          .id);
}

TEST(FailureFingerprint, LibrdkafkaErrorsAreKeptAsTheyAre) {
  EXPECT_EQ(normalize_error("Broker: Unknown topic or partition"),
            "Broker: Unknown topic or partition");
  EXPECT_EQ(normalize_error("Local: Message timed out"), "Local: Message timed out");
  EXPECT_EQ(normalize_error("Broker: Message size too large (message of 1048577 bytes)"),
            "Broker: Message size too large (message of N bytes)");
}

TEST(FailureFingerprint, SqlErrorsLoseTheirValuesAndKeepTheirCodes) {
  EXPECT_EQ(normalize_error("mysql error 1062: Duplicate entry 'ord-77' for key 'PRIMARY' "
                            "[SQLSTATE 23000]"),
            "mysql error 1062: Duplicate entry '?' for key '?' [SQLSTATE 23000]");
  // PostgreSQL's DETAIL line (the key's value) is not part of the class.
  const auto a = fingerprint_failure(
      "T",
      "ERROR:  duplicate key value violates unique constraint \"orders_pkey\"\nDETAIL:  Key "
      "(id)=(42) already exists.");
  const auto b = fingerprint_failure(
      "T",
      "ERROR:  duplicate key value violates unique constraint \"orders_pkey\"\nDETAIL:  Key "
      "(id)=(43) already exists.");
  EXPECT_EQ(a.pattern, "ERROR: duplicate key value violates unique constraint \"orders_pkey\"");
  EXPECT_EQ(a.id, b.id);
}

TEST(FailureFingerprint, UlidsHexAndNumbersInProseAreReplaced) {
  EXPECT_EQ(
      normalize_error("event 01M87Z6T64BM7BYNTHVH1K6HTB: target: bad value in {aggregate_id}"),
      "event <id>: target: bad value in {aggregate_id}");
  EXPECT_EQ(normalize_error("checksum deadbeef42 mismatch after 3 tries, 1.5 s"),
            "checksum <id> mismatch after N tries, N s");
  EXPECT_EQ(normalize_error("  spaced \t  out  "), "spaced out");
}

// Codes written other ways stay apart (a replay of the 503s must not take the 400s along), and an
// apostrophe is no quote.
TEST(FailureFingerprint, CodesAfterColonsEqualsAndHttpVersionsAreKept) {
  EXPECT_EQ(normalize_error("upstream status: 400 after 12 ms"), "upstream status: 400 after N ms");
  EXPECT_NE(normalize_error("status: 400"), normalize_error("status: 503"));
  EXPECT_EQ(normalize_error("status=503 retry=7"), "status=503 retry=N");
  EXPECT_NE(normalize_error("connect errno=111"), normalize_error("connect errno=113"));
  EXPECT_EQ(normalize_error("HTTP/1.1 400 Bad Request"), "HTTP/1.1 400 Bad Request");
  EXPECT_NE(normalize_error("HTTP/1.1 400"), normalize_error("HTTP/1.1 503"));
  EXPECT_EQ(normalize_error("couldn't deliver: broker is down, won't retry"),
            "couldn't deliver: broker is down, won't retry");
  EXPECT_NE(normalize_error("couldn't deliver: payload rejected, won't retry"),
            normalize_error("couldn't deliver: broker is down, won't retry"));
  EXPECT_EQ(normalize_error("key 'k1' isn't unique"), "key '?' isn't unique");
}

TEST(FailureFingerprint, AnyInputGivesAPatternAndAStableId) {
  const std::string bytes("\xff\xfe'unterminated \x01\0end", 20);
  const auto a = fingerprint_failure("T", bytes);
  const auto b = fingerprint_failure("T", bytes);
  EXPECT_EQ(a.id, b.id);
  EXPECT_EQ(fingerprint_failure("", "").id.size(), 16U);
  EXPECT_LE(normalize_error(std::string(5000, 'x')).size(), 500U);
}

}  // namespace
}  // namespace outbox
