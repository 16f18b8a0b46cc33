// The schema of message groups on every engine: SQLite's index of fronts (version 9, narrowed by
// version 10), read only where it is the table's own, said when it is missing; partition numbers
// that are not whole numbers (version 11); and a migration run again changes nothing.

#include <gtest/gtest.h>

#include <mutex>
#include <string>
#include <vector>

#include "outbox/log.hpp"
#include "tests/support/group_contract_fixture.hpp"
#include "tests/support/tables.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::grouped;
using testing::ids_of;
using testing::keys_of_partition;
using testing::plain;

// The columns of `table`'s front index (SQLite), in key order.
std::vector<std::string> front_index_key(sql::Connection& conn, const std::string& table) {
  std::vector<std::string> key;
  for (const auto& r : conn.query("SELECT i.name FROM sqlite_master m, pragma_index_info(m.name) i "
                                  "WHERE m.type = 'index' AND m.name = '" +
                                  table + "_groups_front' ORDER BY i.seqno")) {
    key.push_back(r.get_text(0));
  }
  return key;
}

// SQLite's plan of a front read of one partition of `table`, a step a line.
std::string front_plan(sql::Connection& conn, const std::string& table) {
  std::string plan;
  for (const auto& r : conn.query("EXPLAIN QUERY PLAN SELECT event_id FROM " + table +
                                  " WHERE status IN (0, 2) AND message_group IS NOT NULL AND "
                                  "partition_no = 3 ORDER BY stream_seq LIMIT 16")) {
    plan += r.get_text(3) + "\n";
  }
  return plan;
}

// The warnings logged while `fn` runs.
template <typename Fn>
std::vector<std::string> warnings_while(Fn&& fn) {
  std::vector<std::string> warnings;
  std::mutex mutex;  // the sink is called from any thread
  set_log_sink([&](LogLevel level, std::string_view message) {
    if (level == LogLevel::Warning) {
      std::lock_guard lock(mutex);
      warnings.emplace_back(message);
    }
  });
  try {
    fn();
  } catch (...) {
    set_log_sink({});
    throw;
  }
  set_log_sink({});
  return warnings;
}

// Makes `name` a copy of the definition of `source` (SQLite), `from` replaced by `to` in it.
void table_like(sql::Connection& conn, const std::string& source, const std::string& name,
                const std::string& from, const std::string& to) {
  auto def = conn.query("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = '" + source +
                        "'")[0]
                 .get_text(0);
  ASSERT_NE(def.find(from), std::string::npos) << def;
  def.replace(def.find(from), from.size(), to);
  def.replace(def.find(source), source.size(), name);
  conn.execute(def);
}

class GroupSchema : public testing::GroupContractFixture {};

// Fronts are read on SQLite only, and only from a table that has their index: one at schema
// version 8 (index dropped, version row set back) is claimed in key order until migrated to 9.
TEST_P(GroupSchema, FrontsAreReadOnlyWhereTheirIndexIs) {
  auto conn = pool_->acquire();
  if (!engine_is("sqlite")) {
    EXPECT_FALSE(groups_->has_fronts());
    return;
  }
  EXPECT_TRUE(groups_->has_fronts());
  migrate(*conn, table_);
  conn->execute("DROP INDEX " + table_ + "_groups_front");
  conn->execute("UPDATE outbox_schema_version SET version = 8 WHERE table_name = '" + table_ + "'");
  EXPECT_FALSE(detect_group_store(*conn, table_)->has_fronts());
  EXPECT_EQ(migrate(*conn, table_).from, 8);
  EXPECT_TRUE(detect_group_store(*conn, table_)->has_fronts());
}

// Version 10 narrows SQLite's front index to the partition and stream_seq: a table of version 9
// gets it from the migration (its index found whatever the case it was written in), and fronts
// read through it in insert order without sorting.
TEST_P(GroupSchema, TheMigrationNarrowsTheFrontIndexAndFrontsStayInInsertOrder) {
  if (!engine_is("sqlite")) {
    EXPECT_FALSE(groups_->has_fronts());  // the other engines read no front index
    return;
  }
  auto conn = pool_->acquire();
  migrate(*conn, table_);
  conn->execute("DROP INDEX " + table_ + "_groups_front");
  conn->execute("CREATE INDEX " + table_ + "_groups_front ON " + table_ +
                " (PARTITION_NO, Stream_Seq, message_group, AVAILABLE_AT, event_id) WHERE status "
                "IN (0, 2) AND message_group IS NOT NULL");
  conn->execute("UPDATE outbox_schema_version SET version = 9 WHERE table_name = '" + table_ + "'");
  // Keys of one partition, written interleaved, the last key first: the front is their rows in
  // write order.
  const auto keys = keys_of_partition("f", 9, 3);
  std::vector<EventEnvelope> events;
  std::vector<std::string> written;
  for (int i = 0; i < 2; ++i) {
    for (auto it = keys.rbegin(); it != keys.rend(); ++it) {
      written.push_back(*it + "-" + std::to_string(i));
      events.push_back(grouped(written.back(), *it));
    }
  }
  write(events);
  EXPECT_EQ(migrate(*conn, table_).from, 9);
  EXPECT_EQ(front_index_key(*conn, table_),
            (std::vector<std::string>{"partition_no", "stream_seq"}));
  const auto plan = front_plan(*conn, table_);
  EXPECT_NE(plan.find(table_ + "_groups_front"), std::string::npos) << plan;
  EXPECT_EQ(plan.find("TEMP B-TREE"), std::string::npos) << plan;
  std::vector<std::string> front;
  for (const auto& r : groups_->front(*conn, {9}, 16, Clock::system()->now())) {
    front.push_back(r.event_id);
  }
  EXPECT_EQ(front, written);
}

// The migration replaces only version 9's own front index: one of that name made otherwise on the
// table stays as it was made, and so does one on another table (fronts are then not read: claims
// go in key order). On a table whose stream_seq is not the rowid (one an application made),
// fronts still read without a sort.
TEST_P(GroupSchema, OnlyTheTablesOwnFrontIndexIsReplacedAndFrontsNeverSort) {
  if (!engine_is("sqlite")) {
    EXPECT_FALSE(groups_->has_fronts());
    return;
  }
  auto conn = pool_->acquire();
  migrate(*conn, table_);
  // Version 9's five columns, but not its index: another WHERE, none, UNIQUE with a sort order
  // and a collation of its own. Each stays as it was made.
  const std::string columns = " (partition_no, stream_seq, message_group, available_at, event_id)";
  for (const std::string& made :
       {"CREATE INDEX " + table_ + "_groups_front ON " + table_ + columns + " WHERE status = 2",
        "CREATE INDEX " + table_ + "_groups_front ON " + table_ + columns,
        "CREATE UNIQUE INDEX " + table_ + "_groups_front ON " + table_ +
            " (partition_no DESC, stream_seq DESC, message_group COLLATE NOCASE, available_at, "
            "event_id) WHERE status IN (0, 2) AND message_group IS NOT NULL"}) {
    conn->execute("DROP INDEX " + table_ + "_groups_front");
    conn->execute(made);
    conn->execute("UPDATE outbox_schema_version SET version = 9 WHERE table_name = '" + table_ +
                  "'");
    EXPECT_EQ(migrate(*conn, table_).from, 9);
    const auto kept =
        conn->query("SELECT sql FROM sqlite_master WHERE name = '" + table_ + "_groups_front'");
    ASSERT_EQ(kept.size(), 1U);
    EXPECT_EQ(kept[0].get_text(0), made);
  }
  conn->execute("DROP INDEX " + table_ + "_groups_front");
  conn->execute("UPDATE outbox_schema_version SET version = 9 WHERE table_name = '" + table_ + "'");
  migrate(*conn, table_);
  EXPECT_EQ(front_index_key(*conn, table_),
            (std::vector<std::string>{"partition_no", "stream_seq"}));
  const std::string other = table_ + "_other";
  conn->execute("CREATE TABLE " + other +
                " (partition_no INTEGER, stream_seq INTEGER, message_group TEXT, available_at "
                "INTEGER, event_id TEXT, status INTEGER)");
  conn->execute("DROP INDEX " + table_ + "_groups_front");
  conn->execute("CREATE INDEX " + table_ + "_groups_front ON " + other +
                " (partition_no, stream_seq, message_group, available_at, event_id) WHERE status "
                "IN (0, 2) AND message_group IS NOT NULL");
  conn->execute("UPDATE outbox_schema_version SET version = 9 WHERE table_name = '" + table_ + "'");
  EXPECT_EQ(migrate(*conn, table_).from, 9);
  const auto owner =
      conn->query("SELECT tbl_name FROM sqlite_master WHERE name = '" + table_ + "_groups_front'");
  ASSERT_EQ(owner.size(), 1U);
  EXPECT_EQ(owner[0].get_text(0), other);
  // Said to the operator, with the table that took the name.
  const auto warnings_of = [&](bool fronts_expected) {
    bool fronts = false;
    auto warnings =
        warnings_while([&] { fronts = detect_group_store(*conn, table_)->has_fronts(); });
    EXPECT_EQ(fronts, fronts_expected);
    return warnings;
  };
  const std::string front = table_ + "_groups_front";
  // The statement a warning gives to make the index.
  const auto statement_in = [](const std::string& warning) {
    const std::string with = "with: ";
    const auto at = warning.find(with);
    return at == std::string::npos ? std::string() : warning.substr(at + with.size());
  };
  auto warnings = warnings_of(false);
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("taken by an index of table " + other), std::string::npos)
      << warnings[0];
  write({grouped("o1", "g"), grouped("o2", "g")});
  const auto token = take(partition_lease_name(message_group_partition("g")));
  EXPECT_EQ(claim({"o1", "o2"}, token), (std::vector<std::string>{"o1", "o2"}));
  conn->execute("DROP TABLE " + other);
  // A table of that name (which a migration at version 9 fails on) is said as a table.
  conn->execute("CREATE TABLE " + front + " (x INTEGER)");
  warnings = warnings_of(false);
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("taken by a table"), std::string::npos) << warnings[0];
  conn->execute("DROP TABLE " + front);
  warnings = warnings_of(false);  // no index of that name at all now
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("no index " + front), std::string::npos) << warnings[0];
  // The migration at the current version makes nothing again; the statement given does.
  migrate(*conn, table_);
  ASSERT_EQ(warnings_of(false).size(), 1U);
  const std::string make = statement_in(warnings[0]);
  ASSERT_FALSE(make.empty()) << warnings[0];
  conn->execute(make);
  EXPECT_TRUE(warnings_of(true).empty());
  EXPECT_EQ(front_index_key(*conn, table_),
            (std::vector<std::string>{"partition_no", "stream_seq"}));
  EXPECT_EQ(front_plan(*conn, table_).find("TEMP B-TREE"), std::string::npos);
  // Without the index of rows whose partition number is not a whole number, each cycle's look
  // for them reads the whole group index: said too, with the statement that makes it.
  conn->execute("DROP INDEX " + table_ + "_groups_fractional");
  warnings = warnings_of(true);
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("no index " + table_ + "_groups_fractional"), std::string::npos)
      << warnings[0];
  conn->execute(statement_in(warnings[0]));
  EXPECT_TRUE(warnings_of(true).empty());
  // Version 12's indexes of failing rows and of rows numbered outside the partitions: their names
  // taken by another table's indexes, the migration makes nothing (IF NOT EXISTS), said too.
  const std::string holder = table_ + "_holder";
  conn->execute("CREATE TABLE " + holder + " (message_group TEXT)");
  for (const char* suffix : {"_groups_failing", "_groups_outside"}) {
    conn->execute("DROP INDEX " + table_ + suffix);
    conn->execute("CREATE INDEX " + table_ + suffix + " ON " + holder + " (message_group)");
  }
  conn->execute("UPDATE outbox_schema_version SET version = 11 WHERE table_name = '" + table_ +
                "'");
  EXPECT_EQ(migrate(*conn, table_).to, kSchemaVersion);
  warnings = warnings_of(true);
  ASSERT_EQ(warnings.size(), 2U);
  for (const auto& warning : warnings) {
    EXPECT_NE(warning.find("taken by an index of table " + holder), std::string::npos) << warning;
  }
  conn->execute("DROP TABLE " + holder);
  for (const auto& warning : warnings) {
    conn->execute(statement_in(warning));
  }
  EXPECT_TRUE(warnings_of(true).empty());
  // A trigger of the name takes nothing from an index (triggers have names of their own).
  conn->execute("DROP INDEX " + front);
  conn->execute("CREATE TRIGGER " + front + " AFTER DELETE ON " + table_ + " BEGIN SELECT 1; END");
  warnings = warnings_of(false);
  ASSERT_EQ(warnings.size(), 1U);
  EXPECT_NE(warnings[0].find("no index " + front), std::string::npos) << warnings[0];
  conn->execute(statement_in(warnings[0]));
  EXPECT_TRUE(warnings_of(true).empty());
  conn->execute("DROP TRIGGER " + front);

  // The table as outbox made it, but stream_seq a plain column beside the rowid.
  const std::string own = table_ + "_own";
  table_like(*conn, table_, own, "stream_seq INTEGER PRIMARY KEY AUTOINCREMENT",
             "stream_seq INTEGER");
  create_schema_for(*conn, own);
  EXPECT_EQ(front_index_key(*conn, own), (std::vector<std::string>{"partition_no", "stream_seq"}));
  const auto plan = front_plan(*conn, own);
  EXPECT_NE(plan.find(own + "_groups_front"), std::string::npos) << plan;
  EXPECT_EQ(plan.find("TEMP B-TREE"), std::string::npos) << plan;
  conn->execute("DROP TABLE " + own);
}

TEST_P(GroupSchema, MigratingAgainChangesNothing) {
  write({grouped("m1", "g"), plain("m2")});
  auto conn = pool_->acquire();
  create_schema_for(*conn, table_);
  migrate(*conn, table_);
  migrate(*conn, table_);
  EXPECT_EQ(schema_version(*conn, table_), kSchemaVersion);
  EXPECT_EQ(ids_of(store_->poll_pending(*conn, Clock::system()->now() + 1s, 0us, 10)),
            (std::vector<std::string>{"m2"}));
  EXPECT_EQ(scan_ids(message_group_partition("g")), (std::vector<std::string>{"m1"}));
}

// SQLite keeps a partition number that is not a whole number as written (53.5 in an INTEGER
// column): it matched no partition's reads and counted as numbered, so the row was never
// delivered and the rows of its key written after it went first. It counts as none (schema
// version 11: found through an index of such rows), written before the migration, by an INSERT
// after it or by an UPDATE, and only the partition's holder numbers it; the other engines'
// integer columns round it.
TEST_P(GroupSchema, APartitionNumberThatIsNotAWholeNumberCountsAsNone) {
  auto conn = pool_->acquire();
  const std::string key = "acct-1";
  const int partition = message_group_partition(key);
  const std::string now =
      engine_is("sqlite") ? "0" : (engine_is("postgres") ? "now()" : "UTC_TIMESTAMP(6)");
  // A second key of the partition whose only row written so has no NULL one beside it.
  const std::string lone = keys_of_partition("lone-", partition, 1)[0];
  const auto insert = [&](const std::string& id, const std::string& number,
                          const std::string& group) {
    conn->execute("INSERT INTO " + table_ +
                  " (event_id, event_type, aggregate_type, payload, status, attempts, "
                  "available_at, created_at, message_group, partition_no) VALUES ('" +
                  id + "', 'Moved', 'Order', '{}', 0, 0, " + now + ", " + now + ", '" + group +
                  "', " + number + ")");
  };
  const auto type_of = [&](const std::string& id) {
    return conn
        ->query("SELECT typeof(partition_no) FROM " + table_ + " WHERE event_id = '" + id + "'")[0]
        .get_text(0);
  };
  const std::string half = std::to_string(partition) + ".5";
  std::vector<std::string> expected;
  if (engine_is("sqlite")) {
    // A table of version 10 (no index of such rows yet) with such a row.
    migrate(*conn, table_);
    conn->execute("DROP INDEX " + table_ + "_groups_fractional");
    conn->execute("UPDATE outbox_schema_version SET version = 10 WHERE table_name = '" + table_ +
                  "'");
    insert("a", half, key);
    EXPECT_EQ(migrate(*conn, table_).from, 10);
    expected.push_back("a");
  }
  const std::string quarter = std::to_string(partition) + ".25";
  insert("b", quarter, key);
  insert("c", "NULL", key);
  write({grouped("d", key)});
  insert("e", quarter, lone);
  write({grouped("f", lone)});
  expected.insert(expected.end(), {"b", "c", "d", "e", "f"});
  if (engine_is("sqlite")) {
    conn->execute("UPDATE " + table_ + " SET partition_no = " + half + " WHERE event_id = 'd'");
    for (const char* id : {"a", "b", "d", "e"}) {
      EXPECT_EQ(type_of(id), "real") << id;
    }
    const auto plan = conn->query(
        "EXPLAIN QUERY PLAN SELECT message_group FROM " + table_ +
        " WHERE status IN (0, 2) AND message_group IS NOT NULL AND typeof(partition_no) = 'real' "
        "AND partition_no <> CAST(partition_no AS INTEGER)");
    EXPECT_NE(plan.at(0).get_text(3).find(table_ + "_groups_fractional"), std::string::npos)
        << plan.at(0).get_text(3);
  }
  EXPECT_EQ(groups_->unassigned(*conn, {key}), std::vector<std::string>{key});
  if (engine_is("sqlite")) {
    EXPECT_EQ(groups_->unassigned(*conn, {lone}), std::vector<std::string>{lone});
  }
  EXPECT_EQ(groups_->find(*conn, key)->head_event_id, expected.front());
  // Numbered by no one but the partition's holder: not by a node that met the key elsewhere.
  EXPECT_EQ(groups_->repartition(*conn, key), 0);
  const auto other = take(partition_lease_name((partition + 1) % kMessageGroupPartitions));
  EXPECT_EQ(groups_->assign_partitions(*conn, {other}, 100), 0);
  const auto lease = take(partition_lease_name(partition));
  EXPECT_GT(groups_->assign_partitions(*conn, {lease}, 100), 0);
  EXPECT_EQ(scan_ids(partition), expected);
  EXPECT_TRUE(groups_->unassigned(*conn, {key, lone}).empty());
  if (engine_is("sqlite")) {
    EXPECT_EQ(type_of("a"), "integer");
    EXPECT_EQ(type_of("e"), "integer");
  }
}

// A column declared REAL keeps every number as a REAL: its 53.0 is a whole number and a partition
// number like any other (counted as none, the relay numbered it again every cycle and delivered
// nothing of the table's groups).
TEST_P(GroupSchema, APartitionColumnDeclaredRealHoldsWholeNumbers) {
  if (!engine_is("sqlite")) {
    EXPECT_FALSE(groups_->has_fronts());  // the other engines' columns are theirs to type
    return;
  }
  auto conn = pool_->acquire();
  migrate(*conn, table_);
  const std::string real = table_ + "_real";
  table_like(*conn, table_, real, "partition_no INTEGER", "partition_no REAL");
  migrate(*conn, real);
  const std::string key = "acct-1";
  const int partition = message_group_partition(key);
  for (const auto& [id, number] :
       {std::pair<std::string, std::string>{"x1", std::to_string(partition)}, {"x2", "NULL"}}) {
    conn->execute("INSERT INTO " + real +
                  " (event_id, event_type, aggregate_type, payload, available_at, created_at, "
                  "message_group, partition_no) VALUES ('" +
                  id + "', 'Moved', 'Order', '{}', 0, 0, '" + key + "', " + number + ")");
  }
  EXPECT_EQ(conn->query("SELECT typeof(partition_no) FROM " + real + " WHERE event_id = 'x1'")[0]
                .get_text(0),
            "real");
  const auto groups = detect_group_store(*conn, real);
  const auto lease = detect_lease_store(*conn, real)
                         ->acquire(*conn, partition_lease_name(partition), "relay-a", 30s);
  ASSERT_TRUE(lease);
  EXPECT_EQ(groups->unassigned(*conn, {key}), std::vector<std::string>{key});
  EXPECT_EQ(groups->assign_partitions(*conn, {*lease}, 100), 1);  // x2 only
  EXPECT_EQ(groups->assign_partitions(*conn, {*lease}, 100), 0);  // and then none, not x1 again
  EXPECT_TRUE(groups->unassigned(*conn, {key}).empty());
  std::vector<std::string> scanned;
  for (const auto& r : groups->scan(*conn, {{partition, "", 10}}, Clock::system()->now())) {
    scanned.push_back(r.event_id);
  }
  EXPECT_EQ(scanned, (std::vector<std::string>{"x1", "x2"}));
  testing::drop_outbox_tables(*conn, real);

  // Declared as text, the column keeps numbers as text ('41.0' matches no partition): said.
  const std::string text = table_ + "_text";
  table_like(*conn, table_, text, "partition_no INTEGER", "partition_no VARCHAR(8)");
  migrate(*conn, text);
  const auto warnings = warnings_while([&] {
    detect_group_store(*conn, text);
    detect_group_store(*conn, table_);
  });
  ASSERT_EQ(warnings.size(), 1U);  // the table's own (INTEGER) column is not named
  EXPECT_NE(warnings[0].find("partition_no is declared VARCHAR(8)"), std::string::npos)
      << warnings[0];
  testing::drop_outbox_tables(*conn, text);
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupSchema, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
