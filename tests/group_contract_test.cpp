// Message groups in the table on every engine: the group key and its partition are stored by the
// writer (and assigned to rows other clients wrote without one), claims of ungrouped rows never
// take grouped ones, claims are fenced by the partition's lease, and the failure policies and
// operators' actions change what they say. The claim path's reads: group_reads_test.cpp.

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <variant>
#include <vector>

#include "outbox/errors.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/group_store.hpp"
#include "tests/support/group_contract_fixture.hpp"
#include "tests/support/plan_checking.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::grouped;
using testing::ids_of;
using testing::keys_of_partition;
using testing::plain;
using testing::PlanChecking;

class GroupContract : public testing::GroupContractFixture {};

TEST_P(GroupContract, TheGroupAndItsPartitionAreStoredAndReadBack) {
  write({grouped("g1", "order-123"), plain("p1")});
  auto conn = pool_->acquire();
  const auto row = store_->find(*conn, "g1");
  ASSERT_TRUE(row);
  EXPECT_EQ(row->message_group, "order-123");
  EXPECT_EQ(row->partition_no, message_group_partition("order-123"));
  EXPECT_EQ(to_envelope(*row, JsonCodec::default_codec()).message_group(), "order-123");
  const auto other = store_->find(*conn, "p1");
  EXPECT_FALSE(other->message_group);
  EXPECT_FALSE(other->partition_no);
  if (engine_is("mysql")) {
    // The partition is CRC-32 mod 64, as MariaDB's own CRC32() computes it.
    EXPECT_EQ(conn->query("SELECT CRC32('order-123') % 64")[0].get_int(0),
              message_group_partition("order-123"));
  }
}

TEST_P(GroupContract, ClaimsAndPollsOfUngroupedRowsNeverTakeGroupedOnes) {
  write({grouped("g1", "a"), plain("p1"), grouped("g2", "b"), plain("p2")});
  auto conn = pool_->acquire();
  const auto now = Clock::system()->now() + 1s;
  EXPECT_EQ(ids_of(store_->poll_pending(*conn, now, 0us, 100)),
            (std::vector<std::string>{"p1", "p2"}));
  EXPECT_EQ(ids_of(store_->claim_pending(*conn, "node", now, 30s, 0us, 100)),
            (std::vector<std::string>{"p1", "p2"}));
  // Still pending as far as the operators' counts go.
  EXPECT_EQ(store_->count_by_status(*conn)[0], 4);
  EXPECT_TRUE(store_->oldest_pending(*conn));
}

TEST_P(GroupContract, AClaimNeedsThePartitionLeaseLiveInTheDatabase) {
  write({grouped("e1", "acct-9"), grouped("e2", "acct-9")});
  const int p = message_group_partition("acct-9");
  const auto token = take(partition_lease_name(p));
  auto conn = pool_->acquire();
  const auto now = Clock::system()->now();
  const auto read = [&](const LeaseToken& t, const std::vector<std::string>& ids) {
    return ids_of(groups_->claim(*conn, {t}, ids));
  };
  // The lease of another partition, or an old epoch, reads and holds nothing; a lease that is no
  // partition's is refused.
  const auto other = take(partition_lease_name((p + 1) % kMessageGroupPartitions));
  EXPECT_TRUE(read(other, {"e1", "e2"}).empty());
  EXPECT_FALSE(groups_->hold(*conn, "e1", other, "relay-a", now));
  const auto leader = take("leader");
  EXPECT_THROW(read(leader, {"e1"}), std::invalid_argument);
  EXPECT_THROW(groups_->hold(*conn, "e1", leader, "relay-a", now), std::invalid_argument);
  LeaseToken stale = token;
  stale.epoch -= 1;
  EXPECT_TRUE(read(stale, {"e1", "e2"}).empty());
  EXPECT_FALSE(groups_->hold(*conn, "e1", stale, "relay-a", now));
  // The claim reads, in the order asked, and writes nothing: the lease holds the rows.
  EXPECT_EQ(read(token, {"e2", "e1"}), (std::vector<std::string>{"e2", "e1"}));
  EXPECT_FALSE(store_->find(*conn, "e1")->locked_by);
  // A hold (before a failure is written) locks the row for its owner.
  ASSERT_TRUE(groups_->hold(*conn, "e1", token, "relay-a", now));
  EXPECT_EQ(store_->find(*conn, "e1")->locked_by, "relay-a");
  // Released, then taken by another relay: the first relay's token reads and holds nothing any
  // more, and the new holder holds over the old holder's lock.
  ASSERT_TRUE(leases_->release(*conn, token));
  const auto taken = take(partition_lease_name(p), "relay-b");
  EXPECT_TRUE(read(token, {"e1"}).empty());
  EXPECT_FALSE(groups_->hold(*conn, "e1", token, "relay-a", now));
  EXPECT_EQ(read(taken, {"e1"}), (std::vector<std::string>{"e1"}));
  ASSERT_TRUE(groups_->hold(*conn, "e1", taken, "relay-b", now));
  // The old holder's failure writes are refused: the row is held by another.
  EXPECT_EQ(store_->mark_retry(*conn, "e1", now, 0ms, "HTTP 503", "relay-a"), 0);
  EXPECT_EQ(store_->mark_dead(*conn, "e1", now, "bad", true, "relay-a"), 0);
  EXPECT_FALSE(groups_->block(*conn, "e1", "acct-9", "boom", now, "relay-a"));
  // A DONE mark says the row was delivered, whoever delivered it: counted from any relay (a
  // grouped row is not locked while it is delivered).
  EXPECT_EQ(store_->mark_done(*conn, "e2", now, "relay-a"), 1);
  EXPECT_EQ(store_->mark_done(*conn, "e1", now, "relay-a"), 1);
  EXPECT_EQ(store_->mark_done(*conn, "e1", now, "relay-b"), 0);  // once
  // An ungrouped row's mark still needs its claim's owner.
  write({plain("u1")});
  const auto later = Clock::system()->now() + 1s;
  ASSERT_EQ(store_->claim_pending(*conn, "relay-b", later, 30s, 0ms, 10).size(), 1U);
  EXPECT_EQ(store_->mark_done(*conn, "u1", now, "relay-a"), 0);
  EXPECT_EQ(store_->mark_done(*conn, "u1", now, "relay-b"), 1);
}

TEST_P(GroupContract, BlockKeepsTheHeadPendingAndTheOperatorsActionsDoWhatTheySay) {
  write({grouped("h1", "g"), grouped("h2", "g"), grouped("h3", "g"), grouped("x1", "other")});
  const int p = message_group_partition("g");
  const auto token = take(partition_lease_name(p));
  ASSERT_EQ(claim({"h1"}, token).size(), 1U);
  auto conn = pool_->acquire();
  const auto now = Clock::system()->now();
  // Only the claim's holder may block it.
  EXPECT_FALSE(groups_->block(*conn, "h1", "g", "boom 1", now, "relay-z"));
  ASSERT_TRUE(groups_->block(*conn, "h1", "g", "HTTP 500 boom", now, "relay-a"));
  auto head = store_->find(*conn, "h1");
  EXPECT_EQ(head->status, EventStatus::Retry);
  EXPECT_EQ(head->attempts, 1);
  EXPECT_EQ(head->last_error, "HTTP 500 boom");
  EXPECT_FALSE(head->locked_by);
  EXPECT_EQ(groups_->blocked(*conn, {"g", "other", "absent"}), std::vector<std::string>{"g"});
  EXPECT_TRUE(groups_->blocked(*conn, {"other"}).empty());
  // A blocked head is still pending and due: the claim step leaves its group by the block list.
  const auto rows = groups_->scan(*conn, {{p, {}, 100}}, Clock::system()->now() + 1s);
  ASSERT_FALSE(rows.empty());
  const auto first = std::find_if(rows.begin(), rows.end(),
                                  [](const GroupScanRow& r) { return r.message_group == "g"; });
  ASSERT_NE(first, rows.end());
  EXPECT_EQ(first->event_id, "h1");
  EXPECT_TRUE(first->due);
  auto info = groups_->find(*conn, "g");
  ASSERT_TRUE(info);
  EXPECT_TRUE(info->blocked);
  EXPECT_EQ(info->head_event_id, "h1");
  EXPECT_EQ(info->pending, 3);
  EXPECT_EQ(groups_->stats(*conn).blocked, 1);
  const auto listed = groups_->list(*conn, 10);
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].message_group, "g");

  // retry: unblocked, attempts reset, due now.
  ASSERT_TRUE(groups_->retry(*conn, "g", Clock::system()->now()));
  EXPECT_FALSE(groups_->find(*conn, "g")->blocked);
  EXPECT_EQ(store_->find(*conn, "h1")->attempts, 0);
  EXPECT_EQ(groups_->stats(*conn).blocked, 0);
  // skip-head: the head goes DEAD, the next event is the head.
  EXPECT_EQ(groups_->skip_head(*conn, "g", Clock::system()->now()), "h1");
  EXPECT_EQ(store_->find(*conn, "h1")->status, EventStatus::Dead);
  EXPECT_EQ(groups_->find(*conn, "g")->head_event_id, "h2");
  // dead-letter: every pending event of the group goes DEAD; other groups are untouched.
  EXPECT_EQ(groups_->dead_letter_group(*conn, "g", Clock::system()->now()), 2);
  EXPECT_FALSE(groups_->find(*conn, "g"));
  EXPECT_EQ(store_->find(*conn, "x1")->status, EventStatus::New);
  EXPECT_FALSE(groups_->skip_head(*conn, "g", Clock::system()->now()));
}

// What a claim asks of a full front's groups: blocked, or a head that keeps failing (due again
// after each backoff, it looks able to move but hides the groups behind it as well). A head that
// failed once (what a short outage leaves on every group) is not counted.
TEST_P(GroupContract, HeldBackNamesBlockedGroupsAndGroupsWhoseHeadKeepsFailing) {
  write({grouped("b1", "blocked"), grouped("f1", "failing"), grouped("f2", "failing"),
         grouped("o1", "once"), grouped("n1", "new"), grouped("d1", "deferred")});
  auto conn = pool_->acquire();
  const auto now = Clock::system()->now();
  std::map<int, LeaseToken> tokens;
  const auto claimed = [&](const std::string& group, const std::string& head) {
    const int p = message_group_partition(group);
    if (!tokens.contains(p)) {
      tokens.emplace(p, take(partition_lease_name(p)));
    }
    return claim({head}, tokens.at(p)).size() == 1U;
  };
  for (const auto& [group, head] :
       std::vector<std::pair<std::string, std::string>>{{"blocked", "b1"},
                                                        {"failing", "f1"},
                                                        {"once", "o1"},
                                                        {"new", "n1"},
                                                        {"deferred", "d1"}}) {
    ASSERT_TRUE(claimed(group, head)) << group;
  }
  ASSERT_TRUE(groups_->block(*conn, "b1", "blocked", "boom", now, "relay-a"));
  ASSERT_EQ(store_->mark_retry(*conn, "f1", now, 0ms, "HTTP 503", "relay-a"), 1);
  ASSERT_TRUE(claimed("failing", "f1"));
  ASSERT_EQ(store_->mark_retry(*conn, "f1", now, 0ms, "HTTP 503", "relay-a"), 1);
  ASSERT_EQ(store_->mark_retry(*conn, "o1", now, 0ms, "HTTP 503", "relay-a"), 1);
  // A deferral (a listener's RetryLater) counts no attempt: nothing failed.
  ASSERT_EQ(store_->mark_deferred(*conn, "d1", now, 0ms, "later", "relay-a"), 1);
  auto held = groups_->held_back(*conn, {"blocked", "failing", "once", "new", "deferred", "absent"},
                                 {"b1", "f1", "o1", "n1", "d1", "x1"});
  std::sort(held.begin(), held.end());
  EXPECT_EQ(held, (std::vector<std::string>{"blocked", "failing"}));
  // The head named is the one asked about: the failing group's second row never failed.
  EXPECT_TRUE(groups_->held_back(*conn, {"failing"}, {"f2"}).empty());
  EXPECT_TRUE(groups_->held_back(*conn, {}, {}).empty());
  EXPECT_THROW(groups_->held_back(*conn, {"failing"}, {}), std::invalid_argument);
  // An ungrouped row named as a head (never by a claim) names no group.
  write({plain("p1")});
  for (int i = 0; i < 2; ++i) {
    ASSERT_EQ(store_->mark_retry(*conn, "p1", now, 0ms, "HTTP 503"), 1);
  }
  EXPECT_TRUE(groups_->held_back(*conn, {"failing"}, {"p1"}).empty());
}

TEST_P(GroupContract, DeadLetterTakesTheHeadAndThePendingRestOfItsGroupTogether) {
  write({grouped("d1", "g"), grouped("d2", "g"), grouped("d3", "g"), grouped("y1", "h")});
  const int p = message_group_partition("g");
  const auto token = take(partition_lease_name(p));
  ASSERT_EQ(claim({"d1", "d2"}, token).size(), 2U);
  auto conn = pool_->acquire();
  EXPECT_EQ(groups_->dead_letter(*conn, "d1", "g", "bad", Clock::system()->now(), "relay-z"), 0);
  EXPECT_EQ(store_->find(*conn, "d2")->status, EventStatus::New);
  EXPECT_EQ(groups_->dead_letter(*conn, "d1", "g", "bad", Clock::system()->now(), "relay-a"), 3);
  for (const char* id : {"d1", "d2", "d3"}) {
    const auto row = store_->find(*conn, id);
    EXPECT_EQ(row->status, EventStatus::Dead) << id;
    EXPECT_NE(row->last_error->find(id == std::string("d1") ? "bad" : "head event d1"),
              std::string::npos)
        << *row->last_error;
  }
  EXPECT_EQ(store_->find(*conn, "y1")->status, EventStatus::New);
  // Replayed in order, the group is whole again.
  for (const char* id : {"d1", "d2", "d3"}) {
    EXPECT_EQ(store_->replay_dead(*conn, id, Clock::system()->now()), 1);
  }
  EXPECT_EQ(scan_ids(p).size(), 3U + (message_group_partition("h") == p ? 1U : 0U));
}

TEST_P(GroupContract, RowsWrittenWithoutAPartitionGetTheirGroupsPartition) {
  auto conn = pool_->acquire();
  const std::string now =
      engine_is("sqlite") ? "0" : (engine_is("postgres") ? "now()" : "UTC_TIMESTAMP(6)");
  for (const char* id : {"o1", "o2"}) {
    conn->execute(
        "INSERT INTO " + table_ +
        " (event_id, event_type, aggregate_type, payload, status, attempts, available_at, "
        "created_at, message_group) VALUES ('" +
        id + "', 'Moved', 'Order', '{}', 0, 0, " + now + ", " + now + ", 'py-order-1')");
  }
  const int partition = message_group_partition("py-order-1");
  // Only the partition's live holder numbers its rows.
  EXPECT_EQ(groups_->assign_partitions(*conn, {}, 100), 0);
  const auto other = take(partition_lease_name((partition + 1) % kMessageGroupPartitions));
  EXPECT_EQ(groups_->assign_partitions(*conn, {other}, 100), 0);
  auto stale = take(partition_lease_name(partition));
  ++stale.epoch;  // a token the database does not hold (taken over since)
  EXPECT_EQ(groups_->assign_partitions(*conn, {other, stale}, 100), 0);
  EXPECT_FALSE(store_->find(*conn, "o2")->partition_no.has_value());
  --stale.epoch;
  EXPECT_EQ(groups_->assign_partitions(*conn, {other, stale}, 100), 2);
  EXPECT_EQ(store_->find(*conn, "o2")->partition_no, partition);
  EXPECT_EQ(groups_->assign_partitions(*conn, {stale}, 100), 0);
  EXPECT_THROW(groups_->assign_partitions(*conn, {LeaseToken{.name = "leader"}}, 100),
               std::invalid_argument);
}

// Rows other clients wrote without a number (or with one outside 0 … 63, or, on SQLite, a
// fraction), among many numbered rows: the holder of their partitions numbers them all, and only
// them; a partition it does not hold keeps its rows as they are. On SQLite, no statement of it
// reads the table whole (testing::PlanChecking): one UPDATE a group with the ranges of unnumbered
// rows OR-ed scanned every pending grouped row for each group (17 ms a group at 100,000 rows, and
// 500 groups a cycle held the write lock for 9 s, so an outside writer's backlog drained at a few
// events a second and the application's INSERTs waited up to 30 s).
TEST_P(GroupContract, PartitionsAreNumberedForTheUnnumberedRowsOnlyAndWithoutReadingTheTable) {
  auto conn = pool_->acquire();
  const std::string now =
      engine_is("sqlite") ? "0" : (engine_is("postgres") ? "now()" : "UTC_TIMESTAMP(6)");
  std::vector<std::string> oddities = {"NULL", "-1", "70"};
  if (engine_is("sqlite")) {
    oddities.push_back("0.5");
  }
  std::map<std::string, int> expected;  // id -> partition
  std::set<std::string> unnumbered;
  std::string values;
  for (int k = 0; k < 40; ++k) {
    const std::string key = "outside-" + std::to_string(k);
    const int partition = message_group_partition(key);
    for (std::size_t r = 0; r < 2 + oddities.size(); ++r) {
      const std::string id = key + "-" + std::to_string(r);
      // Numbered rows first and last, the oddities between them.
      const bool numbered = r == 0 || r == oddities.size() + 1;
      values += (values.empty() ? "('" : ", ('") + id + "', 'Moved', 'Order', '{}', 0, 0, " + now +
                ", " + now + ", '" + key + "', " +
                (numbered ? std::to_string(partition) : oddities[r - 1]) + ")";
      expected[id] = partition;
      if (!numbered) {
        unnumbered.insert(id);
      }
    }
  }
  conn->execute("INSERT INTO " + table_ +
                " (event_id, event_type, aggregate_type, payload, status, attempts, available_at, "
                "created_at, message_group, partition_no) VALUES " +
                values);
  // Every partition but those of the first key's: its rows stay as they are.
  const int kept = message_group_partition("outside-0");
  std::vector<LeaseToken> leases;
  for (int p = 0; p < kMessageGroupPartitions; ++p) {
    if (p != kept) {
      leases.push_back(take(partition_lease_name(p)));
    }
  }
  int kept_unnumbered = 0;
  for (const auto& id : unnumbered) {
    kept_unnumbered += expected[id] == kept ? 1 : 0;
  }
  int assigned = 0;
  if (engine_is("sqlite")) {
    PlanChecking checking(*conn, table_);
    assigned = groups_->assign_partitions(checking, leases, 500);
    EXPECT_GT(checking.statements, 1);
    EXPECT_EQ(checking.scans, std::vector<std::string>{});
  } else {
    assigned = groups_->assign_partitions(*conn, leases, 500);
  }
  EXPECT_EQ(assigned, static_cast<int>(unnumbered.size()) - kept_unnumbered);
  // Read as the column holds them (a fraction is no partition number a row could carry).
  const auto numbers = [&] {
    std::map<std::string, std::optional<std::int64_t>> out;
    for (const auto& row : conn->query("SELECT event_id, partition_no FROM " + table_ +
                                       " WHERE message_group LIKE 'outside-%'")) {
      const auto* number = std::get_if<std::int64_t>(&row.at(1));
      out[row.get_text(0)] = number ? std::optional(*number) : std::nullopt;
    }
    return out;
  };
  const auto after = numbers();
  ASSERT_EQ(after.size(), expected.size());
  for (const auto& [id, partition] : expected) {
    if (partition == kept && unnumbered.contains(id)) {
      EXPECT_NE(after.at(id), std::optional<std::int64_t>(partition)) << id << " was numbered";
    } else {
      EXPECT_EQ(after.at(id), std::optional<std::int64_t>(partition)) << id;
    }
  }
  EXPECT_EQ(groups_->assign_partitions(*conn, leases, 500), 0);
  leases.push_back(take(partition_lease_name(kept)));
  EXPECT_EQ(groups_->assign_partitions(*conn, leases, 500), kept_unnumbered);
}

TEST_P(GroupContract, AGroupWithARowNotYetGivenItsPartitionIsNamedAsWaiting) {
  auto conn = pool_->acquire();
  const std::string now =
      engine_is("sqlite") ? "0" : (engine_is("postgres") ? "now()" : "UTC_TIMESTAMP(6)");
  conn->execute("INSERT INTO " + table_ +
                " (event_id, event_type, aggregate_type, payload, status, attempts, available_at, "
                "created_at, message_group) VALUES ('n1', 'Moved', 'Order', '{}', 0, 0, " +
                now + ", " + now + ", 'mixed')");
  write({grouped("n2", "mixed"), grouped("n3", "clean")});
  EXPECT_EQ(groups_->unassigned(*conn, {"mixed", "clean", "absent"}),
            std::vector<std::string>{"mixed"});
  groups_->assign_partitions(*conn, {take(partition_lease_name(message_group_partition("mixed")))},
                             10);
  EXPECT_TRUE(groups_->unassigned(*conn, {"mixed", "clean"}).empty());
}

TEST_P(GroupContract, KeysThatDifferOnlyByTrailingSpacesAreTwoGroups) {
  // MariaDB compares PAD SPACE collations as if trailing spaces were not there.
  write({grouped("s1", "k1"), grouped("s2", "k1 ")});
  auto conn = pool_->acquire();
  const int p1 = message_group_partition("k1");
  const int p2 = message_group_partition("k1 ");
  std::map<int, LeaseToken> tokens;
  for (const auto& [id, group, p] : {std::tuple{"s1", "k1", p1}, std::tuple{"s2", "k1 ", p2}}) {
    if (!tokens.contains(p)) {
      tokens.emplace(p, take(partition_lease_name(p)));
    }
    ASSERT_EQ(claim({id}, tokens.at(p)).size(), 1U);
    ASSERT_TRUE(groups_->block(*conn, id, group, "x", Clock::system()->now(), "relay-a"));
  }
  EXPECT_EQ(groups_->stats(*conn).blocked, 2);
  EXPECT_EQ(groups_->find(*conn, "k1")->head_event_id, "s1");
  EXPECT_EQ(groups_->find(*conn, "k1 ")->head_event_id, "s2");
  EXPECT_EQ(groups_->find(*conn, "k1")->pending, 1);
}

TEST_P(GroupContract, AClaimReturnsOnlyRowsOfPartitionsWhoseLeaseIsLiveNow) {
  // Two keys in two partitions; the first partition's rows were claimed before.
  std::string a = "ka", b;
  for (int i = 0; b.empty(); ++i) {
    const std::string k = "kb" + std::to_string(i);
    if (message_group_partition(k) != message_group_partition(a)) {
      b = k;
    }
  }
  write({grouped("a1", a), grouped("b1", b)});
  const auto pa = take(partition_lease_name(message_group_partition(a)));
  const auto pb = take(partition_lease_name(message_group_partition(b)));
  ASSERT_EQ(claim({"a1"}, pa).size(), 1U);
  // The database gives partition a's lease to another holder behind this one's back.
  auto conn = pool_->acquire();
  conn->execute("UPDATE " + sql::lease_table_name(table_) +
                " SET epoch = epoch + 1 WHERE name = '" + pa.name + "'");
  const auto rows = groups_->claim(*conn, {pa, pb}, {"a1", "b1"});
  EXPECT_EQ(ids_of(rows), std::vector<std::string>{"b1"});
}

// A claim's fence and its list of ids are padded to a few lengths by repeating their last lease
// and id (the statement's text then repeats): rows come back once each, in the order asked, and
// only while their partition's lease is live, the repeated one's too.
TEST_P(GroupContract, AClaimPaddedToAFewLengthsReturnsEachAskedRowOnceUnderItsLease) {
  std::vector<std::string> keys;
  std::set<int> partitions;
  for (int i = 0; keys.size() < 3; ++i) {
    const std::string k = "k" + std::to_string(i);
    if (partitions.insert(message_group_partition(k)).second) {
      keys.push_back(k);
    }
  }
  std::vector<EventEnvelope> events;
  for (int i = 0; i < 3; ++i) {
    for (const auto& k : keys) {
      events.push_back(grouped(k + "-" + std::to_string(i), k));
    }
  }
  write(events);
  std::vector<LeaseToken> leases;  // three: the last is repeated to make four
  for (const auto& k : keys) {
    leases.push_back(take(partition_lease_name(message_group_partition(k))));
  }
  const std::vector<std::string> asked = {keys[0] + "-0", keys[2] + "-0", keys[0] + "-1",
                                          keys[2] + "-1", keys[0] + "-2"};
  auto conn = pool_->acquire();
  EXPECT_EQ(ids_of(groups_->claim(*conn, leases, asked)), asked);
  // The last asked first: the padding repeats it, and it still comes back once, where asked.
  const std::vector<std::string> reordered = {asked[4], asked[0], asked[1], asked[2], asked[3]};
  EXPECT_EQ(ids_of(groups_->claim(*conn, leases, reordered)), reordered);
  // The repeated lease goes to another holder: its partition's rows no longer come back.
  conn->execute("UPDATE " + sql::lease_table_name(table_) +
                " SET epoch = epoch + 1 WHERE name = '" + leases[2].name + "'");
  EXPECT_EQ(ids_of(groups_->claim(*conn, leases, asked)),
            (std::vector<std::string>{asked[0], asked[2], asked[4]}));
}

TEST_P(GroupContract, DeadEventsAreListedInTheOrderTheyWereWritten) {
  // Written in this order with clocks that disagree: the listing (and a replay-all) follows the
  // writes, so a group comes back head first.
  const auto t0 = std::chrono::system_clock::now();
  for (const auto& [id, at] : {std::pair{"w1", t0 + 5s}, std::pair{"w2", t0}}) {
    write({EventEnvelope::builder(EventType::of("Moved"))
               .event_id(id)
               .occurred_at(at)
               .message_group("g")
               .payload_json("{}")
               .build()});
  }
  auto conn = pool_->acquire();
  for (const char* id : {"w2", "w1"}) {
    ASSERT_EQ(store_->mark_dead(*conn, id, Clock::system()->now(), "x"), 1);
  }
  EXPECT_EQ(ids_of(store_->query_dead(*conn, std::nullopt, std::nullopt, 10)),
            (std::vector<std::string>{"w1", "w2"}));
}

TEST_P(GroupContract, PartitionNumbersOtherClientsGotWrongAreCorrected) {
  auto conn = pool_->acquire();
  const std::string now =
      engine_is("sqlite") ? "0" : (engine_is("postgres") ? "now()" : "UTC_TIMESTAMP(6)");
  const int right = message_group_partition("acct-7");
  const int wrong = (right + 1) % kMessageGroupPartitions;
  for (const auto& [id, partition] :
       {std::pair{"r1", std::to_string(wrong)}, std::pair{"r2", std::string("64")},
        std::pair{"r3", std::string("-1")}}) {
    conn->execute("INSERT INTO " + table_ +
                  " (event_id, event_type, aggregate_type, payload, status, attempts, "
                  "available_at, created_at, message_group, partition_no) VALUES ('" +
                  id + "', 'Moved', 'Order', '{}', 0, 0, " + now + ", " + now + ", 'acct-7', " +
                  partition + ")");
  }
  // Out of range: assigned like a missing number (and the group waits until then).
  EXPECT_EQ(groups_->unassigned(*conn, {"acct-7"}), std::vector<std::string>{"acct-7"});
  EXPECT_EQ(groups_->assign_partitions(*conn, {take(partition_lease_name(right))}, 10), 2);
  // In range but not the key's: moved by repartition (the claim step calls it on sight).
  EXPECT_EQ(groups_->repartition(*conn, "acct-7"), 1);
  EXPECT_EQ(scan_ids(right), (std::vector<std::string>{"r1", "r2", "r3"}));
  EXPECT_TRUE(scan_ids(wrong).empty());
}

// repartition() is run by any node whose scan meets a key's row in a partition not its own,
// unfenced; it must move only such rows. A row whose number is out of range is the key's
// partition holder's to number (fenced, assign_partitions): a claim in that partition reads its
// runs and then asks unassigned(), and a row numbered in between by anyone else is overtaken.
TEST_P(GroupContract, RepartitionLeavesRowsWithAnOutOfRangePartitionToThePartitionsHolder) {
  auto conn = pool_->acquire();
  const std::string now =
      engine_is("sqlite") ? "0" : (engine_is("postgres") ? "now()" : "UTC_TIMESTAMP(6)");
  const int right = message_group_partition("acct-8");
  const int wrong = (right + 1) % kMessageGroupPartitions;
  for (const auto& [id, partition] :
       {std::pair{"q1", std::string("64")}, std::pair{"q2", std::to_string(wrong)}}) {
    conn->execute("INSERT INTO " + table_ +
                  " (event_id, event_type, aggregate_type, payload, status, attempts, "
                  "available_at, created_at, message_group, partition_no) VALUES ('" +
                  id + "', 'Moved', 'Order', '{}', 0, 0, " + now + ", " + now + ", 'acct-8', " +
                  partition + ")");
  }
  EXPECT_EQ(groups_->repartition(*conn, "acct-8"), 1);  // q2 only
  EXPECT_EQ(store_->find(*conn, "q1")->partition_no, 64);
  EXPECT_EQ(groups_->unassigned(*conn, {"acct-8"}), std::vector<std::string>{"acct-8"});
}

// An operator's dead_letter_group() takes the pending rest of its group, rows an outside client
// left without a partition or with one out of range included (found leaving the latter pending,
// numbered by the next cycle and delivered after its group was dead-lettered); find() counts them.
TEST_P(GroupContract, DeadLetteringAGroupTakesItsRowsWithAnOutOfRangePartitionToo) {
  auto conn = pool_->acquire();
  const std::string now =
      engine_is("sqlite") ? "0" : (engine_is("postgres") ? "now()" : "UTC_TIMESTAMP(6)");
  const int right = message_group_partition("acct-9");
  for (const auto& [id, partition] :
       {std::pair{"v1", std::to_string(right)}, std::pair{"v2", std::string("NULL")},
        std::pair{"v3", std::string("100")}}) {
    conn->execute("INSERT INTO " + table_ +
                  " (event_id, event_type, aggregate_type, payload, status, attempts, "
                  "available_at, created_at, message_group, partition_no) VALUES ('" +
                  id + "', 'Moved', 'Order', '{}', 0, 0, " + now + ", " + now + ", 'acct-9', " +
                  partition + ")");
  }
  EXPECT_EQ(groups_->find(*conn, "acct-9")->pending, 3);
  EXPECT_EQ(groups_->dead_letter_group(*conn, "acct-9", Clock::system()->now()), 3);
  for (const char* id : {"v1", "v2", "v3"}) {
    EXPECT_EQ(store_->find(*conn, id)->status, EventStatus::Dead) << id;
  }
}

// A late DONE mark (found by a hostile round): relay-a read the group under its lease and published
// x1; its publish (or DONE mark) took longer than the lease. relay-b took the partition, read the
// group, x1 failed for good there and relay-b blocked the group. relay-a's DONE mark of x1 lands
// now.
TEST_P(GroupContract, ALateDoneMarkOfTheDeposedHolderDoesNotLeaveTheGroupBlockedOnADoneHead) {
  write({grouped("x1", "late"), grouped("x2", "late")});
  const int p = message_group_partition("late");
  const auto a = take(partition_lease_name(p), "relay-a");
  auto conn = pool_->acquire();
  const auto now = Clock::system()->now();
  ASSERT_EQ(ids_of(groups_->claim(*conn, {a}, {"x1", "x2"})).size(), 2U);
  ASSERT_TRUE(leases_->release(*conn, a));  // (a lapse: the same to the database)
  const auto b = take(partition_lease_name(p), "relay-b");
  ASSERT_EQ(ids_of(groups_->claim(*conn, {b}, {"x1", "x2"})).size(), 2U);
  ASSERT_TRUE(groups_->hold(*conn, "x1", b, "relay-b", now));
  ASSERT_TRUE(groups_->block(*conn, "x1", "late", "boom", now, "relay-b"));
  const int marked = store_->mark_done(*conn, "x1", now, "relay-a");
  const auto head = store_->find(*conn, "x1");
  const auto info = groups_->find(*conn, "late");
  ASSERT_TRUE(info);
  EXPECT_EQ(marked, 1);  // it was delivered: the mark counts
  // Not both: the head DONE, and its group still blocked (x2, which never failed, would wait for
  // an operator).
  EXPECT_FALSE(head->status == EventStatus::Done && info->blocked);
}

INSTANTIATE_TEST_SUITE_P(Engines, GroupContract, testing::all_engines(), testing::engine_name);

}  // namespace
}  // namespace outbox
