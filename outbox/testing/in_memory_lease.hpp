#pragma once
// A lease table without a database, timed by a Clock the test controls, with the contract of the
// SQL lease stores (checked by the lease contract suite).

#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "outbox/clock.hpp"
#include "outbox/lease.hpp"

namespace outbox::testing {

/// LeaseStore in memory. Its clock plays the database's: advance a ManualClock to expire
/// holdings without waiting. Connections are not used (any may be passed). Thread-safe.
class InMemoryLeaseStore final : public LeaseStore {
 public:
  explicit InMemoryLeaseStore(std::shared_ptr<Clock> clock = Clock::system())
      : clock_(std::move(clock)) {}

  std::optional<LeaseToken> acquire(sql::Connection& conn, std::string_view name,
                                    std::string_view owner, std::chrono::milliseconds ttl) override;
  bool renew(sql::Connection& conn, const LeaseToken& token,
             std::chrono::milliseconds ttl) override;
  bool release(sql::Connection& conn, const LeaseToken& token) override;
  bool holds(sql::Connection& conn, const LeaseToken& token) override;
  std::optional<LeaseInfo> find(sql::Connection& conn, std::string_view name) override;
  std::vector<LeaseInfo> list(sql::Connection& conn) override;

  /// True while `token` is live: what a fenced in-memory write checks (no connection needed).
  bool holds(const LeaseToken& token) const;

 private:
  LeaseInfo& live_state(LeaseInfo& row, Timestamp now) const;
  std::shared_ptr<Clock> clock_;
  mutable std::mutex mutex_;  // guards rows_
  std::map<std::string, LeaseInfo, std::less<>> rows_;
};

}  // namespace outbox::testing
