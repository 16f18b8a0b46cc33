#pragma once
// Leases with a fencing epoch: which process may act for a name ("leader", "sub:<name>",
// "part:<n>"), kept in a table on the database's clock, the same on every engine. A holder's
// writes carry its token so that a deposed holder's writes change nothing.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/clock.hpp"

namespace outbox {

namespace sql {
class Connection;
}

/// One holding of a lease. Every acquisition, by a new owner or by the same one after a lapse,
/// gets a higher epoch, so (name, owner, epoch) names one uninterrupted holding.
struct LeaseToken {
  std::string name;
  std::string owner;
  std::int64_t epoch = 0;
  bool operator==(const LeaseToken&) const = default;
};

/// What the lease table says about one name; instants are the database's.
struct LeaseInfo {
  std::string name;
  std::optional<std::string> owner;  ///< none when released (or never held)
  std::int64_t epoch = 0;            ///< of the last holding
  std::optional<Timestamp> acquired_at;
  std::optional<Timestamp> renewed_at;
  std::optional<Timestamp> expires_at;
  bool live = false;  ///< an owner holds it and it has not expired by the database's clock
};

/// The lease table of one database (sql::SqlLeaseStore per engine; testing::InMemoryLeaseStore).
/// Each call is one conditional statement timed by the database's clock (SQLite: the host's, which
/// every process on the file shares); no call takes the caller's clock. Thread-safe; every call
/// throws StoreError when the database fails.
class LeaseStore {
 public:
  virtual ~LeaseStore() = default;
  /// Takes `name` for `owner` for `ttl` when nobody holds it, it was released or it expired (the
  /// epoch goes up by one); nullopt while another holding is live, or this owner's own (renew it).
  virtual std::optional<LeaseToken> acquire(sql::Connection& conn, std::string_view name,
                                            std::string_view owner,
                                            std::chrono::milliseconds ttl) = 0;
  /// Extends a live holding to now + ttl; false when it expired or is no longer this holding (it
  /// must then be acquired again, under a new epoch).
  virtual bool renew(sql::Connection& conn, const LeaseToken& token,
                     std::chrono::milliseconds ttl) = 0;
  /// Ends the holding at once, so another owner may acquire it now; false when it had ended.
  virtual bool release(sql::Connection& conn, const LeaseToken& token) = 0;
  /// True while `token` is the live holding: the check a fenced write makes in its own statement.
  virtual bool holds(sql::Connection& conn, const LeaseToken& token) = 0;
  /// The row of `name`; nullopt when nobody ever acquired it.
  virtual std::optional<LeaseInfo> find(sql::Connection& conn, std::string_view name) = 0;
  /// Every row, by name.
  virtual std::vector<LeaseInfo> list(sql::Connection& conn) = 0;
};

/// Checks a lease name: 1 to 200 bytes of printable ASCII. Throws std::invalid_argument.
void validate_lease_name(std::string_view name);

}  // namespace outbox
