#include "group_commands.hpp"

#include "terminal_text.hpp"

#include <cstdio>

#include "outbox/detect/detect.hpp"
#include "outbox/relay/group_ops.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::cli {
namespace {

constexpr int kFailure = 1;

std::string age(Timestamp from, Timestamp now) {
  const auto s = std::chrono::duration_cast<std::chrono::seconds>(now - from).count();
  return std::to_string(std::max<std::int64_t>(0, s)) + "s";
}

}  // namespace

GroupCommands::GroupCommands(CLI::App& app) {
  auto db = [this](CLI::App* cmd) {
    add_db_options(*cmd, db_);
    return cmd;
  };
  groups_ = app.add_subcommand(
      "groups", "message groups: list blocked and failing groups, retry, skip or dead-letter one");
  groups_->require_subcommand(1);
  list_ = db(groups_->add_subcommand(
      "list", "blocked groups, then groups whose head has failed, oldest first"));
  list_->add_flag("--json", json_, "print JSON");
  list_->add_option("--limit", limit_, "at most this many groups")
      ->check(CLI::Range(1, 10000))
      ->capture_default_str();
  show_ = db(groups_->add_subcommand("show", "one group: its head, attempts, error, pending"));
  show_->add_option("key", key_, "the message group key")->required();
  show_->add_flag("--json", json_, "print JSON");
  retry_ = db(groups_->add_subcommand(
      "retry", "unblock a group: its head is due now with its attempts reset"));
  skip_head_ = db(groups_->add_subcommand(
      "skip-head", "the group's head goes DEAD and the next event proceeds"));
  dead_letter_ = db(groups_->add_subcommand(
      "dead-letter", "every pending event of the group goes DEAD (a replay keeps its order)"));
  for (auto* cmd : {retry_, skip_head_, dead_letter_}) {
    cmd->add_option("key", key_, "the message group key")->required();
  }
}

std::optional<int> GroupCommands::run() {
  if (!groups_->parsed()) {
    return std::nullopt;
  }
  auto pool = open_pool(db_.url, 1, false);
  auto conn = pool->acquire();
  const auto store = detect_group_store(*conn, db_.table);
  const auto now = Clock::system()->now();
  if (list_->parsed()) {
    const auto groups = store->list(*conn, limit_);
    if (json_) {
      std::puts(relay::groups_to_json(groups, store->stats(*conn), now).c_str());
      return 0;
    }
    if (groups.empty()) {
      std::puts("no blocked or failing message groups");
    }
    for (const auto& g : groups) {
      const std::string line =
          g.message_group + "  " + (g.blocked ? "BLOCKED " + age(*g.blocked_at, now) : "RETRYING") +
          "  head " + g.head_event_id + " (" + g.head_event_type + ") attempts " +
          std::to_string(g.attempts) + ", " + std::to_string(g.pending) + " pending" +
          (g.last_error ? ": " + g.last_error->substr(0, 200) : "");
      std::puts(for_terminal(line).c_str());
    }
    return 0;
  }
  if (show_->parsed()) {
    const auto g = store->find(*conn, key_);
    if (!g) {
      std::fprintf(stderr, "outbox: no pending event in message group %s\n", key_.c_str());
      return kFailure;
    }
    std::puts(relay::group_to_json(*g, now).c_str());
    return 0;
  }
  const auto action = retry_->parsed()       ? relay::GroupAction::Retry
                      : skip_head_->parsed() ? relay::GroupAction::SkipHead
                                             : relay::GroupAction::DeadLetter;
  const auto done = relay::apply_group_action(*store, *conn, key_, action);
  if (!done) {
    std::fprintf(stderr, "outbox: no pending event in message group %s\n", key_.c_str());
    return kFailure;
  }
  std::printf("message group %s: %s\n", key_.c_str(), done->c_str());
  return 0;
}

}  // namespace outbox::cli
