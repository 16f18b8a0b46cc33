#include "outbox/internal/group_partitions.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <stdexcept>
#include <tuple>
#include <unordered_map>
#include <unordered_set>

#include "outbox/dispatcher.hpp"
#include "outbox/lease_manager.hpp"
#include "outbox/log.hpp"
#include "outbox/store.hpp"

namespace outbox::internal {
namespace {

// Rows of grouped pending events read per claim: what the last cycles needed per row claimed
// (rows behind the first per_group of a group, of busy or blocked groups, are read for nothing),
// at least kMinScanBudget and at most kMaxRowsPerClaim per row wanted. One large group (or many
// blocked ones) costs at most that much of one cycle; the next cycle reads on from after it.
constexpr int kMinScanBudget = 500;
constexpr double kMaxRowsPerClaim = 20;
// Rows a scan reads at most in all (unless per_group needs more): a few MiB and tens of ms.
constexpr int kMaxScanRows = 65536;
// Rows written without a partition (outside writers) assigned per cycle.
constexpr int kAssignPerCycle = 500;
// Cycles run at once after one that claimed nothing but read full pages.
constexpr int kIdleFollowUps = 8;
// Every this many claims, one reads every held partition in key order instead of the fronts.
constexpr unsigned kSweepEvery = 4;
// Grouped events held, in runs of per_group for this many times max_concurrent_groups groups: the
// groups running, and three times as many waiting their turn or their DONE marks. With twice as
// many, SQLite's poller waited for marks to free room (its 1,000-group drain 44-52k events/s
// against 52-55k with four; PostgreSQL and MariaDB within noise).
constexpr std::size_t kHeldRunsPerRunningGroup = 4;

}  // namespace

class GroupPartitions::Partition final : public LeaseBalancer::Item {
 public:
  Partition(GroupPartitions& owner, int number)
      : owner_(owner), number_(number), lease_(partition_lease_name(number)) {}

  const std::string& lease() const override { return lease_; }
  bool held() const override {
    return draining_.load() || owner_.options_.leases->token(lease_).has_value();
  }
  void gained() override {
    if (owner_.wake_) {
      owner_.wake_();
    }
  }
  void yield() override { draining_ = true; }

  int number() const { return number_; }
  bool deliverable() const {
    return !draining_.load() && owner_.options_.leases->token(lease_).has_value();
  }
  // Hands the lease back once nothing of the partition is held here any more.
  void drain() {
    if (!draining_.load()) {
      return;
    }
    owner_.dispatcher_->drop_partition(number_);
    if (owner_.dispatcher_->partition_load(number_) > 0) {
      return;  // running, or waiting for its DONE mark: the next round looks again
    }
    owner_.options_.leases->release(lease_);
    draining_ = false;
  }

 private:
  GroupPartitions& owner_;
  int number_;
  std::string lease_;
  std::atomic<bool> draining_{false};
};

GroupPartitions::GroupPartitions(Options options) : options_(std::move(options)) {
  if (!options_.leases || !options_.store) {
    throw std::invalid_argument("message groups: leases and store are required");
  }
  if (!options_.clock) {
    options_.clock = Clock::system();
  }
  if (options_.per_group < 1 || options_.per_group > 1000) {
    throw std::invalid_argument("message groups: per_group must be 1 … 1000");
  }
  for (int p = 0; p < kMessageGroupPartitions; ++p) {
    partitions_.push_back(std::make_unique<Partition>(*this, p));
  }
  last_read_.fill(-1);
  front_run_ = options_.per_group;
  thread_ = std::make_unique<PeriodicWorker>(
      "group partitions", [this] { balance(); },
      [this] { return std::max(std::chrono::milliseconds(50), options_.leases->ttl() / 5); });
}

GroupPartitions::~GroupPartitions() {
  stop();
}

void GroupPartitions::start() {
  std::lock_guard lock(stop_mutex_);
  if (started_ || stopped_) {
    return;
  }
  started_ = true;
  options_.leases->keep(LeaseBalancer::member_lease(options_.leases->owner()));
  options_.leases->start();
  thread_->start();
}

void GroupPartitions::stop() {
  {
    std::lock_guard lock(stop_mutex_);
    stopped_ = true;
  }
  thread_->close();
}

void GroupPartitions::release_all() {
  {
    std::lock_guard lock(stop_mutex_);
    if (!started_ || released_) {
      return;
    }
    released_ = true;
  }
  stop();
  std::vector<std::string> names;
  for (const auto& p : partitions_) {
    if (p->held()) {
      names.push_back(p->lease());
    }
  }
  names.push_back(LeaseBalancer::member_lease(options_.leases->owner()));
  for (const auto& name : names) {
    try {
      options_.leases->release(name);
    } catch (const std::exception& e) {
      log(LogLevel::Warning, "releasing lease '" + name + "' failed: " + e.what());
    }
  }
}

bool GroupPartitions::held(int partition) const {
  return partition >= 0 && partition < kMessageGroupPartitions &&
         partitions_[static_cast<std::size_t>(partition)]->deliverable();
}

std::optional<LeaseToken> GroupPartitions::lease(int partition) const {
  if (!held(partition)) {
    return std::nullopt;
  }
  return options_.leases->token(partitions_[static_cast<std::size_t>(partition)]->lease());
}

void GroupPartitions::balance() {
  try {
    std::vector<LeaseBalancer::Item*> items;
    for (auto& p : partitions_) {
      items.push_back(p.get());
    }
    balancer_.balance(*options_.leases, items);
    for (auto& p : partitions_) {
      p->drain();
    }
  } catch (const std::exception& e) {
    log(LogLevel::Warning, std::string("message group partitions: ") + e.what());
  }
}

void GroupPartitions::group_done() {
  // Its next events (or another group's, now that there is room) may be claimed. A claim pays a
  // scan of every held partition, so it waits for half the room: one cycle then claims for many
  // groups, and what is still held keeps max_concurrent_groups groups busy meanwhile.
  if (wake_ && dispatcher_->grouped_held() <= held_bound() / 2) {
    wake_();
  }
}

std::size_t GroupPartitions::held_bound() const {
  return kHeldRunsPerRunningGroup * options_.max_concurrent_groups *
         static_cast<std::size_t>(options_.per_group);
}

std::vector<std::pair<int, LeaseToken>> GroupPartitions::held_partitions() const {
  std::vector<std::pair<int, LeaseToken>> held;
  held.reserve(partitions_.size());
  for (const auto& partition : partitions_) {
    if (auto token = options_.leases->token(partition->lease());
        token && partition->deliverable()) {
      held.emplace_back(partition->number(), std::move(*token));
    }
  }
  return held;
}

std::vector<GroupPartitions::Run> GroupPartitions::runs_of(
    sql::Connection& conn, const std::vector<GroupScanRow>& rows, std::size_t from, bool front,
    const std::unordered_set<std::string_view>& followed) {
  // A key read in a partition that is not its own was numbered wrongly by its writer: its rows
  // are moved to their partition (claimed from there later), never delivered from here.
  std::vector<Run> runs;
  std::vector<std::string> misplaced;
  for (std::size_t i = from; i < rows.size();) {
    const auto& head = rows[i];
    std::size_t end = i;
    while (end < rows.size() && rows[end].partition == head.partition &&
           rows[end].message_group == head.message_group) {
      ++end;
    }
    const bool own = message_group_partition(head.message_group) == head.partition;
    if (!own) {
      misplaced.push_back(head.message_group);
    }
    const bool busy =
        followed.contains(head.message_group) || dispatcher_->group_busy(head.message_group);
    runs.push_back({.begin = i,
                    .end = end,
                    .candidate = own && head.due && !busy,
                    .moving = busy,
                    .front = front});
    i = end;
  }
  for (const auto& group : misplaced) {
    options_.store->repartition(conn, group);
  }
  return runs;
}

bool GroupPartitions::advance_cursors(const std::vector<std::pair<int, LeaseToken>>& held,
                                      const std::vector<GroupScanRow>& rows,
                                      const std::vector<Run>& runs, int per_partition) {
  // In each partition the cursor passes the runs up to the first candidate pick did not reach
  // (its limit was met first): that group is read again by the next scan, however many groups
  // of other partitions went before it. A partition looked at whole resumes after its last group
  // when its page came back full, and starts over when it came back short (read to its end).
  struct Read {
    int rows = 0;
    int groups = 0;
    bool moving = false;  // its first group runs here or was just picked
    std::string passed;   // the last group the cursor passes
    bool stopped = false;
  };
  std::unordered_map<int, Read> read;
  for (const auto& run : runs) {
    auto& r = read[rows[run.begin].partition];
    r.rows += static_cast<int>(run.end - run.begin);
    r.moving = r.groups++ == 0 ? run.moving : r.moving;
    if (r.stopped || (run.candidate && !run.reached)) {
      r.stopped = true;
      continue;
    }
    r.passed = rows[run.begin].message_group;
  }
  bool full = false;
  for (const auto& [number, token] : held) {
    auto& cursor = cursors_[static_cast<std::size_t>(number)];
    auto& last = last_read_[static_cast<std::size_t>(number)];
    const auto it = read.find(number);
    if (it == read.end()) {
      cursor.clear();
      last = 0;
      continue;
    }
    const auto& r = it->second;
    // A full page of the rows of one group that runs here (or was just picked): a larger one
    // would read more of that group, of which a cycle takes per_group at most. One of a group
    // that cannot move (delayed, blocked) may grow: the groups behind it are read sooner.
    last = r.rows < per_partition      ? r.rows
           : r.groups == 1 && r.moving ? options_.per_group + 1
                                       : -1;
    if (r.stopped) {
      if (!r.passed.empty()) {
        cursor = r.passed;
      }
      continue;
    }
    cursor = r.rows < per_partition ? std::string() : r.passed;
    full = full || !cursor.empty();
  }
  return full;
}

std::vector<GroupPartitions::Pick> GroupPartitions::pick(sql::Connection& conn,
                                                         const std::vector<GroupScanRow>& rows,
                                                         std::vector<Run>& runs, int limit) {
  // The head due longest first, whatever its partition (then write order): groups written
  // together then run together, so a claim and its DONE marks touch rows that share pages (in
  // key order they sat on a page each; SQLite's grouped drain went 19–22k → 30–31k events/s), and
  // the groups waiting longest go first. Due, not written: a head that failed is due again only
  // after its backoff, so old groups that keep failing and retrying cannot take every cycle's
  // room from the groups written after them.
  std::vector<std::size_t> order;
  for (std::size_t r = 0; r < runs.size(); ++r) {
    if (runs[r].candidate) {
      order.push_back(r);
    }
  }
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const auto& x = rows[runs[a].begin];
    const auto& y = rows[runs[b].begin];
    return std::tie(x.due_at, x.seq) < std::tie(y.due_at, y.seq);
  });
  // Candidates are asked about in rounds of as many groups as rows are still wanted (at least
  // kMinGroupsAsked, so a small room does not cost a statement per blocked group), and only the
  // ones free to move count against the limit: blocked groups (many, after an outage) wait
  // without taking the others' turn. (Rows without a partition are asked about by read_runs().)
  std::vector<Pick> picks;
  int wanted = 0;
  std::size_t next = 0;
  while (next < order.size() && wanted < limit) {
    std::vector<std::size_t> round;
    std::vector<std::string> groups;
    const auto asked = static_cast<std::size_t>(std::max(limit - wanted, kMinGroupsAsked));
    for (; next < order.size() && round.size() < asked; ++next) {
      round.push_back(order[next]);
      groups.push_back(rows[runs[order[next]].begin].message_group);
    }
    const auto blocked = options_.store->blocked(conn, groups);
    const std::unordered_set<std::string> skip(blocked.begin(), blocked.end());
    for (const std::size_t r : round) {
      if (wanted >= limit) {
        break;
      }
      auto& run = runs[r];
      run.reached = true;
      const auto& group = rows[run.begin].message_group;
      if (skip.contains(group)) {
        continue;
      }
      Pick p{rows[run.begin].partition, group, {}, run.front};
      // A row not yet due (delayed, or a retry) holds back the rows behind it.
      for (std::size_t i = run.begin;
           i < run.end && rows[i].due && static_cast<int>(p.ids.size()) < options_.per_group &&
           wanted < limit;
           ++i) {
        p.ids.push_back(rows[i].event_id);
        ++wanted;
      }
      if (run.front) {
        // Its rows behind the head are read before the claim: counted as long as front groups'
        // runs have turned out lately (as per_group, one-row groups took a tenth of the room).
        const int expected =
            std::clamp(static_cast<int>(std::ceil(front_run_)), 1, options_.per_group);
        wanted += std::max(0, expected - static_cast<int>(p.ids.size()));
      }
      run.moving = true;
      picks.push_back(std::move(p));
    }
  }
  return picks;
}

std::vector<GroupPartitions::Pick> GroupPartitions::followers(sql::Connection& conn,
                                                              std::size_t groups) {
  std::vector<Pick> out;
  std::vector<std::string> names;
  for (auto it = followers_.begin(); it != followers_.end() && out.size() < groups;) {
    if (dispatcher_->group_busy(it->group)) {
      ++it;  // its run (or its DONE marks) not ended yet
      continue;
    }
    if (held(it->partition)) {
      // Its head as a scan's pick holds it: read_runs() drops the group if it moved.
      out.push_back({.partition = it->partition, .group = it->group, .ids = {std::move(it->head)}});
      names.push_back(it->group);
    }
    following_.erase(it->group);
    it = followers_.erase(it);
  }
  if (out.empty()) {
    return out;
  }
  const auto blocked = options_.store->blocked(conn, names);
  const std::unordered_set<std::string> skip(blocked.begin(), blocked.end());
  std::erase_if(out, [&](const Pick& p) { return skip.contains(p.group); });
  return out;
}

int GroupPartitions::page_size(const std::vector<std::pair<int, LeaseToken>>& held,
                               int budget) const {
  // The smallest page (a power of two: the scan's text, its limit inline, then repeats and is
  // planned once) with which the held partitions would read the budget, or all they hold, judged
  // by what each read last time: one read to its end gives what it had, one whose page came back
  // full of the rows of one group running here per_group + 1, any other whose page came back
  // full (or not read yet) a whole page. Rows piled up in a few partitions (many blocked or delayed
  // groups) are then read in a few cycles, not in pages of budget / 64.
  // At most kMaxScanRows in all, should every partition have filled up since a quiet spell.
  const auto smallest = std::bit_ceil(static_cast<unsigned>(options_.per_group + 1));
  const auto largest =
      std::max(smallest,
               std::bit_floor(static_cast<unsigned>(kMaxScanRows / static_cast<int>(held.size()))));
  for (auto page = smallest; page < largest; page *= 2) {
    long long rows = 0;
    bool grows = false;  // a larger page would read more
    for (const auto& [number, token] : held) {
      const int last = last_read_[static_cast<std::size_t>(number)];
      rows += last < 0 ? page : std::min<long long>(last, page);
      grows = grows || last < 0 || last >= static_cast<int>(page);
    }
    if (rows >= budget || !grows) {
      return static_cast<int>(page);
    }
  }
  return static_cast<int>(largest);
}

GroupClaim GroupPartitions::claim(sql::Connection& conn, int limit) {
  const auto held = held_partitions();
  if (held.empty()) {
    return {};
  }
  {
    std::vector<LeaseToken> tokens;
    for (const auto& [number, token] : held) {
      tokens.push_back(token);
    }
    options_.store->assign_partitions(conn, tokens, kAssignPerCycle);
  }
  // Enough work for the running groups and as many waiting their turn, no more: a group held
  // here is skipped by every read until it is done, so holding many groups makes reads pass
  // their rows for nothing (and holds memory).
  const auto enough = held_bound();
  const auto held_now = dispatcher_->grouped_held();
  if (held_now >= enough) {
    return {};  // group_done() wakes the poller when a group is done
  }
  const bool bounded = static_cast<int>(enough - held_now) < limit;
  limit = std::min(limit, static_cast<int>(enough - held_now));
  // Read now, not as the cycle began: a row committed while this node's earlier statements of the
  // cycle waited (on SQLite behind the writer's lock) would look not yet due, and its group
  // would be passed over.
  const auto now = options_.clock->now();
  // First the followers whose run has ended: the rows behind that run were seen by its read, so
  // their next runs are read by read_runs() alone, and a cycle they fill reads no front and no
  // scan (on PostgreSQL the scan was half a cycle's time). Every kSweepEvery-th cycle leaves them
  // to the reads, so that groups no run has reached yet get their turn.
  std::vector<Pick> follow;
  if (++cycles_ % kSweepEvery != 0) {
    follow = followers(
        conn, static_cast<std::size_t>((limit + options_.per_group - 1) / options_.per_group));
  }
  std::unordered_set<std::string_view> followed;
  for (const auto& p : follow) {
    followed.insert(p.group);
  }
  const int rest = limit - std::min(limit, static_cast<int>(follow.size()) * options_.per_group);
  // Where the engine indexes them (SQLite), each partition's front holds the heads of its oldest
  // groups: taken first, the claim's rows and their DONE marks share pages (heads picked from
  // groups read in key order sat two to a page: SQLite's claim cost 25 µs an event, 6–10 from
  // the oldest heads). A front that shows
  // nothing able to move (a blocked group's rows, a delayed head, a group running here) hides
  // what lies behind it: those partitions are also read in key order, a bounded page from each
  // one's cursor on, and their groups compete with the fronts' by due time. Every few claims one
  // reads every partition in key order instead: groups behind old ones that keep moving (failing
  // and retrying, say) are seen there, and a head due longer goes first, as everywhere.
  std::vector<GroupScanRow> rows;
  std::vector<Run> runs;
  std::vector<std::pair<int, LeaseToken>> scanned = held;
  if (rest == 0) {
    scanned.clear();
  } else if (options_.store->has_fronts() && ++claims_ % kSweepEvery != 0) {
    std::vector<int> numbers;
    for (const auto& [number, token] : held) {
      numbers.push_back(number);
    }
    rows = options_.store->front(conn, numbers, kFrontRows, now);
    std::stable_sort(rows.begin(), rows.end(), [](const GroupScanRow& a, const GroupScanRow& b) {
      return std::tie(a.partition, a.message_group) < std::tie(b.partition, b.message_group);
    });
    runs = runs_of(conn, rows, 0, true, followed);
    scanned = clogged(conn, held, rows, runs);
  }
  int per_partition = 0;
  const std::size_t front_runs = runs.size();
  if (!scanned.empty()) {
    const int budget = std::max(
        kMinScanBudget, static_cast<int>(std::min(kMaxRowsPerClaim, rows_per_claim_ * 1.5) * rest));
    per_partition = page_size(scanned, budget);
    std::vector<GroupScanRange> ranges;
    for (const auto& [number, token] : scanned) {
      ranges.push_back({number, cursors_[static_cast<std::size_t>(number)], per_partition});
    }
    const std::size_t from = rows.size();
    for (auto& row : options_.store->scan(conn, ranges, now)) {
      rows.push_back(std::move(row));
    }
    auto more = runs_of(conn, rows, from, false, followed);
    // A group in both reads is taken from the scan, which has more of its rows.
    std::unordered_set<std::string_view> in_scan;
    for (const auto& run : more) {
      in_scan.insert(rows[run.begin].message_group);
    }
    for (std::size_t r = 0; r < front_runs; ++r) {
      if (in_scan.contains(rows[runs[r].begin].message_group)) {
        runs[r].candidate = false;
      }
    }
    runs.insert(runs.end(), more.begin(), more.end());
  }
  auto picks = follow;
  for (auto& p : pick(conn, rows, runs, rest)) {
    picks.push_back(std::move(p));
  }
  bool pages_full = false;
  if (!scanned.empty()) {
    const std::vector<Run> of_scan(runs.begin() + static_cast<std::ptrdiff_t>(front_runs),
                                   runs.end());
    pages_full = advance_cursors(scanned, rows, of_scan, per_partition);
  }
  read_runs(conn, picks, limit, now);
  std::vector<std::string> ids;
  std::unordered_set<int> claimed_in;
  for (const auto& p : picks) {
    ids.insert(ids.end(), p.ids.begin(), p.ids.end());
    claimed_in.insert(p.partition);
    if (!p.next.empty() && following_.insert(p.group).second) {
      followers_.push_back({p.partition, p.group, p.next});
    }
  }
  while (followers_.size() > held_bound()) {
    following_.erase(followers_.front().group);
    followers_.pop_front();
  }
  if (!scanned.empty()) {
    // Rows the scan read per row claimed, counting the rows the cursors now pass (a candidate not
    // reached is read again).
    std::size_t examined = 0;
    for (std::size_t r = front_runs; r < runs.size(); ++r) {
      if (!runs[r].candidate || runs[r].reached) {
        examined += runs[r].end - runs[r].begin;
      }
    }
    const double ratio = ids.empty()
                             ? kMaxRowsPerClaim
                             : static_cast<double>(examined) / static_cast<double>(ids.size());
    rows_per_claim_ = std::clamp((rows_per_claim_ + ratio) / 2, 1.0, kMaxRowsPerClaim);
  }
  const bool filled = static_cast<int>(ids.size()) >= limit;
  if (ids.empty()) {
    // Pages came back full of groups that cannot move (busy, blocked, not due): read on at once,
    // a few pages after each wait, so a group behind them is not a poll interval per page away.
    if (!followed_up_) {
      idle_follow_ups_ = 0;
    }
    // A cycle of followers only that found them all ended reads the partitions next, at once.
    followed_up_ = (pages_full && ++idle_follow_ups_ <= kIdleFollowUps) || rest == 0;
    return {{}, followed_up_};
  }
  idle_follow_ups_ = 0;
  followed_up_ = (filled && !bounded) || pages_full || (rest == 0 && !filled);
  std::vector<LeaseToken> fences;
  std::unordered_map<int, LeaseToken> read_under;
  for (const auto& [number, token] : held) {
    if (claimed_in.contains(number)) {
      fences.push_back(token);
      read_under.emplace(number, token);
    }
  }
  // Claimed something and left claimable rows behind: the next cycle need not wait.
  return {decode(conn, unbroken(picks, options_.store->claim(conn, fences, ids)), read_under, now),
          followed_up_};
}

}  // namespace outbox::internal
