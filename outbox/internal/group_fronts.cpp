// The fronts of a claim (GroupPartitions::claim): which partitions a front leaves unread behind
// it, the runs behind the heads picked, read again just before the claim, and the runs the claim
// found whole.
#include <algorithm>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

#include "outbox/internal/group_partitions.hpp"
#include "outbox/lease.hpp"

namespace outbox::internal {

std::vector<std::pair<int, LeaseToken>> GroupPartitions::clogged(
    sql::Connection& conn, const std::vector<std::pair<int, LeaseToken>>& held,
    const std::vector<GroupScanRow>& rows, const std::vector<Run>& runs) {
  std::unordered_map<int, int> read;
  for (const auto& row : rows) {
    ++read[row.partition];
  }
  // The candidates of full fronts, asked about at once: a front full of blocked groups' rows
  // hides the groups behind them as surely as one full of rows that are not due, and so does one
  // full of heads that keep failing. Those are due again after each backoff, so they look able
  // to move, but they fail again: the groups written after them were seen only by the claims
  // that read every partition in key order (10 new groups behind 3,000 failing ones: 0 delivered
  // in 30 s under ThreadSanitizer). A head that failed once is not counted: after a short outage
  // every head has, and reading every such partition in key order too made their drain 35-45 %
  // slower.
  std::unordered_map<int, std::vector<std::string>> candidates;
  std::vector<std::string> asked;
  std::vector<std::string> heads;
  for (const auto& run : runs) {
    const auto& head = rows[run.begin];
    if (run.candidate && read[head.partition] >= kFrontRows) {
      candidates[head.partition].push_back(head.message_group);
      asked.push_back(head.message_group);
      heads.push_back(head.event_id);
    }
  }
  std::unordered_set<std::string> held_back;
  for (std::size_t from = 0; from < asked.size(); from += kMinGroupsAsked) {
    const auto begin = static_cast<std::ptrdiff_t>(from);
    const auto end = static_cast<std::ptrdiff_t>(std::min(asked.size(), from + kMinGroupsAsked));
    for (auto& g : options_.store->held_back(conn, {asked.begin() + begin, asked.begin() + end},
                                             {heads.begin() + begin, heads.begin() + end})) {
      held_back.insert(std::move(g));
    }
  }
  std::vector<std::pair<int, LeaseToken>> out;
  for (const auto& [number, token] : held) {
    if (read[number] < kFrontRows) {
      continue;  // read to its end: nothing behind
    }
    const auto it = candidates.find(number);
    const bool moves = it != candidates.end() &&
                       std::any_of(it->second.begin(), it->second.end(),
                                   [&](const std::string& g) { return !held_back.contains(g); });
    if (!moves) {
      out.emplace_back(number, token);
    }
  }
  return out;
}

void GroupPartitions::read_runs(sql::Connection& conn, std::vector<Pick>& picks, int limit,
                                Timestamp now) {
  // Every pick is read again, and then asked whether its group has a row an outside writer left
  // without a partition (invisible to the reads, which go by partition): in that order, a run
  // read can never pass such a row. One written before a row read was committed before that
  // read, so the question sees it, unless it got its number in between; only this node, holding
  // the partition, numbers its rows (at the start of the cycle). Asked before the read instead,
  // rows written between the two (one without a number, the next with it) were claimed past the
  // first (found breaking order on every engine).
  std::vector<std::pair<int, std::string>> groups;
  std::vector<std::string> names;
  groups.reserve(picks.size());
  for (const auto& p : picks) {
    groups.emplace_back(p.partition, p.group);
    names.push_back(p.group);
  }
  std::unordered_map<std::string_view, std::vector<const GroupScanRow*>> rows_of;
  // One row more than a run takes: the next run's head (see Follower).
  const auto rows = options_.store->runs(conn, groups, options_.per_group + 1, now);
  for (const auto& row : rows) {
    rows_of[row.message_group].push_back(&row);
  }
  if (!names.empty()) {
    for (const auto& g : options_.store->unassigned(conn, names)) {
      rows_of.erase(g);
    }
  }
  int left = limit;
  std::vector<Pick> kept;
  double runs_read = 0;
  int whole_runs = 0;  // front groups read to their end or to per_group, not cut by the limit
  for (auto& p : picks) {
    const auto it = rows_of.find(p.group);
    // The head seen by the read that picked it, still the group's first pending row: otherwise
    // it moved (an operator skipped it, another node took the partition) and the next cycle looks
    // again.
    if (it == rows_of.end() || it->second.front()->event_id != p.ids.front()) {
      continue;
    }
    p.ids.clear();
    const int room = std::min(options_.per_group, left);
    for (const auto* row : it->second) {
      if (!row->due || static_cast<int>(p.ids.size()) >= room) {
        break;
      }
      p.ids.push_back(row->event_id);
    }
    if (p.ids.size() < it->second.size() && it->second[p.ids.size()]->due) {
      p.next = it->second[p.ids.size()]->event_id;
    }
    if (p.front && room == options_.per_group) {
      runs_read += static_cast<double>(p.ids.size());
      ++whole_runs;
    }
    if (p.ids.empty()) {
      continue;
    }
    left -= static_cast<int>(p.ids.size());
    kept.push_back(std::move(p));
  }
  picks = std::move(kept);
  if (whole_runs > 0) {
    front_run_ = (front_run_ + runs_read / whole_runs) / 2;
  }
}

std::vector<OutboxEvent> GroupPartitions::unbroken(const std::vector<Pick>& picks,
                                                   std::vector<OutboxEvent> rows) {
  // The claim returns the rows still pending in their partition under its lease, in the order
  // asked. A run's row missing there (settled meanwhile, or its number taken away by another
  // client's UPDATE since read_runs() asked) ends the run: the rows behind it would overtake it.
  // They stay in the table, and a later cycle reads the group again.
  std::vector<OutboxEvent> out;
  out.reserve(rows.size());
  std::size_t r = 0;
  for (const auto& p : picks) {
    bool broken = false;
    for (const auto& id : p.ids) {
      if (r < rows.size() && rows[r].event_id == id) {
        if (!broken) {
          out.push_back(std::move(rows[r]));
        }
        ++r;
      } else {
        broken = true;
      }
    }
  }
  return out;
}

}  // namespace outbox::internal
