#pragma once
// The chaos harness's faults: chosen at random from a seed, applied to the relays, writers,
// database and endpoint of a run, each undone after a while (a killed process restarts, a paused
// one resumes, the endpoint heals, the disk gets room again).

#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "process.hpp"
#include "receiver.hpp"

namespace outbox::chaos {

/// Every fault kind, by its command-line name.
const std::vector<std::string>& fault_kinds();

/// What the faults act on.
struct Targets {
  std::vector<std::unique_ptr<Child>>* relays = nullptr;
  std::vector<std::unique_ptr<Child>>* writers = nullptr;
  Receiver* receiver = nullptr;
  std::string db;          ///< URL, for connection kills
  std::string db_restart;  ///< shell command restarting the server ("" when unavailable)
  std::string disk_dir;    ///< a small file system holding the SQLite file ("" when unavailable)
  std::string log;         ///< where shell commands write
  std::chrono::milliseconds lease_ttl{};
  std::chrono::milliseconds lock_expiry{};
  /// What a relay (all of them: "") holds in flight now: what a fault that strands it may make
  /// be delivered again. Asked right after a relay is killed or paused (it takes no more), before
  /// a server restart or connection kill, once the disk is full.
  std::function<std::size_t(const std::string& relay)> in_flight;
};

class FaultInjector {
 public:
  /// `kinds` are the enabled faults (names from fault_kinds()).
  FaultInjector(Targets targets, std::vector<std::string> kinds, unsigned long long seed,
                std::chrono::milliseconds min_gap, std::chrono::milliseconds max_gap);

  /// Injects faults until `end` (undoing each when its time comes), printing each as it goes
  /// with the time since `start`. Returns early when `abort` says so.
  void run(std::chrono::steady_clock::time_point start, std::chrono::steady_clock::time_point end,
           const std::function<bool()>& abort);
  /// Undoes every fault still in effect, now.
  void heal();
  /// How many of each kind were applied.
  const std::map<std::string, int>& applied() const { return applied_; }
  /// The sum of what was in flight at each fault (Targets::in_flight).
  std::size_t in_flight_at_faults() const { return in_flight_; }

 private:
  struct Undo {
    std::chrono::steady_clock::time_point due;
    std::string what;
    std::function<void()> action;
  };
  void inject(const std::string& kind);
  void undo_due(bool all);
  std::chrono::milliseconds between(int lo_ms, int hi_ms);
  Child* pick(std::vector<std::unique_ptr<Child>>& children);
  void say(const std::string& text);
  void kill_connections();
  std::size_t count_in_flight(const std::string& relay);
  void restart_database();
  void fill_disk();

  Targets t_;
  std::vector<std::string> kinds_;
  std::mt19937_64 rng_;
  std::chrono::milliseconds min_gap_, max_gap_;
  std::chrono::steady_clock::time_point start_;
  std::vector<Undo> undo_;
  std::map<std::string, int> applied_;
  std::size_t in_flight_ = 0;
  bool endpoint_faulty_ = false;
  bool disk_full_ = false;
};

}  // namespace outbox::chaos
