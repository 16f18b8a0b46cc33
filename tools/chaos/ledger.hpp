#pragma once
// The chaos harness's ledger: what the writers committed and rolled back, what the receiver got,
// and the verdict (lost, duplicated, stuck, out of order) of one run.

#include <cstddef>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace outbox::chaos {

/// One committed event, as the business table holds it (the truth of what committed).
struct Committed {
  std::string event_id;
  std::string key;  ///< the writer's ordering key (aggregate id, message group)
  long seq = 0;     ///< 1, 2, … per key in commit order, without gaps
};

/// One delivery, in arrival order: the event id from the message's metadata, key and sequence from
/// its payload (compared with the committed row's).
struct Receipt {
  std::string event_id;
  std::string key;
  long seq = 0;
  std::string via;  ///< who delivered it (the relay's name), for the report
};

/// The outbox row of an event after the drain.
enum class RowState { Pending, Done, Dead, Missing };

struct LedgerInput {
  std::vector<Committed> committed;
  std::unordered_set<std::string> rolled_back;  ///< ids the writers rolled back on purpose
  std::vector<Receipt> receipts;
  std::unordered_map<std::string, RowState> rows;  ///< by event id (absent: Missing)
  bool ordered = false;                            ///< check per-key order
  /// Claim modes: a delivered event's row must be DONE (its acknowledgement was written). False
  /// for subscriptions, whose rows stay NEW: `unread` says what the cursor has not passed.
  bool rows_acknowledge = true;
  std::size_t unread = 0;  ///< subscriptions: events after the cursor once drained
};

struct LedgerResult {
  std::size_t committed = 0;
  std::size_t rolled_back = 0;  ///< deliberate rollbacks the writers recorded
  std::size_t receipts = 0;
  std::size_t delivered = 0;   ///< committed events received at least once
  std::size_t duplicates = 0;  ///< receipts beyond the first of an event
  /// Committed, never received, and no longer pending (DONE or gone): the outbox dropped it.
  std::size_t lost = 0;
  std::size_t stuck = 0;  ///< committed, never received, still pending
  /// Received, but the outbox does not know: the row still pending (claim modes) or events left
  /// after the subscription's cursor. They would be delivered again.
  std::size_t unacknowledged = 0;
  /// Received with a key or sequence other than its committed row's (a corrupted delivery).
  std::size_t mismatched = 0;
  std::size_t dead = 0;  ///< committed, never received, DEAD
  /// Received but never committed (rolled back, or a transaction killed before its commit).
  std::size_t uncommitted_delivered = 0;
  /// First deliveries that came before their key's previous event had arrived (ordered runs).
  std::size_t order_violations = 0;
  /// Repeats of an event after a later event of its key had arrived (ordered runs; allowed, but
  /// reported: a receiver that keeps the last version per key must de-duplicate by id).
  std::size_t late_duplicates = 0;
  std::vector<std::string> problems;  ///< the first few of each kind, described
  std::vector<std::string> notes;     ///< the first few late duplicates, described (no failure)

  /// True when work was done and nothing was lost, stuck, dead, unacknowledged, corrupted,
  /// delivered uncommitted or out of order.
  bool clean() const {
    return lost == 0 && stuck == 0 && dead == 0 && uncommitted_delivered == 0 &&
           order_violations == 0 && unacknowledged == 0 && mismatched == 0 && committed > 0;
  }
};

/// Compares what committed with what arrived.
LedgerResult check(const LedgerInput& input);

}  // namespace outbox::chaos
