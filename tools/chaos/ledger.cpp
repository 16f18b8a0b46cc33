#include "ledger.hpp"

#include <map>
#include <set>

namespace outbox::chaos {
namespace {

// Enough examples to start an investigation, few enough to keep the report readable.
constexpr std::size_t kExamplesPerKind = 5;

void note(std::vector<std::string>& problems, std::map<std::string, std::size_t>& counts,
          const std::string& kind, const std::string& text) {
  if (counts[kind]++ < kExamplesPerKind) {
    problems.push_back(kind + ": " + text);
  }
}

}  // namespace

LedgerResult check(const LedgerInput& input) {
  LedgerResult r;
  std::map<std::string, std::size_t> counts;
  r.committed = input.committed.size();
  r.rolled_back = input.rolled_back.size();
  r.receipts = input.receipts.size();

  std::unordered_set<std::string> committed_ids;
  committed_ids.reserve(input.committed.size());
  for (const auto& c : input.committed) {
    committed_ids.insert(c.event_id);
  }

  std::unordered_set<std::string> received;
  // Per key: the sequences received so far and the highest one.
  std::unordered_map<std::string, std::set<long>> arrived;
  std::unordered_map<std::string, long> highest;
  for (const auto& receipt : input.receipts) {
    const bool first = received.insert(receipt.event_id).second;
    if (!first) {
      ++r.duplicates;
    }
    if (!committed_ids.contains(receipt.event_id)) {
      if (first) {
        ++r.uncommitted_delivered;
        note(r.problems, counts, "delivered but never committed",
             receipt.event_id + (input.rolled_back.contains(receipt.event_id)
                                     ? " (rolled back by its writer)"
                                     : " (its transaction never committed)"));
      }
      continue;
    }
    if (!input.ordered) {
      continue;
    }
    auto& seen = arrived[receipt.key];
    auto& top = highest[receipt.key];
    if (first) {
      if (receipt.seq > 1 && !seen.contains(receipt.seq - 1)) {
        ++r.order_violations;
        note(r.problems, counts, "order",
             receipt.key + " #" + std::to_string(receipt.seq) + " arrived before #" +
                 std::to_string(receipt.seq - 1));
      }
      seen.insert(receipt.seq);
    } else if (receipt.seq < top) {
      ++r.late_duplicates;
    }
    if (receipt.seq > top) {
      top = receipt.seq;
    }
  }

  for (const auto& c : input.committed) {
    if (received.contains(c.event_id)) {
      ++r.delivered;
      continue;
    }
    const auto row = input.rows.find(c.event_id);
    const RowState state = row == input.rows.end() ? RowState::Missing : row->second;
    switch (state) {
      case RowState::Pending:
        ++r.stuck;
        note(r.problems, counts, "stuck",
             c.event_id + " (" + c.key + " #" + std::to_string(c.seq) + ") still pending");
        break;
      case RowState::Dead:
        ++r.dead;
        note(r.problems, counts, "dead", c.event_id + " (" + c.key + ") went DEAD");
        break;
      case RowState::Done:
      case RowState::Missing:
        ++r.lost;
        note(r.problems, counts, "lost",
             c.event_id + " (" + c.key + " #" + std::to_string(c.seq) + ") " +
                 (state == RowState::Done ? "marked DONE" : "gone from the table") +
                 " but never received");
        break;
    }
  }
  return r;
}

}  // namespace outbox::chaos
