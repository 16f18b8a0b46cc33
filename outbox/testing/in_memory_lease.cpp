#include "outbox/testing/in_memory_lease.hpp"

#include <stdexcept>

namespace outbox::testing {
namespace {

void check_ttl(std::chrono::milliseconds ttl) {
  if (ttl.count() <= 0 || ttl > std::chrono::hours(24 * 365)) {
    throw std::invalid_argument("lease ttl must be > 0 and at most a year");
  }
}

bool live(const LeaseInfo& row, Timestamp now) {
  return row.owner && row.expires_at && *row.expires_at > now;
}

}  // namespace

LeaseInfo& InMemoryLeaseStore::live_state(LeaseInfo& row, Timestamp now) const {
  row.live = live(row, now);
  return row;
}

std::optional<LeaseToken> InMemoryLeaseStore::acquire(sql::Connection&, std::string_view name,
                                                      std::string_view owner,
                                                      std::chrono::milliseconds ttl) {
  validate_lease_name(name);
  validate_lease_name(owner);
  check_ttl(ttl);
  std::lock_guard lock(mutex_);
  const auto now = clock_->now();
  auto it = rows_.find(name);
  if (it == rows_.end()) {
    it = rows_.emplace(std::string(name), LeaseInfo{.name = std::string(name)}).first;
  }
  LeaseInfo& row = it->second;
  if (live(row, now)) {
    return std::nullopt;
  }
  row.owner = std::string(owner);
  ++row.epoch;
  row.acquired_at = row.renewed_at = now;
  row.expires_at = now + ttl;
  return LeaseToken{row.name, *row.owner, row.epoch};
}

bool InMemoryLeaseStore::renew(sql::Connection&, const LeaseToken& token,
                               std::chrono::milliseconds ttl) {
  check_ttl(ttl);
  std::lock_guard lock(mutex_);
  const auto now = clock_->now();
  auto it = rows_.find(token.name);
  if (it == rows_.end() || it->second.owner != token.owner || it->second.epoch != token.epoch ||
      !live(it->second, now)) {
    return false;
  }
  it->second.renewed_at = now;
  it->second.expires_at = now + ttl;
  return true;
}

bool InMemoryLeaseStore::release(sql::Connection&, const LeaseToken& token) {
  std::lock_guard lock(mutex_);
  auto it = rows_.find(token.name);
  if (it == rows_.end() || it->second.owner != token.owner || it->second.epoch != token.epoch) {
    return false;
  }
  it->second.owner.reset();
  it->second.expires_at.reset();
  return true;
}

bool InMemoryLeaseStore::holds(sql::Connection&, const LeaseToken& token) {
  return holds(token);
}

bool InMemoryLeaseStore::holds(const LeaseToken& token) const {
  std::lock_guard lock(mutex_);
  auto it = rows_.find(token.name);
  return it != rows_.end() && it->second.owner == token.owner && it->second.epoch == token.epoch &&
         live(it->second, clock_->now());
}

std::optional<LeaseInfo> InMemoryLeaseStore::find(sql::Connection&, std::string_view name) {
  validate_lease_name(name);
  std::lock_guard lock(mutex_);
  auto it = rows_.find(name);
  if (it == rows_.end()) {
    return std::nullopt;
  }
  LeaseInfo row = it->second;
  return live_state(row, clock_->now());
}

std::vector<LeaseInfo> InMemoryLeaseStore::list(sql::Connection&) {
  std::lock_guard lock(mutex_);
  const auto now = clock_->now();
  std::vector<LeaseInfo> out;
  for (auto [name, row] : rows_) {
    out.push_back(live_state(row, now));
  }
  return out;
}

}  // namespace outbox::testing
