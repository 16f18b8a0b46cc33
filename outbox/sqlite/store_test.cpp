// SQLite-specific store behaviour; the engine-independent contract is
// tests/store_contract_test.cpp.

#include "outbox/sqlite/store.hpp"

#include <gtest/gtest.h>

#include <sqlite3.h>

#include "outbox/errors.hpp"
#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/internal/wal_checkpointer.hpp"
#include "tests/support/test_support.hpp"

namespace {

std::string plan(outbox::sql::Connection& conn, const std::string& sql) {
  std::string out;
  for (const auto& r : conn.query("EXPLAIN QUERY PLAN " + sql)) {
    out += r.get_text(3) + "\n";
  }
  return out;
}

TEST(SqliteStore, CreateSchemaIsIdempotentAndHonoursTableName) {
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("s.db"));
  outbox::sqlite::create_schema(*conn, "orders_outbox");
  outbox::sqlite::create_schema(*conn, "orders_outbox");
  outbox::sqlite::SqliteOutboxStore store({.table = "orders_outbox"});
  store.insert_new(*conn, outbox::EventEnvelope::of_json(outbox::EventType::of("T"), "{}"));
  EXPECT_EQ(store.count_by_status(*conn)[0], 1);
  EXPECT_THROW(outbox::sqlite::create_schema(*conn, "x;y"), std::invalid_argument);
}

TEST(SqliteStore, PollClaimAndPurgeUseTheirPartialIndexes) {
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("s.db"));
  outbox::sqlite::create_schema(*conn);
  const std::string pending =
      "SELECT event_id FROM outbox_event WHERE status IN (0, 2) AND message_group IS NULL AND "
      "available_at <= 1 AND created_at <= 1 ORDER BY created_at, event_id LIMIT 10";
  const auto p = plan(*conn, pending);
  EXPECT_NE(p.find("outbox_event_pending"), std::string::npos) << p;
  EXPECT_EQ(p.find("TEMP B-TREE"), std::string::npos) << p;
  const std::string terminal =
      "SELECT event_id FROM outbox_event WHERE status IN (1, 3) AND COALESCE(done_at, created_at) "
      "< 1 ORDER BY created_at LIMIT 10";
  const auto t = plan(*conn, terminal);
  EXPECT_NE(t.find("outbox_event_terminal"), std::string::npos) << t;
  const std::string groups =
      "SELECT event_id FROM outbox_event WHERE status IN (0, 2) AND message_group IS NOT NULL AND "
      "partition_no = 5 AND message_group > 'a' ORDER BY message_group, stream_seq LIMIT 10";
  const auto g = plan(*conn, groups);
  EXPECT_NE(g.find("outbox_event_groups"), std::string::npos) << g;
  EXPECT_EQ(g.find("TEMP B-TREE"), std::string::npos) << g;
}

// A relay draining only message groups claims no ungrouped row in any cycle: that claim must not
// queue for the write lock behind the DONE marks (or anyone) for nothing.
TEST(SqliteStore, AClaimWithNothingToClaimDoesNotTakeTheWriteLock) {
  using namespace std::chrono_literals;
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("s.db"), {.busy_timeout = 50ms});
  outbox::sqlite::create_schema(*conn);
  outbox::sqlite::SqliteOutboxStore store({.table = "outbox_event"});
  store.insert_new(*conn, outbox::EventEnvelope::builder(outbox::EventType::of("Moved"))
                              .event_id("grouped-1")
                              .message_group("order-1")
                              .payload_json("{}")
                              .build());
  auto other = outbox::sqlite::open(dir.file("s.db"));
  const auto claim = [&] {
    return store.claim_pending(*conn, "node-a", outbox::Clock::system()->now(), 30s, 0us, 10,
                               nullptr);
  };
  other->execute("BEGIN IMMEDIATE");
  EXPECT_TRUE(claim().empty());  // only a grouped row: read, not claimed
  other->execute("COMMIT");
  store.insert_new(*other, outbox::EventEnvelope::of_json(outbox::EventType::of("T"), "{}"));
  other->execute("BEGIN IMMEDIATE");
  EXPECT_THROW(claim(), outbox::StoreError);  // a row to claim: the claim needs the lock
  other->execute("ROLLBACK");
  EXPECT_EQ(claim().size(), 1U);
}

// A list padded to its length repeats its own last id, not the ones after its range (a chunk's
// padding reaching into the next chunk would mark rows twice).
TEST(SqliteStore, AnIdListHoldsTheIdsOfItsRangeOnly) {
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("s.db"));
  conn->execute("CREATE TABLE x (id TEXT)");
  conn->execute("INSERT INTO x VALUES ('a'), ('b'), ('c'), ('d'), ('e')");
  const std::vector<std::string> ids = {"a", "b", "c", "d", "e"};  // the statement refers to them
  outbox::sql::Statement s(outbox::sqlite::dialect(), false);
  s.sql("SELECT COUNT(*), MIN(id), MAX(id) FROM x WHERE").ids_in("id", ids, 1, 3);
  const auto rows = s.query(*conn);
  EXPECT_EQ(rows[0].get_int(0), 3);
  EXPECT_EQ(rows[0].get_text(1), "b");
  EXPECT_EQ(rows[0].get_text(2), "d");
}

// Statements are kept prepared per text: lists of ids must not make a text per length (a grouped
// claim of several kilobytes was prepared again nearly every cycle).
TEST(SqliteStore, DoneMarksOfNearbySizesShareOnePreparedStatement) {
  outbox::testing::TempDir dir;
  auto conn = outbox::sqlite::open(dir.file("s.db"));
  outbox::sqlite::create_schema(*conn);
  outbox::sqlite::SqliteOutboxStore store({.table = "outbox_event"});
  std::vector<std::string> ids;
  for (int i = 0; i < 400; ++i) {
    ids.push_back("e" + std::to_string(i));
    store.insert_new(*conn, outbox::EventEnvelope::builder(outbox::EventType::of("T"))
                                .event_id(ids.back())
                                .payload_json("{}")
                                .build());
  }
  const auto marks_prepared = [&] {
    int n = 0;
    sqlite3* db = outbox::sqlite::internal::handle_of(*conn);
    for (sqlite3_stmt* s = sqlite3_next_stmt(db, nullptr); s != nullptr;
         s = sqlite3_next_stmt(db, s)) {
      n += std::string_view(sqlite3_sql(s)).starts_with("UPDATE outbox_event SET status = 1");
    }
    return n;
  };
  const auto now = outbox::Clock::system()->now();
  std::size_t at = 0;
  for (const std::size_t n : {65, 70, 100, 128}) {  // one length padded: 128
    EXPECT_EQ(store.mark_done_batch(*conn, {ids.begin() + at, ids.begin() + at + n}, now),
              static_cast<int>(n));
    at += n;
  }
  EXPECT_EQ(marks_prepared(), 1);
  EXPECT_EQ(store.count_by_status(*conn)[1], static_cast<std::int64_t>(at));
}

}  // namespace
