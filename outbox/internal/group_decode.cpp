// A claim's rows as events (GroupPartitions::claim), and a row that does not decode settled by
// its group's policy under the lease it was read under.
#include <exception>
#include <string>

#include "outbox/internal/group_partitions.hpp"
#include "outbox/internal/in_transaction.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/lease.hpp"
#include "outbox/log.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox::internal {

std::vector<ClaimedEvent> GroupPartitions::decode(
    sql::Connection& conn, const std::vector<OutboxEvent>& rows,
    const std::unordered_map<int, LeaseToken>& read_under, Timestamp now) {
  std::vector<ClaimedEvent> out;
  std::string stopped;  // a group whose head could not be decoded and now waits or is DEAD
  for (const auto& row : rows) {
    const std::string& group = row.message_group.value_or(std::string());
    if (!stopped.empty() && group == stopped) {
      continue;  // behind a head that was blocked or dead-lettered: stays for later
    }
    try {
      const int partition = row.partition_no.value_or(0);
      out.push_back({to_envelope(row, *options_.codec), row.attempts, partition,
                     read_under.at(partition).epoch});
      continue;
    } catch (const std::exception& e) {
      if (!settle_undecodable(conn, row, read_under.at(row.partition_no.value_or(0)),
                              std::string("decode failure: ") + e.what(), now)) {
        stopped = group;
      }
    }
  }
  return out;
}

bool GroupPartitions::settle_undecodable(sql::Connection& conn, const OutboxEvent& row,
                                         const LeaseToken& read_under, const std::string& error,
                                         Timestamp now) {
  // The route's policy, decided from what the row says of itself; a key that is not text names
  // no group an operator could act on, so such a row goes DEAD alone.
  GroupFailurePolicy policy = GroupFailurePolicy::Skip;
  const std::string& group = row.message_group.value_or(std::string());
  if (!group.empty() && sanitize_utf8(group) == group) {
    policy = GroupFailurePolicy::Block;
    if (options_.on_failure) {
      try {
        auto b = EventEnvelope::builder(EventType::of(sanitize_utf8(row.event_type)))
                     .event_id(sanitize_utf8(row.event_id))
                     .aggregate_type(AggregateType::of(sanitize_utf8(row.aggregate_type)))
                     .message_group(group)
                     .payload_json("null");
        if (row.aggregate_id) {
          b.aggregate_id(sanitize_utf8(*row.aggregate_id));
        }
        policy = options_.on_failure(b.build());
      } catch (const std::exception&) {
        policy = GroupFailurePolicy::Block;  // nothing to decide it from: keep the order
      }
    }
  }
  log(LogLevel::Error, "event " + row.event_id + " of message group '" + sanitize_utf8(group) +
                           "' cannot be decoded (" + error + "); " +
                           std::string(to_string(policy)));
  // Read, not locked (GroupStore::claim): locked for the failure's write under the lease it was
  // read under, in one transaction with the write (the lease row share-locked until the commit),
  // so nothing is written once the partition has moved.
  return in_transaction(conn, [&] {
    bool go_on = false;
    if (options_.store->hold(conn, row.event_id, read_under, options_.owner, now)) {
      switch (policy) {
        case GroupFailurePolicy::Skip:
          options_.outbox_store->mark_dead(conn, row.event_id, now, error, false, options_.owner);
          go_on = true;
          break;
        case GroupFailurePolicy::Block:
          options_.store->block(conn, row.event_id, group, error, now, options_.owner);
          break;
        case GroupFailurePolicy::DeadLetterGroup:
          options_.store->dead_letter(conn, row.event_id, group, error, now, options_.owner);
          break;
      }
    }
    return go_on;
  });
}

}  // namespace outbox::internal
