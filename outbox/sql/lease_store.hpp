#pragma once
// The lease table written once over a Dialect, and the fence that conditions another statement on
// a lease in that same statement.

#include <string>

#include "outbox/lease.hpp"
#include "outbox/sql/dialect.hpp"

namespace outbox::sql {

/// The lease table of the outbox table `table`: `lease_table_name(table)`.
std::string lease_table_name(const std::string& table);

/// LeaseStore over `dialect` (which must outlive it), on the lease table of the outbox table
/// `table`, created by the migration to schema version 3. Thread-safe (stateless apart from
/// configuration). Throws std::invalid_argument on a bad table name, lease name or owner.
class SqlLeaseStore final : public LeaseStore {
 public:
  SqlLeaseStore(const Dialect& dialect, const std::string& table = "outbox_event");

  std::optional<LeaseToken> acquire(Connection& conn, std::string_view name, std::string_view owner,
                                    std::chrono::milliseconds ttl) override;
  bool renew(Connection& conn, const LeaseToken& token, std::chrono::milliseconds ttl) override;
  bool release(Connection& conn, const LeaseToken& token) override;
  bool holds(Connection& conn, const LeaseToken& token) override;
  std::optional<LeaseInfo> find(Connection& conn, std::string_view name) override;
  std::vector<LeaseInfo> list(Connection& conn) override;

 private:
  std::vector<LeaseInfo> select(Connection& conn, std::string_view name);
  const Dialect& dialect_;
  std::string lease_table_;
};

/// Appends " AND EXISTS (…)": true while `token` is the live holding of its lease in `lease_table`,
/// by the lease clock of the statement itself, so a write made under a lost lease changes nothing.
/// The token's strings are copied into the statement.
void append_fence(Statement& s, const Dialect& dialect, const std::string& lease_table,
                  const LeaseToken& token);
/// The condition append_fence appends, without the leading " AND ": "EXISTS (…)". `share_lock`
/// false reads the lease row without locking it: for a statement that only reads (nothing it
/// changes could land after a takeover), where a lock is a write to the lease row on PostgreSQL.
void append_fence_condition(Statement& s, const Dialect& dialect, const std::string& lease_table,
                            const LeaseToken& token, bool share_lock = true);

}  // namespace outbox::sql
