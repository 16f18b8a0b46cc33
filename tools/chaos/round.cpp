#include "round.hpp"

#include <sys/stat.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unordered_set>

#include "faults.hpp"
#include "outbox/detect/detect.hpp"
#include "outbox/errors.hpp"
#include "outbox/store.hpp"
#include "process.hpp"
#include "writer.hpp"

namespace outbox::chaos {
namespace {

using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

// The relays' settings: short enough that faults resolve within a round, and the figures of the
// duplicate bound.
constexpr int kWorkers = 8;
constexpr int kQueue = 200;
constexpr int kPollBatch = 50;
constexpr int kGroups = 16;
constexpr int kPerGroup = 5;
constexpr int kSubscriptionBatch = 50;
constexpr auto kLeaseTtl = 2s;
constexpr auto kLockExpiry = 3s;
constexpr auto kRequestTimeout = 1s;
// A stalled delivery is answered after the relay gave up on it.
constexpr auto kStall = kRequestTimeout + 500ms;

// What one relay may have delivered without its acknowledgement reaching the table, by its
// configuration, where its claims cannot be counted: a subscription's batch (rows are not
// claimed), the ordered leader's queue and poll (no claim locking), what a relay holds of its
// partitions' groups (held by the lease, not stamped). With claims (concurrent mode) the harness
// counts the claimed rows themselves at each fault.
std::size_t configured_in_flight(const std::string& mode) {
  if (mode == "subscription") {
    return kSubscriptionBatch;
  }
  std::size_t bound = kQueue + kWorkers + kPollBatch;
  if (mode == "groups") {
    bound += kGroups * kPerGroup;
  }
  return bound;
}

// Whether the mode's claims stamp the rows (locked_by), so that what a relay holds can be counted
// in the table. A message group's rows are held by their partition's lease, not stamped: there the
// relays' configuration bounds it, as in the modes without claims.
bool claims_rows(const std::string& mode) {
  return mode == "concurrent";
}

std::string placeholder(sql::Connection& conn) {
  return conn.dialect() == "postgres" ? "$1" : "?";
}

std::string relay_config(const RoundOptions& o, const std::string& name, const std::string& url) {
  std::ostringstream c;
  auto quoted = [](const std::string& s) {
    std::string out = "\"";
    for (char ch : s) {
      if (ch == '"' || ch == '\\') {
        out += '\\';
      }
      out += ch;
    }
    return out + "\"";
  };
  c << "[database]\nurl = " << quoted(o.db) << "\ntable = " << quoted(o.table)
    << "\npool_size = 4\nconnect_timeout = \"3s\"\nio_timeout = \"5s\"\nkeepalive_idle = \"2s\"\n";
  c << "[poller]\ninterval = \"100ms\"\nbatch = " << kPollBatch << "\nlock_expiry = \""
    << kLockExpiry.count() << "s\"\nowner = " << quoted(name) << "\n";
  c << "[dispatcher]\nworkers = " << kWorkers << "\nqueue = " << kQueue
    << "\nmax_attempts = 1000\nbackoff_base = \"50ms\"\nbackoff_max = \"1s\"\n"
       "drain_timeout = \"3s\"\n";
  if (o.mode == "ordered") {
    c << "ordered = true\n";
  }
  c << "[relay]\nmode = \"" << (o.mode == "ordered" ? "standby" : "active") << "\"\nlease_ttl = \""
    << kLeaseTtl.count() << "s\"\nlease_renew = \"500ms\"\n";
  if (o.mode == "groups") {
    c << "[groups]\nmax_concurrent_groups = " << kGroups << "\nper_group = " << kPerGroup << "\n";
  }
  c << "[admin]\nenabled = false\n";
  c << "[publishers.hook]\ntype = \"http\"\nconnect_timeout = \"1s\"\nrequest_timeout = \""
    << std::chrono::milliseconds(kRequestTimeout).count() << "ms\"\n";
  if (o.mode == "subscription") {
    c << "[[subscriptions]]\nname = \"chaos\"\npublisher = \"hook\"\ntarget = " << quoted(url)
      << "\nstart = \"beginning\"\ninterval = \"100ms\"\nbatch = " << kSubscriptionBatch
      << "\nmax_errors = 0\nretry_base = \"50ms\"\nretry_max = \"1s\"\n";
  } else {
    c << "[[routes]]\npublisher = \"hook\"\ntarget = " << quoted(url) << "\n";
  }
  return c.str();
}

// Retries `f` while the database is unreachable (a round ends right after a restart fault).
template <typename F>
auto with_database(F&& f) {
  const auto deadline = Clock::now() + 60s;
  for (;;) {
    try {
      return f();
    } catch (const StoreError&) {
      if (Clock::now() > deadline) {
        throw;
      }
      // The wait between attempts to reach a restarting server.
      std::this_thread::sleep_for(200ms);
    }
  }
}

void set_up_tables(const RoundOptions& o) {
  auto pool = open_pool(o.db, 1);
  auto conn = pool->acquire();
  migrate(*conn, o.table);
  const bool mysql = conn->dialect() == "mysql";
  conn->execute("CREATE TABLE " + ledger_table(o.table) +
                " (event_id VARCHAR(64) PRIMARY KEY, w INTEGER NOT NULL, k VARCHAR(64) NOT NULL, "
                "seq BIGINT NOT NULL, UNIQUE (k, seq))" +
                (mysql ? " ENGINE=InnoDB" : ""));
}

void drop_tables(const RoundOptions& o) {
  auto pool = open_pool(o.db, 1);
  auto conn = pool->acquire();
  for (const auto& t : {ledger_table(o.table), o.table + "_subscription", o.table + "_group_block",
                        o.table + "_lease", o.table}) {
    conn->execute("DROP TABLE IF EXISTS " + t);
  }
}

// Subscriptions: the events after the subscription's cursor (0 once everything is acknowledged).
std::size_t unread(sql::Connection& conn, const RoundOptions& o) {
  auto stream = detect_stream_store(conn, o.table);
  const auto state = stream->find(conn, "chaos");
  return state ? stream->read(conn, state->cursor, 1000000).size() : 0;
}

// Claim modes: rows still pending (none once every event's acknowledgement was written).
std::size_t pending(sql::Connection& conn, const RoundOptions& o) {
  return static_cast<std::size_t>(
      conn.query("SELECT COUNT(*) FROM " + o.table + " WHERE status IN (0, 2)")[0].get_int(0));
}

// SQLite: the lines of `PRAGMA integrity_check` other than its "ok".
std::vector<std::string> integrity_problems(const RoundOptions& o) {
  auto pool = open_pool(o.db, 1);
  auto conn = pool->acquire();
  if (conn->dialect() != "sqlite") {
    return {};
  }
  std::vector<std::string> problems;
  for (const auto& row : conn->query("PRAGMA integrity_check(20)")) {
    if (row.get_text(0) != "ok") {
      problems.push_back(row.get_text(0));
    }
  }
  return problems;
}

// The last `most` distinct warning and error lines of a process's log (timestamps left out of
// the comparison), oldest first.
std::vector<std::string> last_problems(const std::string& log, std::size_t most) {
  std::ifstream in(log);
  std::vector<std::string> lines;
  for (std::string line; std::getline(in, line);) {
    if (line.find(" error ") != std::string::npos || line.find(" warning ") != std::string::npos ||
        line.rfind("writer ", 0) == 0) {
      lines.push_back(line.size() > 300 ? line.substr(0, 300) + "…" : line);
    }
  }
  std::vector<std::string> picked;
  std::unordered_set<std::string> seen;
  for (auto it = lines.rbegin(); it != lines.rend() && picked.size() < most; ++it) {
    const auto space = it->find(' ');
    const std::string text = space == std::string::npos ? *it : it->substr(space + 1);
    if (seen.insert(text).second) {
      picked.push_back(*it);
    }
  }
  return {picked.rbegin(), picked.rend()};
}

LedgerInput read_ledger(const RoundOptions& o) {
  LedgerInput in;
  in.ordered = o.mode != "concurrent";
  in.rows_acknowledge = o.mode != "subscription";
  auto pool = open_pool(o.db, 1);
  auto conn = pool->acquire();
  if (!in.rows_acknowledge) {
    in.unread = unread(*conn, o);
  }
  for (const auto& row : conn->query("SELECT event_id, k, seq FROM " + ledger_table(o.table))) {
    in.committed.push_back({row.get_text(0), row.get_text(1), row.get_int(2)});
  }
  for (const auto& row : conn->query("SELECT event_id, status FROM " + o.table)) {
    const auto status = static_cast<EventStatus>(row.get_int(1));
    in.rows[row.get_text(0)] = status == EventStatus::Done   ? RowState::Done
                               : status == EventStatus::Dead ? RowState::Dead
                                                             : RowState::Pending;
  }
  for (int w = 0; w < o.writers; ++w) {
    std::ifstream f(rolled_back_file(o.dir, w));
    for (std::string id; std::getline(f, id);) {
      if (!id.empty()) {
        in.rolled_back.insert(id);
      }
    }
  }
  return in;
}

}  // namespace

std::vector<std::string> faults_for(const std::string& mode, std::vector<std::string> kinds) {
  if (mode == "ordered") {
    std::erase_if(kinds, [](const std::string& k) { return k.rfind("endpoint-", 0) == 0; });
  }
  return kinds;
}

std::atomic<bool>& interrupted() {
  static std::atomic<bool> flag{false};
  return flag;
}

const std::vector<std::string>& modes() {
  static const std::vector<std::string> all{"groups", "subscription", "concurrent", "ordered"};
  return all;
}

RoundResult run_round(const RoundOptions& o) {
  RoundResult result;
  const auto began = Clock::now();
  try {
    ::mkdir(o.dir.c_str(), 0755);
    with_database([&] {
      set_up_tables(o);
      return 0;
    });
    Receiver receiver(std::chrono::duration_cast<std::chrono::milliseconds>(kStall));
    std::vector<std::unique_ptr<Child>> relays;
    std::vector<std::unique_ptr<Child>> writers;
    for (int i = 0; i < o.relays; ++i) {
      const std::string name = "relay-" + std::to_string(i);
      const std::string config = o.dir + "/" + name + ".toml";
      std::ofstream(config) << relay_config(o, name, receiver.url("/" + name));
      relays.push_back(std::make_unique<Child>(
          name, std::vector<std::string>{o.outbox_cli, "relay", "-c", config},
          o.dir + "/" + name + ".log"));
    }
    for (int i = 0; i < o.writers; ++i) {
      const std::string name = "writer-" + std::to_string(i);
      writers.push_back(std::make_unique<Child>(
          name,
          std::vector<std::string>{o.self, "writer", "--db", o.db, "--table", o.table, "--dir",
                                   o.dir, "--mode", o.mode, "--index", std::to_string(i), "--keys",
                                   std::to_string(o.keys), "--rate", std::to_string(o.rate),
                                   "--seed",
                                   std::to_string(o.seed * 1000 + static_cast<unsigned>(i))},
          o.dir + "/" + name + ".log"));
    }
    for (auto& r : relays) {
      r->start();
    }
    for (auto& w : writers) {
      w->start();
    }
    // A relay or writer that ends by itself is restarted, as a supervisor would, and counted (a
    // relay's against the bound, as a kill). One that exits with an error is reported (a relay
    // exits 1 when its start-up writes fail: the server down, the disk full); one that dies
    // from a signal crashed, and fails the round.
    std::size_t relay_exits = 0;
    auto watch = [&] {
      for (auto* group : {&relays, &writers}) {
        for (auto& c : *group) {
          if (const auto how = c->ended()) {
            const bool crashed = how->rfind("signal", 0) == 0;
            ++(crashed ? result.crashes : result.exits);
            relay_exits += group == &relays ? 1 : 0;
            std::printf("  %s ended by itself (%s; see %s/%s.log); restarted\n", c->name().c_str(),
                        how->c_str(), o.dir.c_str(), c->name().c_str());
            c->start();
          }
        }
      }
      return interrupted().load();
    };
    // What a fault may make be delivered again: in claim modes the rows the relay (or every
    // relay) holds claimed at that moment, else what its configuration lets it hold.
    // (Ordered and subscription modes: one relay delivers, the leader or the holder; groups: every
    // relay, each its partitions.)
    auto in_flight = [&](const std::string& relay) -> std::size_t {
      if (!claims_rows(o.mode)) {
        const auto one = configured_in_flight(o.mode);
        return relay.empty() && o.mode == "groups" ? one * static_cast<std::size_t>(o.relays) : one;
      }
      try {
        auto pool = open_pool(o.db, 1);
        auto conn = pool->acquire();
        const std::string sql =
            "SELECT COUNT(*) FROM " + o.table + " WHERE status IN (0, 2) AND locked_by IS NOT NULL";
        if (relay.empty()) {
          return static_cast<std::size_t>(conn->query(sql)[0].get_int(0));
        }
        return static_cast<std::size_t>(
            conn->query(sql + " AND locked_by = " + placeholder(*conn), {sql::TextRef{relay}})[0]
                .get_int(0));
      } catch (const std::exception&) {
        // The database cannot say (it is restarting): the configuration's figure.
        return configured_in_flight(o.mode) * static_cast<std::size_t>(o.relays);
      }
    };
    Targets targets{
        &relays,   &writers,    &receiver, o.db, o.db_restart, o.disk_dir, o.dir + "/faults.log",
        kLeaseTtl, kLockExpiry, in_flight};
    FaultInjector faults(targets, faults_for(o.mode, o.faults), o.seed, 700ms, 2000ms);
    const auto start = Clock::now();
    faults.run(start, start + o.duration, watch);
    faults.heal();
    for (auto& w : writers) {
      w->stop(15s);
    }
    const auto drain_start = Clock::now();
    auto in = with_database([&] { return read_ledger(o); });
    std::unordered_set<std::string> ids;
    for (const auto& c : in.committed) {
      ids.insert(c.event_id);
    }
    std::printf("  writers stopped: %zu committed; draining\n", ids.size());
    std::fflush(stdout);
    // Drained when every committed event arrived and the outbox knows it (rows DONE, the
    // subscription's cursor at the end): an event delivered but not acknowledged would go again.
    auto acknowledged = [&] {
      try {
        auto pool = open_pool(o.db, 1);
        auto conn = pool->acquire();
        return (o.mode == "subscription" ? unread(*conn, o) : pending(*conn, o)) == 0;
      } catch (const std::exception&) {
        return false;
      }
    };
    while (Clock::now() - drain_start < o.drain && !interrupted() &&
           (receiver.received_of(ids) < ids.size() || !acknowledged())) {
      watch();
      // The drain's poll period.
      std::this_thread::sleep_for(100ms);
    }
    if (interrupted()) {
      throw std::runtime_error("interrupted");
    }
    result.drain_seconds = std::chrono::duration<double>(Clock::now() - drain_start).count();
    for (auto& r : relays) {
      if (!r->stop(15s)) {
        ++result.unclean_stops;
        std::printf("  %s did not stop cleanly on SIGTERM (see its log)\n", r->name().c_str());
      }
    }
    in = with_database([&] { return read_ledger(o); });
    result.integrity = with_database([&] { return integrity_problems(o); });
    in.receipts = receiver.receipts();
    result.ledger = check(in);
    result.faults = faults.applied();
    result.endpoint = receiver.counts();
    result.duplicate_bound = faults.in_flight_at_faults() +
                             relay_exits * configured_in_flight(o.mode) + result.endpoint.stalled;
    if (!result.ok()) {
      for (const auto* group : {&relays, &writers}) {
        for (const auto& c : *group) {
          for (auto& line : last_problems(o.dir + "/" + c->name() + ".log", 6)) {
            result.log_tail.push_back(c->name() + ": " + line);
          }
        }
      }
    }
    if (!result.ok() || o.keep) {
      // Every delivery in arrival order, for the investigation.
      std::ofstream out(o.dir + "/receipts.tsv");
      for (const auto& r : in.receipts) {
        out << r.event_id << '\t' << r.key << '\t' << r.seq << '\t' << r.via << '\n';
      }
    }
    if (!o.disk_dir.empty() && (o.keep || !result.ok())) {
      // The small file system goes with the harness: the database is kept beside the logs.
      const std::string file = o.db.substr(o.db.rfind('/') + 1);
      for (const char* suffix : {"", "-wal", "-shm"}) {
        std::error_code ignored;
        std::filesystem::copy_file(o.disk_dir + "/" + file + suffix, o.dir + "/" + file + suffix,
                                   std::filesystem::copy_options::overwrite_existing, ignored);
      }
    }
    if (result.ok() && !o.keep) {
      with_database([&] {
        drop_tables(o);
        return 0;
      });
    }
  } catch (const std::exception& e) {
    result.error = e.what();
  }
  result.seconds = std::chrono::duration<double>(Clock::now() - began).count();
  return result;
}

}  // namespace outbox::chaos
