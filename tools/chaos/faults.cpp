#include "faults.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <thread>
#include <vector>

#include "outbox/detect/detect.hpp"

namespace outbox::chaos {
namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

}  // namespace

const std::vector<std::string>& fault_kinds() {
  static const std::vector<std::string> kinds{
      "kill-relay",    "pause-relay",       "kill-writer",    "restart-db", "kill-connections",
      "endpoint-fail", "endpoint-throttle", "endpoint-stall", "disk-full"};
  return kinds;
}

FaultInjector::FaultInjector(Targets targets, std::vector<std::string> kinds,
                             unsigned long long seed, milliseconds min_gap, milliseconds max_gap)
    : t_(std::move(targets)),
      kinds_(std::move(kinds)),
      rng_(seed),
      min_gap_(min_gap),
      max_gap_(max_gap) {}

milliseconds FaultInjector::between(int lo_ms, int hi_ms) {
  return milliseconds(lo_ms + static_cast<int>(rng_() % static_cast<unsigned>(hi_ms - lo_ms + 1)));
}

void FaultInjector::say(const std::string& text) {
  const double at = std::chrono::duration<double>(Clock::now() - start_).count();
  std::printf("  %7.2fs  %s\n", at, text.c_str());
  std::fflush(stdout);
}

Child* FaultInjector::pick(std::vector<std::unique_ptr<Child>>& children) {
  std::vector<Child*> live;
  for (auto& c : children) {
    if (c->running() && !c->paused()) {
      live.push_back(c.get());
    }
  }
  // Leave one alive: a fault on every node at once is a full outage, which restart-db covers.
  if (live.size() < 2) {
    return nullptr;
  }
  return live[rng_() % live.size()];
}

void FaultInjector::run(Clock::time_point start, Clock::time_point end,
                        const std::function<bool()>& abort) {
  start_ = start;
  auto next = Clock::now() +
              between(static_cast<int>(min_gap_.count()), static_cast<int>(max_gap_.count()));
  auto next_sample = Clock::now();
  while (Clock::now() < end && !abort()) {
    undo_due(false);
    if (disk_full_ && Clock::now() >= next_sample) {
      // While the disk is full some writes still fit in the WAL's pages: a row may be claimed,
      // delivered, its acknowledgement refused and taken again within the window, between the
      // counts at its start and end. It stays claimed at least the own-claim grace (lock expiry
      // / 10) between the two deliveries, so a count every 100 ms sees it.
      count_in_flight("");
      next_sample = Clock::now() + milliseconds(100);
    }
    if (Clock::now() >= next && !kinds_.empty()) {
      inject(kinds_[rng_() % kinds_.size()]);
      next = Clock::now() +
             between(static_cast<int>(min_gap_.count()), static_cast<int>(max_gap_.count()));
    }
    // The fault loop's tick: faults and their undoing are scheduled in tens of milliseconds.
    std::this_thread::sleep_for(milliseconds(20));
  }
}

void FaultInjector::heal() {
  undo_due(true);
}

void FaultInjector::undo_due(bool all) {
  std::stable_sort(undo_.begin(), undo_.end(),
                   [](const Undo& a, const Undo& b) { return a.due < b.due; });
  while (!undo_.empty() && (all || undo_.front().due <= Clock::now())) {
    auto u = std::move(undo_.front());
    undo_.erase(undo_.begin());
    say("  " + u.what);
    u.action();
  }
}

void FaultInjector::inject(const std::string& kind) {
  if (kind == "kill-relay" || kind == "kill-writer") {
    auto* child = pick(kind == "kill-relay" ? *t_.relays : *t_.writers);
    if (!child) {
      return;
    }
    child->kill_hard();
    ++applied_[kind];
    const std::size_t flying = kind == "kill-relay" ? count_in_flight(child->name()) : 0;
    say("SIGKILL " + child->name() +
        (kind == "kill-relay" ? " (" + std::to_string(flying) + " in flight)" : ""));
    undo_.push_back(
        {Clock::now() + between(0, 1500), "restart " + child->name(), [child] { child->start(); }});
  } else if (kind == "pause-relay") {
    auto* child = pick(*t_.relays);
    if (!child) {
      return;
    }
    child->pause();
    ++applied_[kind];
    // Past the lease ttl and the claims' expiry: the others take its work over meanwhile.
    const auto held = std::max(t_.lease_ttl, t_.lock_expiry) + between(500, 2500);
    const auto flying = count_in_flight(child->name());
    say("SIGSTOP " + child->name() + " for " + std::to_string(held.count()) + " ms (" +
        std::to_string(flying) + " in flight)");
    undo_.push_back(
        {Clock::now() + held, "SIGCONT " + child->name(), [child] { child->resume(); }});
  } else if (kind == "restart-db") {
    if (t_.db_restart.empty()) {
      return;
    }
    ++applied_[kind];
    count_in_flight("");
    restart_database();
    // Rows claimed while the server went down (after the count) whose acknowledgement then
    // failed are still claimed now.
    count_in_flight("");
  } else if (kind == "kill-connections") {
    if (t_.db.rfind("sqlite", 0) == 0) {
      return;
    }
    ++applied_[kind];
    count_in_flight("");
    kill_connections();
    // The same for rows claimed while the harness connected and ended the sessions (a round
    // once saw one duplicate over the bound counted before the kill alone).
    count_in_flight("");
  } else if (kind.rfind("endpoint-", 0) == 0) {
    if (endpoint_faulty_) {
      return;
    }
    const auto mode = kind == "endpoint-fail"       ? EndpointMode::Failing
                      : kind == "endpoint-throttle" ? EndpointMode::Throttle
                                                    : EndpointMode::Stalling;
    t_.receiver->set_mode(mode);
    endpoint_faulty_ = true;
    ++applied_[kind];
    const auto held = between(500, 2500);
    say("endpoint " + kind.substr(9) + " for " + std::to_string(held.count()) + " ms");
    undo_.push_back({Clock::now() + held, "endpoint healthy", [this] {
                       t_.receiver->set_mode(EndpointMode::Healthy);
                       endpoint_faulty_ = false;
                     }});
  } else if (kind == "disk-full") {
    if (t_.disk_dir.empty() || disk_full_) {
      return;
    }
    ++applied_[kind];
    fill_disk();
  }
}

std::size_t FaultInjector::count_in_flight(const std::string& relay) {
  const auto n = t_.in_flight ? t_.in_flight(relay) : 0;
  in_flight_ += n;
  return n;
}

void FaultInjector::restart_database() {
  say("database restart");
  const auto began = Clock::now();
  const int rc = run_shell(t_.db_restart, t_.log);
  const double took = std::chrono::duration<double>(Clock::now() - began).count();
  char line[96];
  std::snprintf(line, sizeof line, "  database back (%.1f s, exit %d)", took, rc);
  say(line);
}

void FaultInjector::kill_connections() {
  // The harness's own short-lived connection asks the server to end every other session of the
  // database: the relays' pools, their LISTEN connections, the writers mid-transaction.
  try {
    auto pool = open_pool(t_.db, 1);
    auto conn = pool->acquire();
    std::size_t killed = 0;
    if (conn->dialect() == "postgres") {
      const auto rows = conn->query(
          "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = "
          "current_database() AND pid <> pg_backend_pid() AND backend_type = 'client backend'");
      killed = rows.size();
    } else {
      const auto rows = conn->query(
          "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> "
          "CONNECTION_ID()");
      for (const auto& row : rows) {
        try {
          conn->execute("KILL CONNECTION " + std::to_string(row.get_int(0)));
          ++killed;
        } catch (const std::exception&) {
          // It ended by itself meanwhile.
        }
      }
    }
    say("killed " + std::to_string(killed) + " server connections");
  } catch (const std::exception& e) {
    say(std::string("connection kill failed: ") + e.what());
  }
}

void FaultInjector::fill_disk() {
  // A ballast file takes every free block of the SQLite file's small file system: the writers'
  // commits and the relays' status writes fail with "database or disk is full" until it goes.
  const std::string ballast = t_.disk_dir + "/ballast";
  const int fd = ::open(ballast.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (fd < 0) {
    say("disk-full: cannot create " + ballast);
    return;
  }
  std::vector<char> block(1 << 20, 'x');
  std::size_t written = 0;
  for (;;) {
    const auto n = ::write(fd, block.data(), block.size());
    if (n <= 0) {
      break;
    }
    written += static_cast<std::size_t>(n);
  }
  // Byte by byte to the last free one (a partial block remains after the big writes).
  while (::write(fd, block.data(), 1) == 1) {
    ++written;
  }
  ::close(fd);
  disk_full_ = true;
  const auto flying = count_in_flight("");
  const auto held = between(500, 2500);
  say("disk full (" + std::to_string(written >> 20) + " MiB of ballast) for " +
      std::to_string(held.count()) + " ms (" + std::to_string(flying) + " in flight)");
  undo_.push_back({Clock::now() + held, "disk has room again", [this, ballast] {
                     // Writes that fit in the WAL's existing pages still succeed on a full disk:
                     // rows claimed meanwhile whose acknowledgement then failed are pending too.
                     const auto claimed = count_in_flight("");
                     ::unlink(ballast.c_str());
                     disk_full_ = false;
                     say("  (" + std::to_string(claimed) + " in flight at its end)");
                   }});
}

}  // namespace outbox::chaos
