#pragma once
// Spreads a set of leases (subscriptions, partitions) over the live members of a lease table:
// each member takes up to its share of those nobody holds, and hands back what it holds beyond
// its share. Members are the live "member:<owner>" leases. Not thread-safe: one balancer thread.

#include <set>
#include <string>
#include <vector>

namespace outbox {
class LeaseManager;
}

namespace outbox::internal {

class LeaseBalancer {
 public:
  /// One lease the balancer may take or hand back.
  class Item {
   public:
    virtual ~Item() = default;
    virtual const std::string& lease() const = 0;
    /// True while this process holds (or is still handing back) the lease.
    virtual bool held() const = 0;
    /// The lease was just taken.
    virtual void gained() = 0;
    /// Hand the lease back once the work under it has ended.
    virtual void yield() = 0;
  };

  /// The presence lease of `owner`: "member:<owner>".
  static std::string member_lease(const std::string& owner);

  /// One round. Throws StoreError (the caller logs it and tries again next round).
  void balance(LeaseManager& leases, const std::vector<Item*>& items);

 private:
  std::set<std::string, std::less<>> members_;  // live members last round
  std::set<std::string, std::less<>> free_;     // leases nobody held last round
  std::set<std::string, std::less<>> kept_;     // taken beyond the share: nobody else took them
};

}  // namespace outbox::internal
