// The stream and the subscription table on every engine: a transaction that inserted first and
// commits last is never skipped, reads are in one order and page without gaps, tags travel, the
// subscription table's conditional writes (cursor compare-and-set, the lease fence, FAILED after
// max errors), migration of a table from before streams, and PostgreSQL's restore check.

#include <gtest/gtest.h>

#include <future>
#include <set>
#include <thread>

#include "outbox/errors.hpp"
#include "outbox/sql/connection.hpp"
#include "tests/support/stream_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::StreamFixture;

EventEnvelope event(const std::string& id, Tags tags = {}) {
  return EventEnvelope::builder(EventType::of("Thing"))
      .event_id(id)
      .aggregate_type(AggregateType::of("Box"))
      .aggregate_id("b1")
      .tags(tags)
      .payload_json("{\"id\":\"" + id + "\"}")
      .build();
}

std::vector<std::string> ids(const std::vector<StreamEvent>& events) {
  std::vector<std::string> out;
  for (const auto& e : events) {
    out.push_back(e.row.event_id);
  }
  return out;
}

class StreamContract : public StreamFixture {};

TEST_P(StreamContract, ATransactionThatInsertedFirstAndCommitsLastIsNotSkipped) {
  StreamPosition cursor;
  auto first = pool_->acquire();
  first->begin();
  store_->insert_new(*first, event("first"));
  // The second writer commits while the first is still open (on SQLite it waits for the write
  // lock, so it commits after the first whatever we do).
  auto second = std::async(std::launch::async, [&] {
    auto conn = pool_->acquire();
    store_->insert_new(*conn, event("second"));
  });
  if (!engine_is("sqlite")) {
    second.get();
  }
  std::vector<std::string> seen = ids(read_all(cursor));
  EXPECT_EQ(std::count(seen.begin(), seen.end(), "first"), 0) << "an open insert was read";
  if (engine_is("postgres")) {
    // Below the open transaction nothing may be read, and the holdback names it.
    EXPECT_TRUE(seen.empty());
    const auto held = stream_->holdback(*pool_->acquire());
    ASSERT_TRUE(held);
    EXPECT_GT(held->pid, 0);
  }
  first->commit();
  if (engine_is("sqlite")) {
    second.get();
  }
  for (const auto& id : ids(read_all(cursor, 1000, 2 - seen.size()))) {
    seen.push_back(id);
  }
  std::sort(seen.begin(), seen.end());
  EXPECT_EQ(seen, (std::vector<std::string>{"first", "second"}));
  EXPECT_EQ(stream_->head(*pool_->acquire()), cursor);
}

TEST_P(StreamContract, ReadsPageInOneOrderWithoutGapsOrRepeats) {
  {
    auto conn = pool_->acquire();
    for (int i = 0; i < 7; ++i) {
      store_->insert_new(*conn, event("solo-" + std::to_string(i)));
    }
    std::vector<EventEnvelope> batch;
    for (int i = 0; i < 6; ++i) {
      batch.push_back(event("batch-" + std::to_string(i)));
    }
    conn->begin();
    store_->insert_batch(*conn, batch);
    conn->commit();
  }
  StreamPosition cursor;
  const auto all = read_all(cursor, 4, 13);
  ASSERT_EQ(all.size(), 13u);
  for (std::size_t i = 1; i < all.size(); ++i) {
    EXPECT_LT(all[i - 1].position, all[i].position);
  }
  // One transaction's events keep their write order.
  EXPECT_EQ(all[7].row.event_id, "batch-0");
  EXPECT_EQ(all[12].row.event_id, "batch-5");
  auto conn = pool_->acquire();
  EXPECT_EQ(stream_->head(*conn), all.back().position);
  const auto lag = stream_->lag(*conn, all[9].position);
  EXPECT_EQ(lag.events, 3);
  ASSERT_TRUE(lag.oldest_unread);
  EXPECT_EQ(stream_->lag(*conn, all.back().position).events, 0);
  EXPECT_TRUE(stream_->read(*conn, all.back().position, 10).empty());
}

TEST_P(StreamContract, TagsAreStoredAndReadBackOnBothPaths) {
  {
    auto conn = pool_->acquire();
    store_->insert_new(*conn, event("tagged", {{"wallet_id", "w-7"}, {"region", "eu \"west\""}}));
    store_->insert_new(*conn, event("plain"));
  }
  StreamPosition cursor;
  const auto read = read_all(cursor, 1000, 2);
  ASSERT_EQ(read.size(), 2u);
  const auto tagged = to_envelope(read[0].row, JsonCodec::default_codec());
  EXPECT_EQ(tagged.tags(), (Tags{{"region", "eu \"west\""}, {"wallet_id", "w-7"}}));
  EXPECT_TRUE(to_envelope(read[1].row, JsonCodec::default_codec()).tags().empty());
  // The claim path reads them too.
  auto conn = pool_->acquire();
  const auto found = store_->find(*conn, "tagged");
  ASSERT_TRUE(found);
  EXPECT_EQ(to_envelope(*found, JsonCodec::default_codec()).tags().at("wallet_id"), "w-7");
}

TEST_P(StreamContract, TagsAnotherClientWroteAreTextOrTheRowIsRefusedNamingTheColumn) {
  auto conn = pool_->acquire();
  store_->insert_new(*conn, event("bad-utf8"));
  store_->insert_new(*conn, event("bad-shape"));
  if (engine_is("sqlite")) {  // the server engines refuse invalid UTF-8 in JSON themselves
    conn->execute("UPDATE " + table_ +
                  " SET tags = CAST(X'7B2261223A2280FF227D' AS TEXT) WHERE event_id = 'bad-utf8'");
  }
  conn->execute("UPDATE " + table_ +
                " SET tags = " + (engine_is("postgres") ? "'{\"n\": 1}'::jsonb" : "'{\"n\": 1}'") +
                " WHERE event_id = 'bad-shape'");
  StreamPosition cursor;
  const auto rows = read_all(cursor, 1000, 2);
  ASSERT_EQ(rows.size(), 2u);
  for (const auto& r : rows) {
    if (r.row.event_id == "bad-utf8" && !engine_is("sqlite")) {
      continue;
    }
    try {
      to_envelope(r.row, JsonCodec::default_codec());
      ADD_FAILURE() << r.row.event_id << " was accepted";
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("tags column"), std::string::npos) << e.what();
    }
  }
}

TEST_P(StreamContract, PositionBeforeATimeRereadsFromTheFirstEventAtOrAfterIt) {
  const auto t0 = from_micros(to_micros(std::chrono::system_clock::now()));
  {
    auto conn = pool_->acquire();
    for (int i = 0; i < 5; ++i) {
      store_->insert_new(*conn, EventEnvelope::builder(EventType::of("Thing"))
                                    .event_id("at-" + std::to_string(i))
                                    .occurred_at(t0 + std::chrono::minutes(i))
                                    .payload_json("{}")
                                    .build());
    }
  }
  sequence();
  auto conn = pool_->acquire();
  auto from = stream_->position_before(*conn, t0 + std::chrono::minutes(2));
  const auto rest = stream_->read(*conn, from, 10);
  EXPECT_EQ(ids(rest), (std::vector<std::string>{"at-2", "at-3", "at-4"}));
  EXPECT_EQ(stream_->position_before(*conn, t0 + std::chrono::hours(1)), stream_->head(*conn));
}

TEST_P(StreamContract, TheSubscriptionTableWritesOnlyWhatItsConditionsAllow) {
  auto conn = pool_->acquire();
  SubscriptionSpec spec{"kafka-wallets",
                        {.event_types = {"Wallet*"}, .required_tags = {"wallet_id"}},
                        "kafka",
                        "wallets.{event_type}"};
  EXPECT_TRUE(stream_->create(*conn, spec, {}));
  EXPECT_FALSE(stream_->create(*conn, spec, {0, 99}));  // exists: untouched
  auto st = stream_->find(*conn, "kafka-wallets");
  ASSERT_TRUE(st);
  EXPECT_EQ(st->spec.filter, spec.filter);
  EXPECT_EQ(st->spec.target, "wallets.{event_type}");
  EXPECT_EQ(st->status, SubscriptionStatus::Active);
  EXPECT_EQ(st->cursor, StreamPosition{});

  // The cursor moves only from where it is.
  EXPECT_TRUE(stream_->advance(*conn, "kafka-wallets", {}, {0, 5}, 3, nullptr));
  EXPECT_FALSE(stream_->advance(*conn, "kafka-wallets", {}, {0, 9}, 1, nullptr));
  st = stream_->find(*conn, "kafka-wallets");
  EXPECT_EQ(st->cursor, (StreamPosition{0, 5}));
  EXPECT_EQ(st->delivered, 3);
  EXPECT_TRUE(st->last_delivered_at);

  // And only under the live holding of its lease.
  const auto token = leases_->acquire(*conn, "sub:kafka-wallets", "node-a", 30s);
  ASSERT_TRUE(token);
  EXPECT_TRUE(stream_->advance(*conn, "kafka-wallets", {0, 5}, {0, 6}, 1, &*token));
  auto stale = *token;
  stale.epoch -= 1;
  EXPECT_FALSE(stream_->advance(*conn, "kafka-wallets", {0, 6}, {0, 7}, 1, &stale));
  EXPECT_FALSE(stream_->record_error(*conn, "kafka-wallets", "late", 3, &stale));
  EXPECT_EQ(stream_->find(*conn, "kafka-wallets")->cursor, (StreamPosition{0, 6}));

  // FAILED at max_errors in a row; reset clears it.
  EXPECT_EQ(stream_->record_error(*conn, "kafka-wallets", "broker down 1", 3, &*token),
            SubscriptionStatus::Active);
  EXPECT_EQ(stream_->record_error(*conn, "kafka-wallets", "broker down 2", 3, &*token),
            SubscriptionStatus::Active);
  EXPECT_EQ(stream_->record_error(*conn, "kafka-wallets", "broker down 3", 3, &*token),
            SubscriptionStatus::Failed);
  st = stream_->find(*conn, "kafka-wallets");
  EXPECT_EQ(st->error_count, 3);
  EXPECT_EQ(st->last_error, "broker down 3");
  EXPECT_FALSE(stream_->set_status(*conn, "kafka-wallets", SubscriptionStatus::Paused,
                                   {SubscriptionStatus::Active}));
  EXPECT_TRUE(stream_->set_status(*conn, "kafka-wallets", SubscriptionStatus::Active,
                                  {SubscriptionStatus::Failed}));
  st = stream_->find(*conn, "kafka-wallets");
  EXPECT_EQ(st->status, SubscriptionStatus::Active);
  EXPECT_EQ(st->error_count, 0);
  EXPECT_FALSE(st->last_error);

  // Retention follows the lowest cursor, whatever the status, until a subscription is released.
  ASSERT_TRUE(stream_->create(*conn, {"audit", {}, "log", ""}, {0, 2}));
  EXPECT_EQ(stream_->retained_from(*conn), (StreamPosition{0, 2}));
  EXPECT_TRUE(stream_->set_status(*conn, "audit", SubscriptionStatus::Paused,
                                  {SubscriptionStatus::Active}));
  EXPECT_EQ(stream_->retained_from(*conn), (StreamPosition{0, 2}));
  // A PAUSED subscription stays paused however its errors count.
  EXPECT_EQ(stream_->record_error(*conn, "audit", "x", 1, nullptr), SubscriptionStatus::Paused);
  EXPECT_TRUE(stream_->set_status(*conn, "audit", SubscriptionStatus::Active,
                                  {SubscriptionStatus::Paused}));
  EXPECT_EQ(stream_->record_error(*conn, "audit", "x", 1, nullptr), SubscriptionStatus::Failed);
  EXPECT_EQ(stream_->retained_from(*conn), (StreamPosition{0, 2}));
  EXPECT_TRUE(stream_->release_retention(*conn, "audit", "lagging"));
  st = stream_->find(*conn, "audit");
  EXPECT_EQ(st->status, SubscriptionStatus::Failed);
  EXPECT_TRUE(st->released_at);
  EXPECT_EQ(stream_->retained_from(*conn), (StreamPosition{0, 6}));
  EXPECT_TRUE(stream_->set_status(*conn, "audit", SubscriptionStatus::Active,
                                  {SubscriptionStatus::Failed}));
  EXPECT_FALSE(stream_->find(*conn, "audit")->released_at);
  EXPECT_EQ(stream_->retained_from(*conn), (StreamPosition{0, 2}));
  EXPECT_TRUE(stream_->release_retention(*conn, "audit", "lagging"));

  EXPECT_TRUE(stream_->rewind(*conn, "kafka-wallets", {}));
  EXPECT_EQ(stream_->find(*conn, "kafka-wallets")->cursor, StreamPosition{});
  EXPECT_FALSE(stream_->rewind(*conn, "nobody", {}));
  spec.target = "other";
  EXPECT_TRUE(stream_->update_spec(*conn, spec));
  EXPECT_EQ(stream_->find(*conn, "kafka-wallets")->spec.target, "other");
  EXPECT_EQ(stream_->list(*conn).size(), 2u);
  EXPECT_TRUE(stream_->remove(*conn, "audit"));
  EXPECT_FALSE(stream_->find(*conn, "audit"));
  EXPECT_THROW(stream_->create(*conn, {"has space", {}, "log", ""}, {}), std::invalid_argument);
}

TEST_P(StreamContract, StatusWrittenWithPlainSqlIsReadAndBadValuesAreRefused) {
  auto conn = pool_->acquire();
  ASSERT_TRUE(stream_->create(*conn, {"ops", {}, "log", ""}, {}));
  conn->execute("UPDATE " + sql::subscription_table_name(table_) +
                " SET status = 'PAUSED' WHERE name = 'ops'");
  EXPECT_EQ(stream_->find(*conn, "ops")->status, SubscriptionStatus::Paused);
  EXPECT_THROW(conn->execute("UPDATE " + sql::subscription_table_name(table_) +
                             " SET status = 'paused' WHERE name = 'ops'"),
               StoreError);
}

TEST_P(StreamContract, MigrationNumbersTheRowsOfAnOlderTableOldestFirst) {
  // A table from schema version 3, with rows, then migrate.
  const std::string old = testing::unique_table("old");
  auto conn = pool_->acquire();
  if (engine_is("sqlite")) {
    conn->execute("CREATE TABLE " + old +
                  " (event_id TEXT PRIMARY KEY NOT NULL, event_type TEXT NOT NULL, "
                  "aggregate_type TEXT, aggregate_id TEXT, tenant_id TEXT, payload BLOB NOT NULL, "
                  "headers TEXT, status INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, "
                  "available_at INTEGER NOT NULL, created_at INTEGER NOT NULL, done_at INTEGER, "
                  "last_error TEXT, locked_by TEXT, locked_at INTEGER)");
  } else {
    create_schema_for(*conn, old);
    if (engine_is("postgres")) {
      conn->execute("ALTER TABLE " + old + " DROP COLUMN stream_xid, DROP COLUMN stream_seq, " +
                    "DROP COLUMN tags");
    } else {
      // Keyed by event_id, as tables were before schema version 8.
      conn->execute("ALTER TABLE " + old + " DROP INDEX " + derived_name(old, "_stream") +
                    ", DROP INDEX " + derived_name(old, "_event_id") +
                    ", DROP COLUMN stream_seq, DROP COLUMN stream_id, DROP COLUMN tags, ADD "
                    "PRIMARY KEY (event_id)");
    }
  }
  conn->execute(
      "CREATE TABLE IF NOT EXISTS outbox_schema_version (table_name VARCHAR(63) "
      "PRIMARY KEY, version INTEGER NOT NULL)");
  conn->execute("INSERT INTO outbox_schema_version (table_name, version) VALUES ('" + old +
                "', 3)");
  auto old_store = detect_store(*conn, old);
  const auto t0 = std::chrono::system_clock::now();
  for (int i : {3, 1, 2}) {
    old_store->insert_new(*conn, EventEnvelope::builder(EventType::of("Old"))
                                     .event_id("old-" + std::to_string(i))
                                     .occurred_at(t0 + std::chrono::seconds(i))
                                     .payload_json("{}")
                                     .build());
  }
  const auto result = migrate(*conn, old);
  EXPECT_EQ(result.from, 3);
  EXPECT_EQ(result.to, kSchemaVersion);
  EXPECT_EQ(migrate(*conn, old).from, kSchemaVersion);  // idempotent
  auto old_stream = detect_stream_store(*conn, old);
  // Bounded: a test running beside this one on the server may hold the readable end back.
  const auto read_from = [&](StreamPosition from) {
    std::vector<StreamEvent> read;
    testing::wait_until([&] {
      while (old_stream->sequence(*conn, 1000) > 0) {
      }
      read = old_stream->read(*conn, from, 10);
      return !read.empty();
    });
    return read;
  };
  auto read = read_from({});
  EXPECT_EQ(ids(read), (std::vector<std::string>{"old-1", "old-2", "old-3"}));
  // New rows follow, and the claim path still works on the rebuilt table.
  old_store->insert_new(*conn, event("new", {{"k", "v"}}));
  read = read_from(read.back().position);
  EXPECT_EQ(ids(read), (std::vector<std::string>{"new"}));
  EXPECT_EQ(old_store->poll_pending(*conn, std::chrono::system_clock::now() + 1h, 0us, 10).size(),
            4u);
  if (engine_is("mysql")) {
    // Version 8: the rows are stored in insert order; event ids stay unique.
    std::string primary;
    for (const auto& index : conn->query("SHOW INDEX FROM " + old)) {
      if (index.get_text(2) == "PRIMARY") {
        primary += index.get_text(4);
      }
    }
    EXPECT_EQ(primary, "stream_id");
    EXPECT_THROW(old_store->insert_new(*conn, EventEnvelope::builder(EventType::of("Old"))
                                                  .event_id("old-2")
                                                  .payload_json("{}")
                                                  .build()),
                 UniqueViolationError);
  }
  if (!engine_is("sqlite")) {
    for (const auto& t : {sql::subscription_table_name(old), sql::lease_table_name(old),
                          derived_name(old, "_stream_head"), old}) {
      conn->execute("DROP TABLE IF EXISTS " + t);
    }
  }
  conn->execute("DELETE FROM outbox_schema_version WHERE table_name = '" + old + "'");
}

TEST_P(StreamContract, PostgresRefusesARestoredStreamUntilRebased) {
  if (!engine_is("postgres")) {
    GTEST_SKIP() << "not on " << testing::display_name(GetParam().name)
                 << ": only PostgreSQL positions hold transaction ids";
  }
  auto conn = pool_->acquire();
  for (int i = 0; i < 4; ++i) {
    store_->insert_new(*conn, event("r-" + std::to_string(i)));
  }
  StreamPosition cursor;
  auto read = read_all(cursor, 1000, 4);
  ASSERT_EQ(read.size(), 4u);
  ASSERT_TRUE(stream_->create(*conn, {"reader", {}, "log", ""}, read[1].position));
  // What a dump restored into a younger cluster looks like: stored ids beyond the server's.
  conn->execute("UPDATE " + table_ +
                " SET stream_xid = (stream_xid::text::bigint + 1000000)::text::xid8");
  conn->execute("UPDATE " + sql::subscription_table_name(table_) +
                " SET cursor_xid = cursor_xid + 1000000");
  // Written after the restore, before anyone noticed: a small id, below every cursor.
  store_->insert_new(*conn, event("after-restore"));
  try {
    stream_->check(*conn);
    FAIL() << "check() accepted ids from the future";
  } catch (const StreamError& e) {
    EXPECT_NE(std::string(e.what()).find("outbox stream rebase"), std::string::npos) << e.what();
  }
  EXPECT_EQ(stream_->rebase(*conn), 5);
  EXPECT_NO_THROW(stream_->check(*conn));
  // The reader resumes at its first unread event; nothing written since the restore is lost, and
  // new events come after the old ones.
  store_->insert_new(*conn, event("after-rebase"));
  auto from = stream_->find(*conn, "reader")->cursor;
  EXPECT_EQ(ids(read_all(from, 1000, 4)),
            (std::vector<std::string>{"r-2", "r-3", "after-restore", "after-rebase"}));
}

TEST_P(StreamContract, ConcurrentSequencersNeverNumberARowTwice) {
  if (!stream_->needs_sequencer()) {
    GTEST_SKIP() << "not on " << testing::display_name(GetParam().name)
                 << ": positions are given at insert";
  }
  std::atomic<bool> writing{true};
  auto writer = std::async(std::launch::async, [&] {
    auto conn = pool_->acquire();
    for (int i = 0; i < 400; ++i) {
      store_->insert_new(*conn, event("w-" + std::to_string(i)));
    }
    writing = false;
  });
  auto sequencer = [&] {
    auto conn = pool_->acquire();
    while (writing) {
      try {
        stream_->sequence(*conn, 7);
      } catch (const StoreError&) {
        // A deadlock victim numbers nothing; the next run does.
      }
    }
  };
  std::thread a(sequencer), b(sequencer);
  writer.get();
  a.join();
  b.join();
  StreamPosition cursor;
  const auto all = read_all(cursor, 50, 400);
  ASSERT_EQ(all.size(), 400u);
  std::set<std::int64_t> seqs;
  for (const auto& e : all) {
    seqs.insert(e.position.seq);
  }
  EXPECT_EQ(seqs.size(), 400u);
}

TEST_P(StreamContract, OneTransactionsEventsKeepTheirWriteOrderWhateverTheirTimesAndIds) {
  const auto t = std::chrono::system_clock::now();
  auto make = [&](const std::string& id, std::chrono::seconds offset) {
    return EventEnvelope::builder(EventType::of("Step"))
        .event_id(id)
        .occurred_at(t + offset)
        .payload_json("{}")
        .build();
  };
  auto conn = pool_->acquire();
  conn->begin();
  store_->insert_new(*conn, make("zz-created", 0s));
  store_->insert_new(*conn, make("mm-line", 0s));
  store_->insert_new(*conn, make("aa-confirmed", -5s));
  store_->insert_batch(*conn, {make("b-3", 9s), make("b-2", 0s), make("b-1", -9s)});
  conn->commit();
  StreamPosition cursor;
  EXPECT_EQ(
      ids(read_all(cursor, 1000, 6)),
      (std::vector<std::string>{"zz-created", "mm-line", "aa-confirmed", "b-3", "b-2", "b-1"}));
}

TEST_P(StreamContract, ARowNumberedByItsWriterDoesNotHideTheRowsAfterIt) {
  if (!stream_->needs_sequencer()) {
    GTEST_SKIP() << "not on " << testing::display_name(GetParam().name)
                 << ": positions are given at insert and cannot be chosen";
  }
  auto conn = pool_->acquire();
  store_->insert_new(*conn, event("e1"));
  StreamPosition cursor;
  read_all(cursor);
  conn->execute("INSERT INTO " + table_ +
                " (event_id, event_type, payload, status, available_at, created_at, stream_seq) "
                "VALUES ('foreign', 'X', '{}', 0, UTC_TIMESTAMP(6), UTC_TIMESTAMP(6), 100)");
  EXPECT_EQ(ids(read_all(cursor, 1000, 1)), (std::vector<std::string>{"foreign"}));
  store_->insert_new(*conn, event("e2"));
  EXPECT_EQ(ids(read_all(cursor, 1000, 1)), (std::vector<std::string>{"e2"}));
}

TEST_P(StreamContract, SqliteMigrationKeepsWhatTheApplicationAddedToTheTable) {
  if (!engine_is("sqlite")) {
    GTEST_SKIP() << "not on " << testing::display_name(GetParam().name)
                 << ": the table is altered in place, not copied";
  }
  const std::string old = "app_table";
  auto conn = pool_->acquire();
  conn->execute("CREATE TABLE " + old +
                " (event_id TEXT PRIMARY KEY NOT NULL, event_type TEXT NOT NULL, "
                "aggregate_type TEXT, aggregate_id TEXT, tenant_id TEXT, payload BLOB NOT NULL, "
                "headers TEXT, status INTEGER NOT NULL, attempts INTEGER NOT NULL DEFAULT 0, "
                "available_at INTEGER NOT NULL, created_at INTEGER NOT NULL, done_at INTEGER, "
                "last_error TEXT, locked_by TEXT, locked_at INTEGER, "
                "trace_id TEXT NOT NULL DEFAULT 'none')");
  conn->execute("CREATE INDEX app_table_trace ON " + old + " (trace_id)");
  conn->execute("CREATE TABLE audit (n INTEGER)");
  conn->execute("CREATE TRIGGER app_table_audit AFTER INSERT ON " + old +
                " BEGIN INSERT INTO audit VALUES (1); END");
  conn->execute("INSERT INTO " + old +
                " (event_id, event_type, payload, status, available_at, created_at, trace_id) "
                "VALUES ('e1', 'T', '{}', 0, 1, 1, 'abc')");
  migrate(*conn, old);
  EXPECT_EQ(conn->query("SELECT trace_id FROM " + old + " WHERE event_id = 'e1'")[0].get_text(0),
            "abc");
  EXPECT_EQ(conn->query("SELECT count(*) FROM sqlite_master WHERE name IN ('app_table_trace', "
                        "'app_table_audit')")[0]
                .get_int(0),
            2);
  detect_store(*conn, old)->insert_new(*conn, event("e2"));
  EXPECT_EQ(conn->query("SELECT count(*) FROM audit")[0].get_int(0), 2);
  EXPECT_EQ(conn->query("SELECT trace_id FROM " + old + " WHERE event_id = 'e2'")[0].get_text(0),
            "none");
}

// Discarding a DEAD event (dead-letter triage) keeps a row a subscription has not read, as the
// purge does: the claim path gave up on it, the subscription still has to deliver it.
TEST_P(StreamContract, DiscardKeepsADeadRowALiveSubscriptionHasNotRead) {
  auto conn = pool_->acquire();
  const auto now = std::chrono::system_clock::now();
  store_->insert_new(*conn, event("read"));
  store_->insert_new(*conn, event("unread"));
  StreamPosition cursor;
  const auto all = read_all(cursor, 1000, 2);
  ASSERT_EQ(all.size(), 2u);
  ASSERT_TRUE(stream_->create(*conn, {"slow", {}, "log", ""}, all[0].position));
  store_->mark_dead(*conn, "read", now, "boom");
  store_->mark_dead(*conn, "unread", now, "boom");
  EXPECT_EQ(store_->discard_dead(*conn, "unread", "boom"), 0);
  EXPECT_EQ(store_->discard_dead(*conn, "read", "boom"), 1);
  ASSERT_TRUE(stream_->rewind(*conn, "slow", all[1].position));
  EXPECT_EQ(store_->discard_dead(*conn, "unread", "boom"), 1);
}

TEST_P(StreamContract, PurgeKeepsWhatALiveSubscriptionHasNotRead) {
  auto conn = pool_->acquire();
  const auto now = std::chrono::system_clock::now();
  for (int i = 0; i < 6; ++i) {
    store_->insert_new(*conn, event("p" + std::to_string(i)));
    store_->mark_done(*conn, "p" + std::to_string(i), now);
  }
  StreamPosition cursor;
  const auto all = read_all(cursor, 1000, 6);
  ASSERT_EQ(all.size(), 6u);
  ASSERT_TRUE(stream_->create(*conn, {"slow", {}, "log", ""}, all[1].position));
  // Not yet numbered by the sequencer: kept as unread too.
  store_->insert_new(*conn, event("late"));
  store_->mark_done(*conn, "late", now);
  const auto purger = detect_purger(*conn, table_);
  EXPECT_EQ(purger->purge(*conn, now + 1h, 100), 2);
  EXPECT_FALSE(store_->find(*conn, "p1"));
  EXPECT_TRUE(store_->find(*conn, "p2"));
  EXPECT_TRUE(store_->find(*conn, "late"));
  ASSERT_TRUE(
      stream_->set_status(*conn, "slow", SubscriptionStatus::Paused, {SubscriptionStatus::Active}));
  EXPECT_EQ(purger->purge(*conn, now + 1h, 100), 0);  // paused still holds its rows
  // The age-based purger (tables only subscriptions read: rows stay NEW) keeps them as well.
  struct AgePurger final : sql::SqlAgeBasedPurger {
    AgePurger(const sql::Dialect& d, std::string t) : SqlAgeBasedPurger(d, std::move(t)) {}
  };
  store_->insert_new(*conn, event("never-done"));
  EXPECT_EQ(AgePurger(engine_for(conn->dialect()).dialect(), table_).purge(*conn, now + 1h, 100),
            0);
  ASSERT_TRUE(stream_->rewind(*conn, "slow", all[3].position));
  EXPECT_EQ(purger->purge(*conn, now + 1h, 100), 2);  // p2, p3
  // A FAILED one keeps them too (a broken endpoint must not cost its events); a released one not.
  ASSERT_TRUE(
      stream_->set_status(*conn, "slow", SubscriptionStatus::Active, {SubscriptionStatus::Paused}));
  EXPECT_EQ(stream_->record_error(*conn, "slow", "gave up", 1, nullptr),
            SubscriptionStatus::Failed);
  EXPECT_EQ(purger->purge(*conn, now + 1h, 100), 0);
  ASSERT_TRUE(stream_->release_retention(*conn, "slow", "lagging"));
  EXPECT_EQ(purger->purge(*conn, now + 1h, 100), 3);  // p4, p5, late
  EXPECT_EQ(AgePurger(engine_for(conn->dialect()).dialect(), table_).purge(*conn, now + 1h, 100),
            1);  // never-done
}

INSTANTIATE_TEST_SUITE_P(Engines, StreamContract, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
