#include "outbox/internal/lease_balancer.hpp"

#include <algorithm>

#include "outbox/lease_manager.hpp"

namespace outbox::internal {
namespace {

constexpr std::string_view kMemberPrefix = "member:";

}  // namespace

std::string LeaseBalancer::member_lease(const std::string& owner) {
  return std::string(kMemberPrefix) + owner;
}

void LeaseBalancer::balance(LeaseManager& leases, const std::vector<Item*>& items) {
  const auto infos = leases.leases();
  std::set<std::string, std::less<>> live;
  std::set<std::string, std::less<>> member_names;
  for (const auto& info : infos) {
    if (info.live) {
      live.insert(info.name);
      if (info.name.starts_with(kMemberPrefix)) {
        member_names.insert(info.name);
      }
    }
  }
  // Members may be configured with different items, so a share is a target, never a reason to
  // leave one unheld: an item nobody took for a whole round is taken regardless (and kept:
  // nobody else wants it) until the members change.
  if (member_names != members_) {
    members_ = std::move(member_names);
    kept_.clear();
  }
  const std::size_t members = std::max<std::size_t>(members_.size(), 1);
  const std::size_t share = (items.size() + members - 1) / members;
  std::size_t held = 0;
  for (const auto* item : items) {
    held += item->held() ? 1 : 0;
  }
  std::set<std::string, std::less<>> free_now;
  for (auto* item : items) {
    if (item->held() || live.contains(item->lease())) {
      continue;
    }
    const bool unwanted = free_.contains(item->lease());
    if ((held < share || unwanted) && leases.try_acquire(item->lease())) {
      if (++held > share) {
        kept_.insert(item->lease());
      }
      item->gained();
    } else {
      free_now.insert(item->lease());
    }
  }
  free_ = std::move(free_now);
  for (auto it = items.rbegin(); it != items.rend() && held > share; ++it) {
    if ((*it)->held() && !kept_.contains((*it)->lease())) {
      (*it)->yield();
      --held;
    }
  }
}

}  // namespace outbox::internal
