// outbox-chaos: writers and relays as processes against a real database, faults injected at random
// from a seed, and a ledger that says what was lost, duplicated, stuck or out of order.
// See docs/reliability.md ("The chaos harness").

#include <sched.h>
#include <signal.h>
#include <sys/mount.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "faults.hpp"
#include "round.hpp"
#include "writer.hpp"

namespace {

using namespace outbox::chaos;

constexpr const char* kUsage = R"(usage: outbox-chaos [options]
  --engine sqlite|postgres|mysql  the database: a SQLite file of its own, or the throwaway server
                                  of scripts/with-test-servers (OUTBOX_TEST_PG_URL / _MYSQL_URL,
                                  restarted through OUTBOX_TEST_PG_CTL / _MYSQL_CTL)
  --db URL                        or any database (then restart-db needs --db-restart)
  --db-restart COMMAND            shell command that restarts the database server
  --rounds N                      rounds (default 1); round r uses seed + r and its own table
  --seed S                        the first round's seed (default: from the clock, printed)
  --mode M                        groups|subscription|concurrent|ordered, or rotate (default:
                                  rotate, round r takes the r-th mode)
  --duration SECONDS              faults per round (default 20)
  --drain SECONDS                 the most a round waits for delivery afterwards (default 120)
  --writers N --relays N          processes (default 3 and 3)
  --keys N                        ordering keys per writer (default 16)
  --rate N                        transactions per second per writer (default 30)
  --faults LIST                   comma-separated kinds, or all (default): kill-relay,
                                  pause-relay, kill-writer, restart-db, kill-connections,
                                  endpoint-fail, endpoint-throttle, endpoint-stall, disk-full
  --work DIR                      where configs and logs go (default: a new temporary folder)
  --outbox PATH                   the outbox command (default: the one built beside this program)
  --markdown                      the summary as a Markdown table
  --keep                          keep each round's tables (dropped after a clean round)
Exit status: 0 when every round lost nothing, delivered nothing uncommitted, left nothing stuck
or DEAD, kept order and stayed within its duplicate bound; 1 otherwise; 77 when --engine names a
server whose variables are not set (2 with OUTBOX_REQUIRE_SERVERS=1); 2 on bad usage.
)";

std::optional<std::string> env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::optional<std::string>(v) : std::nullopt;
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream in(s);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) {
      out.push_back(item);
    }
  }
  return out;
}

// The port of mysql://user@host:PORT/db.
std::string url_port(const std::string& url) {
  const auto at = url.rfind(':');
  const auto slash = url.find('/', at == std::string::npos ? 0 : at);
  return at == std::string::npos ? "3306" : url.substr(at + 1, slash - at - 1);
}

// A small file system of its own for the SQLite file, so that disk-full fills it and nothing else.
// Mounted in a mount namespace of the harness's own (its children inherit it) where it can: then
// it goes away with the last of them, however the harness ends.
class SmallDisk {
 public:
  explicit SmallDisk(const std::string& dir) : dir_(dir) {
    std::filesystem::create_directories(dir);
    if (::unshare(CLONE_NEWNS) == 0) {
      ::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr);
    }
    mounted_ = ::mount("outbox-chaos", dir.c_str(), "tmpfs", 0, "size=256m") == 0;
  }
  ~SmallDisk() {
    if (mounted_) {
      ::umount2(dir_.c_str(), MNT_DETACH);
    }
  }
  SmallDisk(const SmallDisk&) = delete;
  SmallDisk& operator=(const SmallDisk&) = delete;
  bool mounted() const { return mounted_; }

 private:
  std::string dir_;
  bool mounted_ = false;
};

extern "C" void on_signal(int) {
  interrupted() = true;
}

int run_writer_command(int argc, char** argv) {
  WriterOptions o;
  for (int i = 2; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    const std::string v = argv[i + 1];
    if (k == "--db") {
      o.db = v;
    } else if (k == "--table") {
      o.table = v;
    } else if (k == "--dir") {
      o.dir = v;
    } else if (k == "--mode") {
      o.mode = v;
    } else if (k == "--index") {
      o.index = std::stoi(v);
    } else if (k == "--keys") {
      o.keys = std::stoi(v);
    } else if (k == "--rate") {
      o.rate = std::stoi(v);
    } else if (k == "--seed") {
      o.seed = std::stoull(v);
    }
  }
  return run_writer(o);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1 && std::string(argv[1]) == "writer") {
    return run_writer_command(argc, argv);
  }
  // Ctrl-C or SIGTERM ends the round in progress properly: its relays and writers are stopped (they
  // run in process groups of their own, so the terminal's signal does not reach them) and the
  // tmpfs is unmounted.
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  std::map<std::string, std::string> opt;
  bool markdown = false;
  bool keep = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--markdown") {
      markdown = true;
    } else if (a == "--keep") {
      keep = true;
    } else if (a == "-h" || a == "--help") {
      std::fputs(kUsage, stdout);
      return 0;
    } else if (a.rfind("--", 0) == 0 && i + 1 < argc) {
      opt[a.substr(2)] = argv[++i];
    } else {
      std::fprintf(stderr, "outbox-chaos: unexpected argument %s\n%s", a.c_str(), kUsage);
      return 2;
    }
  }
  const auto get = [&](const std::string& k, const std::string& def) {
    const auto it = opt.find(k);
    return it == opt.end() ? def : it->second;
  };
  try {
    if (opt.contains("engine") && opt.contains("db")) {
      std::fprintf(stderr, "outbox-chaos: give --engine or --db, not both\n");
      return 2;
    }
    const std::string engine = get("engine", opt.contains("db") ? "" : "sqlite");
    std::string db = get("db", "");
    std::string restart = get("db-restart", "");
    const bool require = env("OUTBOX_REQUIRE_SERVERS").value_or("") == "1";
    if (engine == "postgres" || engine == "mysql") {
      const char* var = engine == "postgres" ? "OUTBOX_TEST_PG_URL" : "OUTBOX_TEST_MYSQL_URL";
      if (!env(var)) {
        std::printf("no test server: %s is not set (run under scripts/with-test-servers)\n", var);
        return require ? 2 : 77;
      }
      db = *env(var);
      if (engine == "postgres" && env("OUTBOX_TEST_PG_CTL")) {
        restart = *env("OUTBOX_TEST_PG_CTL") + " restart -m immediate >/dev/null";
      } else if (engine == "mysql" && env("OUTBOX_TEST_MYSQL_CTL") &&
                 env("OUTBOX_TEST_MYSQL_PIDFILE")) {
        // SIGKILL (a crash: InnoDB recovers at start), then the same command line again, then
        // wait until it answers.
        restart = "p=$(cat '" + *env("OUTBOX_TEST_MYSQL_PIDFILE") +
                  "'); kill -9 $p; while [ -e /proc/$p ] && ! grep -q '^State:.*Z' "
                  "/proc/$p/status; do sleep 0.05; done; (" +
                  *env("OUTBOX_TEST_MYSQL_CTL") +
                  " >/dev/null 2>&1 &); for i in $(seq 1 600); do mariadb --no-defaults -h "
                  "127.0.0.1 -P " +
                  url_port(db) +
                  " -u root -e 'SELECT 1' >/dev/null 2>&1 && exit 0; sleep 0.1; done; exit 1";
      }
    } else if (engine != "sqlite" && engine != "") {
      std::fprintf(stderr, "outbox-chaos: unknown engine %s\n", engine.c_str());
      return 2;
    }
    const int rounds = std::stoi(get("rounds", "1"));
    const unsigned long long seed =
        opt.contains("seed") ? std::stoull(opt["seed"])
                             : static_cast<unsigned long long>(::time(nullptr)) % 1000000;
    const std::string mode = get("mode", "rotate");
    if (mode != "rotate" && std::find(modes().begin(), modes().end(), mode) == modes().end()) {
      std::fprintf(stderr, "outbox-chaos: unknown mode %s\n", mode.c_str());
      return 2;
    }
    std::vector<std::string> faults =
        get("faults", "all") == "all" ? fault_kinds() : split(get("faults", ""));
    for (const auto& f : faults) {
      if (std::find(fault_kinds().begin(), fault_kinds().end(), f) == fault_kinds().end()) {
        std::fprintf(stderr, "outbox-chaos: unknown fault %s\n", f.c_str());
        return 2;
      }
    }
    std::string work = get("work", "");
    if (work.empty()) {
      char tmpl[] = "/tmp/outbox-chaos-XXXXXX";
      if (!::mkdtemp(tmpl)) {
        throw std::runtime_error("cannot create a temporary folder");
      }
      work = tmpl;
    }
    std::filesystem::create_directories(work);
    const auto self = std::filesystem::canonical("/proc/self/exe");
    const std::string cli = get(
        "outbox", (self.parent_path().parent_path().parent_path() / "apps/outbox/outbox").string());

    // Faults the database cannot have are left out, and said so.
    std::unique_ptr<SmallDisk> disk;
    const bool sqlite = db.empty() || db.rfind("sqlite", 0) == 0;
    auto drop = [&](const std::string& kind, const std::string& why) {
      const auto it = std::find(faults.begin(), faults.end(), kind);
      if (it != faults.end()) {
        faults.erase(it);
        std::printf("%s: left out (%s)\n", kind.c_str(), why.c_str());
      }
    };
    if (sqlite) {
      drop("restart-db", "SQLite has no server");
      drop("kill-connections", "SQLite has no server");
      const bool wants_disk = std::find(faults.begin(), faults.end(), "disk-full") != faults.end();
      if (wants_disk && !db.empty()) {
        drop("disk-full", "the --db file is not on the harness's own small file system");
      } else if (wants_disk) {
        disk = std::make_unique<SmallDisk>(work + "/disk");
        if (!disk->mounted()) {
          drop("disk-full", "mounting a tmpfs needs root (CAP_SYS_ADMIN)");
        }
      }
    } else {
      drop("disk-full", "SQLite only: a server's disk is not ours to fill");
      if (restart.empty()) {
        drop("restart-db", "no --db-restart command");
      }
    }

    std::printf("outbox-chaos: seed %llu, %d round(s), work %s\n", seed, rounds, work.c_str());
    std::vector<std::pair<RoundOptions, RoundResult>> results;
    bool all_ok = true;
    for (int r = 0; r < rounds; ++r) {
      RoundOptions o;
      o.seed = seed + static_cast<unsigned long long>(r);
      o.mode = mode == "rotate" ? modes()[static_cast<std::size_t>(r) % modes().size()] : mode;
      o.table = "chaos_" + std::to_string(o.seed);
      o.dir = work + "/round-" + std::to_string(r);
      o.db = sqlite ? "sqlite://" + (disk && disk->mounted() ? work + "/disk" : o.dir) + "/" +
                          o.table + ".db"
                    : db;
      if (sqlite && !db.empty() && engine.empty()) {
        o.db = db;
      }
      o.outbox_cli = cli;
      o.self = self.string();
      o.writers = std::stoi(get("writers", "3"));
      o.relays = std::stoi(get("relays", "3"));
      o.keys = std::stoi(get("keys", "16"));
      o.rate = std::stoi(get("rate", "30"));
      o.duration =
          std::chrono::milliseconds(static_cast<long>(std::stod(get("duration", "20")) * 1000));
      o.drain = std::chrono::milliseconds(static_cast<long>(std::stod(get("drain", "120")) * 1000));
      o.faults = faults;
      o.db_restart = restart;
      o.disk_dir = disk && disk->mounted() ? work + "/disk" : "";
      o.keep = keep;
      std::printf("round %d: seed %llu, mode %s, table %s\n", r, o.seed, o.mode.c_str(),
                  o.table.c_str());
      if (faults_for(o.mode, faults).size() < faults.size()) {
        std::printf(
            "  endpoint faults left out: ordered mode makes one attempt per event (a "
            "failure goes DEAD and the next event proceeds)\n");
      }
      std::fflush(stdout);
      auto res = run_round(o);
      const auto& l = res.ledger;
      std::printf(
          "round %d: %s  committed %zu, rolled back %zu, delivered %zu, lost %zu, uncommitted "
          "delivered %zu, stuck %zu, dead %zu, unacknowledged %zu, mismatched %zu, order "
          "violations %zu, duplicates %zu (bound %zu, late %zu), exits %zu, crashes %zu, unclean "
          "stops %zu, drain %.1f s%s%s\n",
          r, res.ok() ? "OK" : "FAILED", l.committed, l.rolled_back, l.delivered, l.lost,
          l.uncommitted_delivered, l.stuck, l.dead, l.unacknowledged, l.mismatched,
          l.order_violations, l.duplicates, res.duplicate_bound, l.late_duplicates, res.exits,
          res.crashes, res.unclean_stops, res.drain_seconds,
          res.error.empty() ? "" : "; error: ", res.error.c_str());
      for (const auto& p : l.problems) {
        std::printf("    %s\n", p.c_str());
      }
      for (const auto& n : l.notes) {
        std::printf("    (%s)\n", n.c_str());
      }
      for (const auto& i : res.integrity) {
        std::printf("    database integrity check: %s\n", i.c_str());
      }
      if (!res.log_tail.empty()) {
        std::printf("  the processes' last warnings and errors:\n");
        for (const auto& line : res.log_tail) {
          std::printf("    %s\n", line.c_str());
        }
      }
      std::fflush(stdout);
      all_ok = all_ok && res.ok();
      results.emplace_back(o, res);
      if (interrupted()) {
        break;
      }
    }

    // The summary, one line per round.
    std::printf(markdown ? "\n| round | seed | mode | faults | committed | delivered | lost | "
                           "uncommitted delivered | stuck or dead | unacknowledged | order | "
                           "duplicates (bound) | drain s | ok |\n"
                           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n"
                         : "\nround  seed      mode          faults  committed  delivered  lost  "
                           "uncommitted  stuck  unacked  order  duplicates(bound)  drain  ok\n");
    for (std::size_t r = 0; r < results.size(); ++r) {
      const auto& [o, res] = results[r];
      const auto& l = res.ledger;
      int n = 0;
      for (const auto& [kind, count] : res.faults) {
        n += count;
      }
      const std::string dup =
          std::to_string(l.duplicates) + " (" + std::to_string(res.duplicate_bound) + ")";
      std::printf(markdown ? "| %zu | %llu | %s | %d | %zu | %zu | %zu | %zu | %zu | %zu | %zu | "
                             "%s | %.1f | %s |\n"
                           : "%-6zu %-9llu %-13s %-7d %-10zu %-10zu %-5zu %-12zu %-6zu %-8zu "
                             "%-6zu %-18s %-6.1f %s\n",
                  r, o.seed, o.mode.c_str(), n, l.committed, l.delivered, l.lost,
                  l.uncommitted_delivered, l.stuck + l.dead, l.unacknowledged, l.order_violations,
                  dup.c_str(), res.drain_seconds, res.ok() ? "yes" : "NO");
    }
    std::map<std::string, int> totals;
    for (const auto& [o, res] : results) {
      for (const auto& [kind, count] : res.faults) {
        totals[kind] += count;
      }
    }
    std::printf("\nfaults applied:");
    for (const auto& [kind, count] : totals) {
      std::printf(" %s %d", kind.c_str(), count);
    }
    std::printf("\n%s\n", all_ok ? "outbox-chaos: every round clean"
                                 : "outbox-chaos: FAILED (see the rounds above and their logs)");
    return all_ok ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-chaos: %s\n", e.what());
    return 2;
  }
}
