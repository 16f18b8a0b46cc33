// Message groups against what other processes do between a claim's statements: a store that
// delegates to the engine's own and runs a hook after one of them stands for another node, an
// operator or an outside writer acting at that very moment.

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "outbox/sql/dialect.hpp"
#include "outbox/sql/lease_store.hpp"
#include "tests/support/hooked_group_store.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::number_of;
using testing::wait_until;

class GroupRaces : public testing::HookedGroupFixture {
 protected:
  // A row of `group` as an outside client writes it: (id, its number, with its partition or
  // without, the client not having computed it).
  struct OutsideRow {
    std::string id;
    int n;
    bool partitioned;
  };
  // `rows` of `group` in one statement, in that order.
  std::string outside_rows(const std::string& group, const std::vector<OutsideRow>& rows) const {
    const auto& engine = GetParam().name;
    const std::string now = engine == "sqlite"     ? "0"
                            : engine == "postgres" ? "now()"
                                                   : "UTC_TIMESTAMP(6)";
    std::string sql = "INSERT INTO " + table_ +
                      " (event_id, event_type, aggregate_type, payload, headers, status, "
                      "attempts, available_at, created_at, message_group, partition_no) VALUES ";
    for (std::size_t i = 0; i < rows.size(); ++i) {
      const auto& r = rows[i];
      sql += (i == 0 ? "('" : ", ('") + r.id + "', 'E', NULL, '{\"n\":" + std::to_string(r.n) +
             "}', NULL, 0, 0, " + now + ", " + now + ", '" + group + "', " +
             (r.partitioned ? std::to_string(message_group_partition(group)) : "NULL") + ")";
    }
    return sql;
  }
  // Rows m0 … m<count - 1>, numbered 0 … count - 1, with their partition.
  static std::vector<OutsideRow> numbered_rows(int count) {
    std::vector<OutsideRow> rows;
    for (int n = 0; n < count; ++n) {
      rows.push_back({"m" + std::to_string(n), n, true});
    }
    return rows;
  }
  // Two rows of `group`: #0 without a partition, #1 with it.
  std::string outside_rows(const std::string& group) const {
    return outside_rows(group, {{"m0", 0, false}, {"m1", 1, true}});
  }

  // True when a runs() read asks for `group`.
  static bool reads(const std::vector<std::pair<int, std::string>>& asked,
                    const std::string& group) {
    return std::any_of(asked.begin(), asked.end(),
                       [&](const auto& g) { return g.second == group; });
  }
  // Starts the hooked node and waits until `group` has had `events` events delivered.
  ::testing::AssertionResult run_until_seen(const std::string& group, std::size_t events,
                                            const std::atomic<int>& stage,
                                            std::chrono::milliseconds timeout = 30s) {
    nodes_.front()->outbox->start();
    if (wait_until([&] { return ledger_.seen(group).size() == events; }, timeout)) {
      return ::testing::AssertionSuccess();
    }
    return ::testing::AssertionFailure()
           << "stage " << stage.load() << ", seen " << ledger_.seen(group).size();
  }
};

// A key's first row was written without a partition; its second, with it. The claim's read sees
// the second as the group's head; right then the first gets its partition (a relay numbers only
// the rows of partitions it holds: here a client does it). Found breaking order (the second row
// was claimed and delivered first); each run is read again before the claim, and a group whose
// head is no longer the one read waits for the next cycle.
TEST_P(GroupRaces, ARowGivenItsPartitionByAnotherNodeAfterTheReadIsNotOvertaken) {
  auto& hooks = hooked_node("node-a");
  const std::string group = "outside-key";
  const int partition = message_group_partition(group);
  // 0: rows not written yet; 1: written, the first one kept without a partition at each
  // assignment (as if written just after it); 2: the read saw the second as the head and the
  // first was given its partition at once.
  std::atomic<int> stage{0};
  hooks.after_assign = [&](sql::Connection& c) {
    int zero = 0;
    if (stage.compare_exchange_strong(zero, 1)) {
      c.execute(outside_rows(group));
    } else if (stage.load() == 1) {
      c.execute("UPDATE " + table_ + " SET partition_no = NULL WHERE event_id = 'm0'");
    }
  };
  hooks.after_read = [&](sql::Connection& c, const std::vector<GroupScanRow>& rows) {
    for (const auto& r : rows) {
      int one = 1;
      if (r.message_group == group && r.event_id == "m1" && stage.compare_exchange_strong(one, 2)) {
        c.execute("UPDATE " + table_ + " SET partition_no = " + std::to_string(partition) +
                  " WHERE event_id = 'm0'");
      }
    }
  };
  ASSERT_TRUE(run_until_seen(group, 2, stage));
  EXPECT_EQ(stage.load(), 2);  // the race was run
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// A group whose run ended with rows behind it (a follower) is claimed next without a scan, from
// the row its run's read saw behind it. Right before that claim reads the group's run, that row
// goes DEAD (an operator skipped it) and an outside writer adds two: #5 without a partition, #6
// with it. The read begins at #6; were it claimed, it would overtake #5. It is not (the head is
// not the one seen, and #5 has no partition yet): #5 goes first once it has its partition.
TEST_P(GroupRaces, AFollowerWhoseNextHeadMovedIsNotClaimedPastARowWithoutAPartition) {
  auto& hooks = hooked_node("node-a");
  const std::string group = "followed-key";
  auto first = numbered_rows(per_group_);
  first.push_back({"skipped", 99, true});  // the row the first run's read sees behind it
  // 0: the first run not delivered yet; 1: delivered, and the next read of the group was about
  // to begin: the row behind it went DEAD and the outside writer's rows were written right then.
  // (Done in the read's hook, not between cycles: a cycle may begin the next claim before any
  // other hook runs, and CI saw the skipped row delivered first.)
  std::atomic<int> stage{0};
  hooks.before_runs = [&](sql::Connection& c,
                          const std::vector<std::pair<int, std::string>>& asked) {
    int zero = 0;
    const bool ours = reads(asked, group);
    if (ours && ledger_.seen(group).size() == static_cast<std::size_t>(per_group_) &&
        stage.compare_exchange_strong(zero, 1)) {
      c.execute("UPDATE " + table_ + " SET status = " + sql::status_sql(EventStatus::Dead) +
                " WHERE event_id = 'skipped'");
      c.execute(
          outside_rows(group, {{"late-0", per_group_, false}, {"late-1", per_group_ + 1, true}}));
    }
  };
  nodes_.front()->pool->acquire()->execute(outside_rows(group, first));
  ASSERT_TRUE(run_until_seen(group, per_group_ + 2, stage));
  EXPECT_EQ(stage.load(), 1);  // the race was run
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// Between the cycle's question whether a picked group has rows without a partition and the read
// of the runs it claims, an outside writer adds #6 without one and the next writer #7 with it,
// behind a follower's expected head #5. The read sees #5 and #7 (#6, unnumbered, is not in the
// partition): asked before the read, the question had missed #6 and #7 overtook it on every
// engine. It is asked after the read.
TEST_P(GroupRaces, AFollowersRunIsNotClaimedPastARowWithoutAPartitionWrittenJustBeforeItsRead) {
  auto& hooks = hooked_node("node-a");
  const std::string group = "followed-key";
  const auto first = numbered_rows(per_group_ + 1);  // #5: the follower's next head
  std::atomic<int> stage{0};
  hooks.before_runs = [&](sql::Connection& c,
                          const std::vector<std::pair<int, std::string>>& asked) {
    int zero = 0;
    const bool ours = reads(asked, group);
    if (ours && ledger_.seen(group).size() == static_cast<std::size_t>(per_group_) &&
        stage.compare_exchange_strong(zero, 1)) {
      c.execute(outside_rows(
          group, {{"late-0", per_group_ + 1, false}, {"late-1", per_group_ + 2, true}}));
    }
  };
  nodes_.front()->pool->acquire()->execute(outside_rows(group, first));
  ASSERT_TRUE(run_until_seen(group, per_group_ + 3, stage));
  EXPECT_EQ(stage.load(), 1);  // the race was run
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// Between the question whether a picked group has rows without a partition and the claim, another
// client takes away the number of a row in the middle of the group's run (an UPDATE to NULL). The
// claim, which reads the rows in their partition, no longer finds it; the rows behind it went out
// before it (the run came back with a hole). A run ends at its first row the claim does not find.
TEST_P(GroupRaces, ARowWhoseNumberIsTakenAwayJustBeforeTheClaimIsNotOvertaken) {
  auto& hooks = hooked_node("node-a");
  const std::string group = "unnumbered-key";
  std::atomic<int> stage{0};
  hooks.before_claim = [&](sql::Connection& c, const std::vector<std::string>& ids) {
    int zero = 0;
    if (std::find(ids.begin(), ids.end(), "m1") != ids.end() &&
        stage.compare_exchange_strong(zero, 1)) {
      c.execute("UPDATE " + table_ + " SET partition_no = NULL WHERE event_id = 'm1'");
    }
  };
  nodes_.front()->pool->acquire()->execute(outside_rows(group, numbered_rows(per_group_)));
  ASSERT_TRUE(run_until_seen(group, static_cast<std::size_t>(per_group_), stage));
  EXPECT_EQ(stage.load(), 1);  // the race was run
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// The same race on a group's first run (a scan's pick): #1 without a partition and #2 with it are
// written right before the run is read.
TEST_P(GroupRaces, AScansPickIsNotClaimedPastARowWithoutAPartitionWrittenJustBeforeItsRead) {
  auto& hooks = hooked_node("node-a");
  const std::string group = "scanned-key";
  std::atomic<int> stage{0};
  hooks.before_runs = [&](sql::Connection& c,
                          const std::vector<std::pair<int, std::string>>& asked) {
    int zero = 0;
    const bool ours = reads(asked, group);
    if (ours && stage.compare_exchange_strong(zero, 1)) {
      c.execute(outside_rows(group, {{"late-0", 1, false}, {"late-1", 2, true}}));
    }
  };
  nodes_.front()->pool->acquire()->execute(outside_rows(group, {{"m0", 0, true}}));
  ASSERT_TRUE(run_until_seen(group, 3, stage));
  EXPECT_EQ(stage.load(), 1);
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// No hook: writers of each key alternate an outside client's row without a partition
// (even numbers) and this library's writer (odd numbers, with it), each committed before the next
// is written (the per-key serialization the documentation asks for), while the relay delivers.
TEST_P(GroupRaces, OutsideRowsWithoutAPartitionInterleavedWithNativeWritesKeepTheirOrder) {
  constexpr int kKeys = 4;
  constexpr int kPerKey = 100;
  auto& a = node("node-a");
  // A backlog of long groups: the poller's cycles are followers' and scans' meanwhile.
  std::vector<std::string> busy;
  for (int g = 0; g < 40; ++g) {
    busy.push_back("backlog-" + std::to_string(g));
  }
  insert_rows(a, busy, 60);
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return a.partitions_held() > 0; }));
  std::vector<std::jthread> writers;
  for (int k = 0; k < kKeys; ++k) {
    writers.emplace_back([&, k] {
      const std::string key = "mixed-" + std::to_string(k);
      for (int n = 0; n < kPerKey; ++n) {
        if (n % 2 == 0) {
          a.pool->acquire()->execute(
              outside_rows(key, {{key + "-o" + std::to_string(n), n, false}}));
        } else {
          a.write(key, n);
        }
      }
    });
  }
  writers.clear();
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(kPerKey) == kKeys; }, 60s))
      << ledger_.complete_groups(kPerKey);
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(60) == 40; }, 60s));
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// Long groups (many runs each: followers all along) handed over while they flow: a node
// joins, another leaves, events fail once and are retried after their backoff meanwhile.
TEST_P(GroupRaces, LongGroupsHandedOverWhileTheyFlowKeepTheirOrderAndLoseNothing) {
  constexpr int kGroups = 30;
  constexpr int kPerGroup = 100;
  std::mutex failed_mutex;
  std::set<std::string> failed_once;
  fail_ = [&](const EventEnvelope& e) {
    std::this_thread::sleep_for(5ms);  // a slow endpoint: the hand-overs happen mid-flow
    if (number_of(e) % 7 != 3) {
      return false;
    }
    std::lock_guard lock(failed_mutex);
    return failed_once.insert(*e.message_group() + "/" + std::to_string(number_of(e))).second;
  };
  auto& a = node("node-a", GroupFailurePolicy::Block, 5);
  auto& b = node("node-b", GroupFailurePolicy::Block, 5);
  std::vector<std::string> keys;
  for (int g = 0; g < kGroups; ++g) {
    keys.push_back("long-" + std::to_string(g));
  }
  insert_rows(a, keys, kPerGroup);
  a.outbox->start();
  b.outbox->start();
  ASSERT_TRUE(wait_until([&] { return ledger_.by_node()["node-a"] > 300; }, 30s));
  auto& c = node("node-c", GroupFailurePolicy::Block, 5);
  c.outbox->start();
  ASSERT_TRUE(wait_until([&] { return c.partitions_held() > 0; }, 30s));
  ASSERT_TRUE(wait_until([&] { return ledger_.by_node()["node-c"] > 50; }, 30s));
  a.outbox->close();
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(kPerGroup) == kGroups; }, 60s))
      << ledger_.complete_groups(kPerGroup);
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
  EXPECT_EQ(ledger_.repeats(), 0);
}

// DONE marks that fail (a trigger refuses them for two rows in a later run of a long
// group) while the group is a follower: the group is not busy once the failed marks are dropped,
// its delivered rows are still pending, and its next run must not start from the head the read
// saw behind them. Repeats are allowed (a failure); order is not broken, nothing is lost.
TEST_P(GroupRaces, FailedDoneMarksOfARunDoNotLetTheGroupsNextRunOvertakeIt) {
  const auto& engine = GetParam().name;
  if (engine == "mysql") {
    GTEST_SKIP() << "the refusing trigger is written for SQLite and PostgreSQL";
  }
  constexpr int kEvents = 30;
  auto& a = node("node-a");
  const std::string group = "done-fails";
  std::vector<OutsideRow> rows;
  for (int n = 0; n < kEvents; ++n) {
    rows.push_back({"dm-" + std::to_string(n), n, true});
  }
  auto conn = a.pool->acquire();
  const std::string done = sql::status_sql(EventStatus::Done);
  const std::string refused = "('dm-7', 'dm-8', 'dm-13')";
  if (engine == "sqlite") {
    conn->execute("CREATE TRIGGER refuse_done BEFORE UPDATE OF status ON " + table_ +
                  " WHEN NEW.status = " + done + " AND OLD.event_id IN " + refused +
                  " BEGIN SELECT RAISE(ABORT, 'refused'); END");
  } else {
    conn->execute("CREATE FUNCTION " + table_ +
                  "_refuse() RETURNS trigger AS $$ BEGIN RAISE EXCEPTION 'refused'; END $$ "
                  "LANGUAGE plpgsql");
    conn->execute("CREATE TRIGGER refuse_done BEFORE UPDATE ON " + table_ +
                  " FOR EACH ROW WHEN (NEW.status = " + done + " AND OLD.event_id IN " + refused +
                  ") EXECUTE FUNCTION " + table_ + "_refuse()");
  }
  conn->execute(outside_rows(group, rows));
  a.outbox->start();
  // Each refused row is delivered, its mark fails, and it is delivered again, for a while.
  ASSERT_TRUE(wait_until([&] { return ledger_.repeats() >= 6; }, 30s)) << ledger_.repeats();
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
  if (engine == "sqlite") {
    conn->execute("DROP TRIGGER refuse_done");
  } else {
    conn->execute("DROP TRIGGER refuse_done ON " + table_);
    conn->execute("DROP FUNCTION " + table_ + "_refuse()");
  }
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(kEvents) == 1; }, 30s));
  ASSERT_TRUE(wait_until([&] { return a.store->count_by_status(*conn)[1] == kEvents; }, 30s));
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// A planned hand-over (a node joins) between a claim's read and the claimed rows reaching the
// dispatcher: the partition's lease is released when nothing of it is held here, and the rows
// just claimed were not held yet. They must not be delivered twice: the old node's workers see
// the partition no longer held and leave them; the new holder claims and delivers them, once,
// in order.
TEST_P(GroupRaces, RowsClaimedJustBeforeTheirPartitionIsHandedOverAreDeliveredOnce) {
  constexpr int kPerKey = 1;
  std::vector<std::string> keys(kMessageGroupPartitions);  // one key in every partition
  for (int i = 0, found = 0; found < kMessageGroupPartitions; ++i) {
    const std::string key = "hand-" + std::to_string(i);
    auto& slot = keys[static_cast<std::size_t>(message_group_partition(key))];
    if (slot.empty()) {
      slot = key;
      ++found;
    }
  }
  // 64 rows, one claim takes them all: a poller batch is 100 rows, and each group counts as
  // per_group rows of it.
  max_groups_ = kMessageGroupPartitions;
  per_group_ = 1;
  auto& hooks = hooked_node("node-a");
  auto& a = *nodes_.back();
  auto& b = node("node-b");
  // 0: nothing claimed yet; 1: a claim read its rows, node-b joined and took over at least one of
  // its partitions before the rows went on; 2: the same, but no claimed partition moved in time.
  std::atomic<int> stage{0};
  std::atomic<int> moved{0};
  hooks.after_claim = [&](const std::vector<OutboxEvent>& rows) {
    int zero = 0;
    if (rows.empty() || !stage.compare_exchange_strong(zero, 2)) {
      return;
    }
    std::set<int> claimed;
    for (const auto& r : rows) {
      claimed.insert(r.partition_no.value_or(-1));
    }
    b.outbox->start();
    const bool taken = wait_until(
        [&] {
          int n = 0;
          for (const int p : claimed) {
            n += b.leases->token(partition_lease_name(p)) ? 1 : 0;
          }
          moved = n;
          return n > 0;
        },
        20s);
    if (taken) {
      stage = 1;
    }
  };
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return a.partitions_held() == kMessageGroupPartitions; }, 20s));
  insert_rows(a, keys, kPerKey);  // claimed in one go from every partition
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(kPerKey) == keys.size(); }, 60s))
      << "stage " << stage.load() << ", complete " << ledger_.complete_groups(kPerKey);
  EXPECT_EQ(stage.load(), 1);  // the race was run
  EXPECT_GT(moved.load(), 0);
  EXPECT_GT(ledger_.by_node()["node-b"], 0);
  EXPECT_EQ(ledger_.repeats(), 0);
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// A run read under a partition's lease, and before it reaches the dispatcher the lease lapses:
// another relay takes the partition, delivers the run (its rows DONE) and leaves, and this node
// takes the partition again, under a new epoch. The rows read under the old epoch must not go out
// from here (the group may be past them by now): they are left in the table.
TEST_P(GroupRaces, ARunReadBeforeItsPartitionLapsedIsNotDeliveredUnderTheNextHolding) {
  auto& hooks = hooked_node("node-a");
  auto& a = *nodes_.back();
  const std::string group = "lapsed-key";
  const int partition = message_group_partition(group);
  const std::string lease = partition_lease_name(partition);
  // 0: not claimed yet; 1: claimed, taken over, delivered elsewhere and regained here; 2: the
  // same, but the partition was not regained in time.
  std::atomic<int> stage{0};
  std::atomic<std::int64_t> regained_epoch{0};
  hooks.after_claim = [&](const std::vector<OutboxEvent>& rows) {
    int zero = 0;
    if (rows.empty() || rows.front().message_group != group ||
        !stage.compare_exchange_strong(zero, 2)) {
      return;
    }
    const auto before = a.leases->token(lease);
    auto conn = a.pool->acquire();
    const std::string leases = sql::lease_table_name(table_);
    conn->execute("UPDATE " + leases + " SET owner = 'node-x', epoch = epoch + 1 WHERE name = '" +
                  lease + "'");
    std::string ids;
    for (const auto& r : rows) {
      ids += (ids.empty() ? "'" : ", '") + r.event_id + "'";
    }
    conn->execute("UPDATE " + table_ + " SET status = " + sql::status_sql(EventStatus::Done) +
                  " WHERE event_id IN (" + ids + ")");
    conn->execute("UPDATE " + leases + " SET owner = NULL, expires_at = NULL WHERE name = '" +
                  lease + "'");
    if (wait_until(
            [&] {
              const auto now = a.leases->token(lease);
              return before && now && now->epoch > before->epoch;
            },
            20s)) {
      regained_epoch = a.leases->token(lease)->epoch;
      stage = 1;
    }
  };
  insert_rows(a, {group}, 3);
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return stage.load() != 0; }, 20s));
  // Left in the table, not delivered: dropped as not held under their holding.
  ASSERT_TRUE(wait_until([&] { return a.outbox->dispatcher()->inactive_dropped() >= 1; }, 20s));
  EXPECT_EQ(stage.load(), 1);
  EXPECT_GT(regained_epoch.load(), 0);
  EXPECT_TRUE(ledger_.seen(group).empty());
}

// Events taken together for a batch listener that, when the batch is formed, has none for them
// any more (a registry changed meanwhile) go one by one: each is asked again whether its
// partition is still held under the holding it was read under. The first one's slow delivery
// outlasts the holding; the second is left in the table and delivered only under the next one.
TEST_P(GroupRaces, EventsOfATakeDeliveredOneByOneAreNotDeliveredAfterTheirPartitionLapsed) {
  std::atomic<int> asked{0};
  // Asked once per event as it is queued, then again as the take is processed.
  batch_for_ = [&](std::string_view) { return ++asked <= 2; };
  auto& a = node("node-a", GroupFailurePolicy::Block, 3, true);
  const std::string group = "lapses-between-singles";
  const std::string lease = partition_lease_name(message_group_partition(group));
  std::atomic<std::int64_t> lapsed_epoch{0};
  std::atomic<std::int64_t> second_under{0};  // the epoch event 1 went out under; -1: none held
  fail_ = [&](const EventEnvelope& e) {
    if (number_of(e) == 0 && lapsed_epoch.load() == 0) {
      const auto held = a.leases->token(lease);
      auto conn = a.pool->acquire();
      conn->execute("UPDATE " + sql::lease_table_name(table_) +
                    " SET owner = 'node-x', epoch = epoch + 1 WHERE name = '" + lease + "'");
      EXPECT_TRUE(wait_until([&] { return !a.leases->token(lease); }, 20s));
      lapsed_epoch = held ? held->epoch : -1;
    } else if (number_of(e) == 1) {
      const auto now = a.leases->token(lease);
      second_under = now ? now->epoch : -1;
    }
    return false;
  };
  insert_rows(a, {group}, 2);
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return ledger_.complete_groups(2) == 1; }, 30s));
  EXPECT_GT(a.outbox->dispatcher()->inactive_dropped(), 0U);
  EXPECT_GT(lapsed_epoch.load(), 0);
  EXPECT_GT(second_under.load(), lapsed_epoch.load())
      << "delivered under no holding or the old one";
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// repartition() (called by any node whose scan meets a key's row in a partition not its
// own) also numbers the key's rows whose partition_no is out of range, unfenced. A key of
// partition P (held by node-a): #0 out of range (an outside client's), #1 right, #2 in range but
// in Q (held by node-b). node-a's read sees #1 as the head (#0 is in no partition); right after it,
// node-b's scan of Q meets #2 and repartitions the key, giving #0 its number P; node-a then asks
// which picked groups have rows without a partition: none. #1 must not be claimed before #0.
// (#2 comes after #1: the documented limitation, a misplaced row going first, is not what is
// tested.) Found breaking order on every engine: repartition() numbered out-of-range rows too.
TEST_P(GroupRaces, AnOutOfRangeRowNumberedByAnotherNodesRepartitionAfterTheReadIsNotOvertaken) {
  auto& hooks = hooked_node("node-a");
  auto& b = node("node-b");  // never started: holds partition Q only, through its lease manager
  std::string group;
  for (int i = 0; group.empty(); ++i) {
    const std::string k = "misnumbered-" + std::to_string(i);
    if (message_group_partition(k) != 0) {
      group = k;
    }
  }
  const int partition = message_group_partition(group);
  const int q = partition == 1 ? 2 : 1;  // node-b's
  b.leases->keep(partition_lease_name(q));
  b.leases->start();
  ASSERT_TRUE(wait_until([&] { return b.leases->token(partition_lease_name(q)).has_value(); }));
  const auto& engine = GetParam().name;
  const std::string now = engine == "sqlite"     ? "0"
                          : engine == "postgres" ? "now()"
                                                 : "UTC_TIMESTAMP(6)";
  auto row_sql = [&](const std::string& id, int n, int partition_no) {
    return "('" + id + "', 'E', NULL, '{\"n\":" + std::to_string(n) + "}', NULL, 0, 0, " + now +
           ", " + now + ", '" + group + "', " + std::to_string(partition_no) + ")";
  };
  const std::string insert =
      "INSERT INTO " + table_ +
      " (event_id, event_type, aggregate_type, payload, headers, status, attempts, available_at, "
      "created_at, message_group, partition_no) VALUES " +
      row_sql("x0", 0, 100) + ", " + row_sql("x1", 1, partition) + ", " + row_sql("x2", 2, q);
  // 0: nothing written; 1: written right after node-a's assignment (#0 not numbered by it);
  // 2: node-a's runs read, and node-b repartitioned the key right then.
  std::atomic<int> stage{0};
  hooks.after_assign = [&](sql::Connection& c) {
    int zero = 0;
    if (nodes_.front()->leases->token(partition_lease_name(partition)) &&
        stage.compare_exchange_strong(zero, 1)) {
      c.execute(insert);
    }
  };
  hooks.after_runs = [&](sql::Connection& c,
                         const std::vector<std::pair<int, std::string>>& asked) {
    int one = 1;
    const bool ours = reads(asked, group);
    if (ours && stage.compare_exchange_strong(one, 2)) {
      b.groups->repartition(c, group);  // node-b's scan of Q, on meeting #2
    }
  };
  ASSERT_TRUE(run_until_seen(group, 3, stage, 20s));
  EXPECT_EQ(stage.load(), 2);  // the race was run
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// assign_partitions() numbers only the groups of partitions held here, and reads the groups with
// rows without a partition 500 at a time, each call after where the last one stopped (it read
// the same first 500 every cycle, and the group below waited for the crashed node's leases). A node
// that crashed holding 63 partitions (its leases not expired yet) left 600 such groups behind;
// the surviving node holds the 64th, where one group of an outside client waits with a row left
// NULL. It should be delivered while the crashed node's leases run out.
TEST_P(GroupRaces, RowsLeftWithoutAPartitionAreNumberedWhileOtherPartitionsHold500SuchGroups) {
  constexpr int kForeign = 600;
  const std::string group = "zz-survivor";
  const int mine = message_group_partition(group);
  auto& a = node("node-a");
  {
    auto conn = a.pool->acquire();
    const auto leases = detect_lease_store(*conn, table_);
    for (int p = 0; p < kMessageGroupPartitions; ++p) {
      if (p != mine) {
        ASSERT_TRUE(leases->acquire(*conn, partition_lease_name(p), "node-crashed", 60s));
      }
    }
    const auto& engine = GetParam().name;
    const std::string now = engine == "sqlite"     ? "0"
                            : engine == "postgres" ? "now()"
                                                   : "UTC_TIMESTAMP(6)";
    std::string sql = "INSERT INTO " + table_ +
                      " (event_id, event_type, aggregate_type, payload, headers, status, "
                      "attempts, available_at, created_at, message_group, partition_no) VALUES ";
    int written = 0;
    for (int i = 0; written < kForeign; ++i) {
      const std::string key = "aa-foreign-" + std::to_string(i);
      if (message_group_partition(key) == mine) {
        continue;
      }
      sql += (written++ == 0 ? "('" : ", ('") + key + "', 'E', NULL, '{\"n\":0}', NULL, 0, 0, " +
             now + ", " + now + ", '" + key + "', NULL)";
    }
    conn->execute(sql);
    conn->execute(outside_rows(group, {{"survivor-0", 0, false}}));
  }
  a.outbox->start();
  const auto started = std::chrono::steady_clock::now();
  // Well within the crashed node's 60 s: without the resuming read it waited for all of them.
  const bool delivered = wait_until([&] { return ledger_.seen(group).size() == 1U; }, 30s);
  const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - started);
  EXPECT_TRUE(delivered) << "not delivered after " << waited.count() << " ms, holding "
                         << a.partitions_held() << " partition(s)";
}

// The partition's lease moved to "node-x" in the database (as a lapse and another
// relay's acquisition leave it), for 60 s; its token.
namespace moved {
inline LeaseToken move_lease_to_x(sql::Connection& c, const std::string& table,
                                  const std::string& lease) {
  // One transaction: between the two statements the holder's lease manager could take the freed
  // lease again (seen in a full suite run on SQLite).
  const auto store = detect_lease_store(c, table);
  c.begin();
  std::optional<LeaseToken> token;
  try {
    c.execute("UPDATE " + sql::lease_table_name(table) +
              " SET owner = NULL, expires_at = NULL WHERE name = '" + lease + "'");
    token = store->acquire(c, lease, "node-x", 60s);
    c.commit();
  } catch (...) {
    c.rollback();
    throw;
  }
  if (!token) {
    throw std::runtime_error("node-x could not take " + lease);
  }
  return *token;
}
}  // namespace moved

// Found by a hostile round: a failure was written after the partition had moved (the lock taken
// for it did not shut the deposed node out, since a claim no longer locks rows). node-a's
// delivery of a group's head fails for good (Block, one attempt); right after its hold, another
// relay tries to take the partition (the lease lapsed). The hold and the failure's write are one
// transaction with the lease row share-locked: the takeover waits until the block is written
// under the lease node-a still held, and lands after it; node-a then holds nothing of it.
TEST_P(GroupRaces, ATakeoverWaitsForAFailureBeingWrittenUnderTheLease) {
  auto& hooks = hooked_node("node-a", GroupFailurePolicy::Block, 1);
  auto& a = *nodes_.back();
  const std::string group = "moved-key";
  const std::string lease = partition_lease_name(message_group_partition(group));
  std::atomic<bool> failed{false};
  fail_ = [&](const EventEnvelope& e) { return number_of(e) == 0 && !failed.exchange(true); };
  // 0: not held yet; 1: held, and the takeover had not landed while node-a's transaction was open.
  std::atomic<int> stage{0};
  std::atomic<bool> taken{false};
  std::jthread takeover;
  LeaseToken x;
  hooks.after_hold = [&](sql::Connection&, std::string_view, bool held) {
    int zero = 0;
    if (!held || !stage.compare_exchange_strong(zero, 2)) {
      return;
    }
    takeover = std::jthread([&] {
      auto c = a.pool->acquire();
      x = moved::move_lease_to_x(*c, table_, lease);
      taken = true;
    });
    // Absent while the hold's transaction is open (a bounded look: it can only pass wrongly).
    if (!wait_until([&] { return taken.load(); }, 300ms)) {
      stage = 1;
    }
  };
  nodes_.front()->pool->acquire()->execute(outside_rows(group, numbered_rows(3)));
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return taken.load(); }, 30s));
  takeover.join();
  EXPECT_EQ(stage.load(), 1) << "the takeover landed between node-a's hold and its write";
  auto conn = a.pool->acquire();
  // node-a's block, written while it held the lease, stands: the head failed for good.
  EXPECT_FALSE(a.groups->blocked(*conn, {group}).empty());
  EXPECT_EQ(row("m0")->attempts, 1);
  EXPECT_EQ(x.owner, "node-x");
  ASSERT_TRUE(wait_until([&] { return !a.leases->token(lease).has_value(); }, 20s));
}

// Found by a hostile round (node-a's DONE mark landed on the head node-x had blocked, and the
// group waited for an operator behind a head that was done). node-a's publish of a group's head
// takes longer than its lease: meanwhile the lease lapses, node-x takes the partition, reads the
// group, the head fails for good there and node-x blocks the group (under its live lease). node-a
// sees its lease gone, then its publish succeeds and its DONE mark is written. The head must not
// end DONE with its group left blocked: m1 and m2, which never failed, would wait for an operator.
TEST_P(GroupRaces, ASlowPublishOfTheDeposedHolderDoesNotLeaveTheGroupBlockedOnADoneHead) {
  auto& a = node("node-a");
  const std::string group = "slow-key";
  const std::string lease = partition_lease_name(message_group_partition(group));
  // 0: not published yet; 1: node-x blocked the group and node-a saw its lease gone during
  // node-a's publish of m0; 2: the same, but node-a did not see it in time.
  std::atomic<int> stage{0};
  LeaseToken x;
  fail_ = [&](const EventEnvelope& e) {
    int zero = 0;
    if (number_of(e) != 0 || !stage.compare_exchange_strong(zero, 3)) {
      return false;
    }
    auto c = a.pool->acquire();
    const auto now = Clock::system()->now();
    try {
      x = moved::move_lease_to_x(*c, table_, lease);
    } catch (...) {
      stage = 2;
      throw;
    }
    const auto read = a.groups->claim(*c, {x}, {"m0", "m1", "m2"});
    // node-x's publish of m0 failed for good: it holds the row and blocks the group.
    if (read.size() == 3 && a.groups->hold(*c, "m0", x, "node-x", now) &&
        a.groups->block(*c, "m0", group, "node-x: endpoint refused m0", now, "node-x") &&
        wait_until([&] { return !a.leases->token(lease).has_value(); }, 10s)) {
      stage = 1;
    } else {
      stage = 2;
    }
    return false;  // node-a's (slow) publish succeeds
  };
  nodes_.front()->pool->acquire()->execute(outside_rows(group, numbered_rows(3)));
  a.outbox->start();
  ASSERT_TRUE(wait_until([&] { return stage.load() == 1 || stage.load() == 2; }, 20s));
  EXPECT_EQ(stage.load(), 1);
  auto conn = a.pool->acquire();
  const bool done = wait_until([&] { return row("m0")->status == EventStatus::Done; }, 3s);
  auto info = a.groups->find(*conn, group);
  EXPECT_TRUE(done);  // delivered by node-a: its DONE mark counts
  EXPECT_FALSE(done && info && info->blocked) << "m0 is DONE and its group is still blocked";
  // Blocked, if at all, on the head that failed (still pending), not on m1, which never failed.
  EXPECT_TRUE(!info || !info->blocked || info->head_event_id == "m0");
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupRaces, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
