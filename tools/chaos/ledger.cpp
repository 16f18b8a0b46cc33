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

  // The committed row is the truth of an event's key and sequence; the payload is compared.
  std::unordered_map<std::string, const Committed*> committed;
  committed.reserve(input.committed.size());
  for (const auto& c : input.committed) {
    committed.emplace(c.event_id, &c);
  }

  // Per key: the sequences received so far and the highest one.
  std::unordered_map<std::string, std::set<long>> arrived;
  std::unordered_map<std::string, long> highest;
  // Where each event received first arrived, and the first arrivals whose predecessor had not
  // arrived yet (with where they arrived): judged once every receipt is known.
  std::unordered_map<std::string, std::size_t> arrival;
  std::vector<std::pair<const Committed*, std::size_t>> early;
  for (std::size_t at = 0; at < input.receipts.size(); ++at) {
    const auto& receipt = input.receipts[at];
    const bool first = arrival.emplace(receipt.event_id, at).second;
    if (!first) {
      ++r.duplicates;
    }
    const auto row = committed.find(receipt.event_id);
    if (row == committed.end()) {
      if (first) {
        ++r.uncommitted_delivered;
        note(r.problems, counts, "delivered but never committed",
             receipt.event_id + (input.rolled_back.contains(receipt.event_id)
                                     ? " (rolled back by its writer)"
                                     : " (its transaction never committed)"));
      }
      continue;
    }
    const Committed& c = *row->second;
    if (receipt.key != c.key || receipt.seq != c.seq) {
      ++r.mismatched;
      note(r.problems, counts, "mismatched",
           receipt.event_id + " arrived as " + receipt.key + " #" + std::to_string(receipt.seq) +
               ", committed as " + c.key + " #" + std::to_string(c.seq));
    }
    if (!input.ordered) {
      continue;
    }
    auto& seen = arrived[c.key];
    auto& top = highest[c.key];
    if (first) {
      if (c.seq > 1 && !seen.contains(c.seq - 1)) {
        early.emplace_back(&c, at);
      }
      seen.insert(c.seq);
    } else if (c.seq < top) {
      ++r.late_duplicates;
      if (r.notes.size() < kExamplesPerKind) {
        r.notes.push_back("late duplicate: " + c.key + " #" + std::to_string(c.seq) +
                          " again after #" + std::to_string(top) +
                          (receipt.via.empty() ? "" : ", from " + receipt.via));
      }
    }
    if (c.seq > top) {
      top = c.seq;
    }
  }

  // Every key's sequence counts 1, 2, … once each: what the order check relies on.
  std::unordered_map<std::string, std::unordered_map<long, const Committed*>> sequences;
  for (const auto& c : input.committed) {
    if (!sequences[c.key].emplace(c.seq, &c).second) {
      note(r.problems, counts, "ledger", c.key + " #" + std::to_string(c.seq) + " committed twice");
      ++r.mismatched;
    }
  }
  // Predecessors that went DEAD and never arrived were given up on, not overtaken: ordered mode
  // moves past a DEAD event by design, and the DEAD rows are reported below as what failed. The
  // first predecessor that is not one of them must have arrived before.
  for (const auto& [c, at] : early) {
    const auto& of_key = sequences[c->key];
    bool in_order = true;
    long seq = c->seq - 1;  // the predecessor judged: the first that did not go DEAD unseen
    for (; seq >= 1; --seq) {
      const auto before = of_key.find(seq);
      if (before == of_key.end()) {
        in_order = false;
        break;
      }
      const auto& id = before->second->event_id;
      if (const auto came = arrival.find(id); came != arrival.end()) {
        in_order = came->second < at;
        break;
      }
      const auto row = input.rows.find(id);
      if (row == input.rows.end() || row->second != RowState::Dead) {
        in_order = false;
        break;
      }
    }
    if (in_order) {
      continue;
    }
    ++r.order_violations;
    note(r.problems, counts, "order",
         c->key + " #" + std::to_string(c->seq) + " arrived before #" + std::to_string(seq));
  }
  if (!input.rows_acknowledge) {
    r.unacknowledged = input.unread;
    if (input.unread > 0) {
      note(r.problems, counts, "unacknowledged",
           std::to_string(input.unread) + " events after the subscription's cursor");
    }
  }
  for (const auto& c : input.committed) {
    const auto row = input.rows.find(c.event_id);
    const RowState state = row == input.rows.end() ? RowState::Missing : row->second;
    if (arrival.contains(c.event_id)) {
      ++r.delivered;
      if (input.rows_acknowledge && state == RowState::Pending) {
        ++r.unacknowledged;
        note(r.problems, counts, "unacknowledged",
             c.event_id + " (" + c.key + " #" + std::to_string(c.seq) +
                 ") received but still pending");
      }
      continue;
    }
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
