#pragma once
// One chaos round: a fresh outbox table, writers and relays as processes, faults for a while, a
// drain, and the ledger's verdict.

#include <atomic>
#include <chrono>
#include <cstddef>
#include <map>
#include <string>
#include <vector>

#include "ledger.hpp"
#include "receiver.hpp"

namespace outbox::chaos {

/// How the relays deliver, and so which order the ledger checks.
///   groups:       message groups (per-key order across active relays)
///   concurrent:   claim mode, no order
///   ordered:      standby relays in ordered mode (per-aggregate order from the leader)
///   subscription: one subscription, commit order, its lease moving between relays
const std::vector<std::string>& modes();

/// The faults of `kinds` that `mode` promises to survive with order kept. Ordered mode makes one
/// attempt per event (a failed one goes DEAD and the next proceeds, by design: message groups are
/// the mode that keeps order through failures), so it runs without the endpoint faults.
std::vector<std::string> faults_for(const std::string& mode, std::vector<std::string> kinds);

struct RoundOptions {
  std::string db;  ///< database URL
  std::string mode = "groups";
  std::string outbox_cli;  ///< the `outbox` command
  std::string self;        ///< this program (the writers run it)
  std::string dir;         ///< the round's files: relay configs, logs, rolled-back ledgers
  std::string table;       ///< the round's outbox table (its ledger: <table>_ledger)
  unsigned long long seed = 1;
  int writers = 3;
  int relays = 3;
  int keys = 16;  ///< per writer
  int rate = 30;  ///< transactions per second per writer
  std::chrono::milliseconds duration{std::chrono::seconds(20)};
  std::chrono::milliseconds drain{std::chrono::seconds(120)};
  std::vector<std::string> faults;  ///< enabled kinds
  std::string db_restart;           ///< shell command restarting the server, or ""
  std::string disk_dir;             ///< the SQLite file's small file system, or ""
  bool keep = false;                ///< keep the tables after a clean round
};

struct RoundResult {
  LedgerResult ledger;
  std::map<std::string, int> faults;  ///< applied, by kind
  EndpointCounts endpoint;
  /// The most duplicates the faults may cause: what was in flight at each fault that can strand
  /// it (claim modes: the rows claimed by the relay killed or paused, by every relay for a server
  /// restart, connection kill or full disk; else what the configuration lets a relay hold), plus
  /// one per stalled delivery.
  std::size_t duplicate_bound = 0;
  std::size_t exits = 0;          ///< relays or writers that exited by themselves (restarted)
  std::size_t crashes = 0;        ///< relays or writers killed by a signal not sent by the harness
  std::size_t unclean_stops = 0;  ///< relays that did not exit 0 within 15 s of SIGTERM
  double seconds = 0;             ///< the whole round
  double drain_seconds = 0;       ///< from the end of the faults to the last event received
  std::string error;              ///< set when the round could not run
  /// SQLite: what `PRAGMA integrity_check` found wrong with the file after the round (empty when
  /// it answered "ok"): a corrupt file explains lost or stuck rows that no outbox logic could.
  std::vector<std::string> integrity;
  /// A failed round: each process's last distinct warnings and errors, for the CI log.
  std::vector<std::string> log_tail;
  bool ok() const {
    return error.empty() && integrity.empty() && ledger.clean() &&
           ledger.duplicates <= duplicate_bound && crashes == 0 && unclean_stops == 0;
  }
};

/// Set (from a signal handler too) to end the round at its next check: faults undone, processes
/// stopped, RoundResult::error "interrupted".
std::atomic<bool>& interrupted();

/// Runs one round, printing its faults as they happen. Never throws: a failure to set up is
/// RoundResult::error.
RoundResult run_round(const RoundOptions& options);

}  // namespace outbox::chaos
