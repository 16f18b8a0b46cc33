#include "dead_commands.hpp"
#include "progress.hpp"
#include "terminal_text.hpp"

#include <cstdio>

#include "outbox/dead_event_manager.hpp"
#include "outbox/detect/detect.hpp"
#include "outbox/relay/dead_groups.hpp"
#include "outbox/relay/operations.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::cli {
namespace {

constexpr int kFailure = 1;

std::optional<std::string_view> optional_view(const std::string& s) {
  return s.empty() ? std::nullopt : std::optional<std::string_view>(s);
}

// A bulk action's progress on stderr, stopping (between two events) at Ctrl-C.
class BulkProgress {
 public:
  explicit BulkProgress(std::string what) : what_(std::move(what)) {}
  DeadEventManager::Progress callback() {
    return [this](int done, int total) {
      if (!bar_) {
        bar_.emplace(what_, total);
      }
      bar_->update(done);
      return !InterruptGuard::requested();
    };
  }
  void finish(int done, bool stopped) {
    if (bar_) {
      bar_->update(done);
      bar_->finish(stopped ? "interrupted between two events; run it again for the rest" : "");
    }
  }

 private:
  InterruptGuard guard_;
  std::string what_;
  std::optional<Progress> bar_;
};

// What a fingerprint action did, for a terminal; its exit code.
int report(const char* verb, const DeadEventManager::GroupActionResult& r,
           const std::string& fingerprint) {
  if (r.stopped) {
    std::printf("%s %d\n", verb, r.changed);
    return kInterruptedExit;
  }
  if (r.changed == 0 && r.skipped == 0) {
    std::fprintf(stderr, "outbox: no DEAD event with fingerprint %s%s\n", fingerprint.c_str(),
                 r.more ? " among the oldest --group-limit DEAD events (raise it)" : "");
    return kFailure;
  }
  std::printf("%s %d\n", verb, r.changed);
  if (r.skipped > 0) {
    std::printf("skipped %d (no longer DEAD, or not yet read by a subscription)\n", r.skipped);
  }
  if (r.more) {
    std::printf("more DEAD events than --group-limit were not looked at: run again\n");
  }
  return 0;
}

}  // namespace

DeadCommands::DeadCommands(CLI::App& app) {
  dead_ = app.add_subcommand("dead", "inspect, group, replay and discard DEAD events");
  dead_->require_subcommand(1);
  auto db = [this](CLI::App* cmd) {
    add_db_options(*cmd, db_);
    return cmd;
  };
  auto group_limit = [this](CLI::App* cmd) {
    cmd->add_option("--group-limit", group_limit_,
                    "group the oldest this many DEAD events (the rest on the next run)")
        ->check(CLI::Range(1, DeadEventManager::kReplayAllLimit))
        ->capture_default_str();
  };
  list_ = db(dead_->add_subcommand("list", "list DEAD events, oldest first"));
  list_->add_option("--type", type_, "only this event type");
  list_->add_option("--aggregate", aggregate_, "only this aggregate type");
  list_->add_option("--limit", limit_, "at most this many")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  list_->add_flag("--json", json_, "print JSON");
  groups_ = db(dead_->add_subcommand(
      "groups", "DEAD events grouped by failure fingerprint (event type + normalized error)"));
  groups_->add_flag("--json", json_, "print JSON");
  groups_->add_option("--top", top_, "show the largest this many groups")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  group_limit(groups_);
  replay_ = db(dead_->add_subcommand(
      "replay", "make DEAD events NEW again: by id, or every one of a fingerprint"));
  replay_->add_option("ids", ids_, "event ids");
  replay_->add_option("--fingerprint", fingerprint_, "every DEAD event of this fingerprint");
  group_limit(replay_);
  replay_all_ = db(dead_->add_subcommand("replay-all", "make every matching DEAD event NEW again"));
  replay_all_->add_option("--type", type_, "only this event type");
  replay_all_->add_option("--aggregate", aggregate_, "only this aggregate type");
  discard_ = db(dead_->add_subcommand(
      "discard",
      "delete every DEAD event of a fingerprint (rows a subscription has not read "
      "are kept)"));
  discard_->add_option("--fingerprint", fingerprint_, "the fingerprint (from `dead groups`)")
      ->required();
  group_limit(discard_);
}

std::optional<int> DeadCommands::run() {
  if (!dead_->parsed()) {
    return std::nullopt;
  }
  auto pool = open_pool(db_.url, 1, false);
  const auto store = detect_store(*pool->acquire(), db_.table);
  DeadEventManager dead(pool, store);
  if (list_->parsed()) {
    const auto rows = dead.query(optional_view(type_), optional_view(aggregate_), limit_, false);
    std::fputs(json_ ? (relay::dead_to_json(rows) + "\n").c_str()
                     : for_terminal(relay::dead_to_text(rows)).c_str(),
               stdout);
    return 0;
  }
  if (groups_->parsed()) {
    const auto view =
        relay::read_dead_groups(dead, *store, *pool, group_limit_, static_cast<std::size_t>(top_));
    std::fputs(json_ ? (relay::dead_groups_to_json(view) + "\n").c_str()
                     : for_terminal(relay::dead_groups_to_text(view)).c_str(),
               stdout);
    return 0;
  }
  if (discard_->parsed()) {
    BulkProgress progress("discard " + fingerprint_);
    const auto r = dead.discard_group(fingerprint_, group_limit_, progress.callback());
    progress.finish(r.changed + r.skipped, r.stopped);
    return report("discarded", r, fingerprint_);
  }
  if (replay_->parsed()) {
    if (fingerprint_.empty() == ids_.empty()) {
      throw std::invalid_argument("give event ids or --fingerprint (one of them)");
    }
    if (!fingerprint_.empty()) {
      BulkProgress progress("replay " + fingerprint_);
      const auto r = dead.replay_group(fingerprint_, group_limit_, progress.callback());
      progress.finish(r.changed + r.skipped, r.stopped);
      return report("replayed", r, fingerprint_);
    }
    int missing = 0;
    for (const auto& id : ids_) {
      if (!dead.replay(id)) {
        std::fprintf(stderr, "outbox: no DEAD event %s\n", id.c_str());
        ++missing;
      }
    }
    std::printf("replayed %zu\n", ids_.size() - static_cast<std::size_t>(missing));
    return missing == 0 ? 0 : kFailure;
  }
  BulkProgress progress("replay-all");
  const auto r = dead.replay_all(optional_view(type_), optional_view(aggregate_),
                                 DeadEventManager::kReplayAllLimit, progress.callback());
  progress.finish(r.replayed + r.skipped, r.stopped);
  std::printf("replayed %d\n", r.replayed);
  if (r.stopped) {
    return kInterruptedExit;
  }
  if (r.skipped > 0) {
    std::printf("skipped %d (no longer DEAD)\n", r.skipped);
  }
  if (r.more) {
    std::printf("more DEAD events remain (at most %d per run): run again\n",
                DeadEventManager::kReplayAllLimit);
  }
  return 0;
}

}  // namespace outbox::cli
