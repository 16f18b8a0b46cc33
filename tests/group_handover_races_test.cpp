// Message groups against a partition's hand-over between a claim's statements: a planned one (a
// node joins), a lease that lapses and another relay's takeover, a repartition by another node, a
// failure being written under the lease as the partition moves. Nothing is delivered twice
// without a crash, nothing under a holding that is no longer this node's, and every key stays in
// order.

#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "outbox/sql/lease_store.hpp"
#include "tests/support/group_races_fixture.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::number_of;
using testing::wait_until;

class GroupHandoverRaces : public testing::GroupRacesFixture {};

// A planned hand-over (a node joins) between a claim's read and the claimed rows reaching the
// dispatcher: the partition's lease is released when nothing of it is held here, and the rows
// just claimed were not held yet. They must not be delivered twice: the old node's workers see
// the partition no longer held and leave them; the new holder claims and delivers them, once,
// in order.
TEST_P(GroupHandoverRaces, RowsClaimedJustBeforeTheirPartitionIsHandedOverAreDeliveredOnce) {
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
  std::atomic<int> claimed_partitions{0};
  hooks.after_claim = [&](const std::vector<OutboxEvent>& rows) {
    int zero = 0;
    if (rows.empty() || !stage.compare_exchange_strong(zero, 2)) {
      return;
    }
    std::set<int> claimed;
    for (const auto& r : rows) {
      claimed.insert(r.partition_no.value_or(-1));
    }
    claimed_partitions = static_cast<int>(claimed.size());
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
  EXPECT_EQ(stage.load(), 1) << "the race was not run: node-b holds " << b.partitions_held()
                             << " partition(s), none of the " << claimed_partitions.load()
                             << " the claim read from";
  EXPECT_GT(moved.load(), 0);
  EXPECT_GT(ledger_.by_node()["node-b"], 0);
  EXPECT_EQ(ledger_.repeats(), 0);
  EXPECT_EQ(ledger_.violations(), std::vector<std::string>{});
}

// A run read under a partition's lease, and before it reaches the dispatcher the lease lapses:
// another relay takes the partition, delivers the run (its rows DONE) and leaves, and this node
// takes the partition again, under a new epoch. The rows read under the old epoch must not go out
// from here (the group may be past them by now): they are left in the table.
TEST_P(GroupHandoverRaces, ARunReadBeforeItsPartitionLapsedIsNotDeliveredUnderTheNextHolding) {
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
TEST_P(GroupHandoverRaces, EventsOfATakeDeliveredOneByOneAreNotDeliveredAfterTheirPartitionLapsed) {
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
TEST_P(GroupHandoverRaces,
       AnOutOfRangeRowNumberedByAnotherNodesRepartitionAfterTheReadIsNotOvertaken) {
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
  const std::string now = sql_now();
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
TEST_P(GroupHandoverRaces,
       RowsLeftWithoutAPartitionAreNumberedWhileOtherPartitionsHold500SuchGroups) {
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
    const std::string now = sql_now();
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
TEST_P(GroupHandoverRaces, ATakeoverWaitsForAFailureBeingWrittenUnderTheLease) {
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
TEST_P(GroupHandoverRaces, ASlowPublishOfTheDeposedHolderDoesNotLeaveTheGroupBlockedOnADoneHead) {
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

INSTANTIATE_TEST_SUITE_P(Engines, GroupHandoverRaces, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
