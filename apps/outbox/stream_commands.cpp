#include "stream_commands.hpp"

#include "progress.hpp"
#include "terminal_text.hpp"

#include <cstdio>

#include "outbox/detect/detect.hpp"
#include "outbox/relay/subscription_ops.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox::cli {
namespace {

constexpr int kFailure = 1;

}  // namespace

StreamCommands::StreamCommands(CLI::App& app) {
  auto db = [this](CLI::App* cmd) {
    add_db_options(*cmd, db_);
    return cmd;
  };
  subscriptions_ = app.add_subcommand(
      "subscriptions", "stream mode: list, add, pause, resume, reset, rewind subscriptions");
  subscriptions_->require_subcommand(1);
  list_ = db(subscriptions_->add_subcommand("list", "every subscription: status, cursor, lag"));
  list_->add_flag("--json", json_, "print JSON");
  lag_ =
      db(subscriptions_->add_subcommand("lag", "events and seconds each subscription is behind"));
  add_ = db(subscriptions_->add_subcommand("add",
                                           "create a subscription (a relay whose "
                                           "configuration names it runs it)"));
  add_->add_option("name", name_, "subscription name")->required();
  add_->add_option("--publisher", publisher_, "the relay publisher it sends to")->required();
  add_->add_option("--target", target_, "topic or URL template");
  add_->add_option("--event-type", event_types_, "event type glob (repeat for any of several)");
  add_->add_option("--aggregate-type", aggregate_types_, "aggregate type glob (repeatable)");
  add_->add_option("--require-tag", required_tags_, "name or name=value; all must hold");
  add_->add_option("--any-tag", any_of_tags_, "name or name=value; at least one must hold");
  add_->add_option("--start", start_, "beginning or end")
      ->check(CLI::IsMember({"beginning", "end"}))
      ->capture_default_str();
  remove_ = db(subscriptions_->add_subcommand("remove", "delete a subscription and its cursor"));
  remove_->add_option("name", name_, "subscription name")->required();
  for (auto** cmd : {&pause_, &resume_, &reset_}) {
    const char* what = cmd == &pause_ ? "pause" : cmd == &resume_ ? "resume" : "reset";
    const char* help = cmd == &pause_    ? "stop delivering (from ACTIVE or FAILED)"
                       : cmd == &resume_ ? "deliver again (from PAUSED)"
                                         : "clear FAILED and its errors (to ACTIVE)";
    *cmd = db(subscriptions_->add_subcommand(what, help));
    (*cmd)->add_option("name", name_, "subscription name")->required();
  }
  rewind_ = db(subscriptions_->add_subcommand("rewind", "move the cursor back (or forward)"));
  rewind_->add_option("name", name_, "subscription name")->required();
  rewind_->add_option("--to", to_, "start, end, an RFC 3339 time, or a position (seq, xid:seq)")
      ->required();

  stream_ = app.add_subcommand("stream", "stream mode: the stream itself");
  stream_->require_subcommand(1);
  stream_status_ = db(stream_->add_subcommand("status", "head, what holds it back, subscriptions"));
  stream_status_->add_flag("--json", json_, "print JSON");
  rebase_ = db(stream_->add_subcommand(
      "rebase", "PostgreSQL after a restore into another cluster: renumber transaction ids"));
}

std::optional<int> StreamCommands::run() {
  if (!subscriptions_->parsed() && !stream_->parsed()) {
    return std::nullopt;
  }
  auto pool = open_pool(db_.url, 1, false);
  auto conn = pool->acquire();
  const auto stream = detect_stream_store(*conn, db_.table);
  const auto leases = detect_lease_store(*conn, db_.table);
  if (list_->parsed() || stream_status_->parsed()) {
    const auto report = relay::read_stream(*conn, *stream, leases.get());
    std::fputs(json_ ? (relay::to_json(report) + "\n").c_str()
                     : for_terminal(relay::to_text(report)).c_str(),
               stdout);
    return 0;
  }
  if (lag_->parsed()) {
    const auto now = Clock::system()->now();
    for (const auto& r : relay::read_stream(*conn, *stream, nullptr).subscriptions) {
      const double seconds = r.lag.oldest_unread
                                 ? std::chrono::duration<double>(now - *r.lag.oldest_unread).count()
                                 : 0.0;
      std::printf("%s %lld events %.1f s\n", r.state.spec.name.c_str(),
                  static_cast<long long>(r.lag.events), seconds < 0 ? 0.0 : seconds);
    }
    return 0;
  }
  if (add_->parsed()) {
    const SubscriptionSpec spec{
        name_, {event_types_, aggregate_types_, required_tags_, any_of_tags_}, publisher_, target_};
    const StreamPosition start = start_ == "end" ? stream->head(*conn) : StreamPosition{};
    if (!stream->create(*conn, spec, start)) {
      std::fprintf(stderr, "outbox: subscription %s exists already\n", name_.c_str());
      return kFailure;
    }
    std::printf("subscription %s created at %s\n", name_.c_str(), start.to_string().c_str());
    return 0;
  }
  if (remove_->parsed()) {
    if (!stream->remove(*conn, name_)) {
      std::fprintf(stderr, "outbox: no subscription %s\n", name_.c_str());
      return kFailure;
    }
    std::printf("subscription %s removed\n", name_.c_str());
    return 0;
  }
  if (rebase_->parsed()) {
    if (!stream->positions_have_xid()) {
      std::fprintf(stderr, "outbox: stream rebase applies to PostgreSQL streams only\n");
      return 2;
    }
    const auto moved =
        with_elapsed("stream rebase " + db_.table, [&] { return stream->rebase(*conn); });
    std::printf("rebased %lld rows; every subscription resumes at its first unread event\n",
                static_cast<long long>(moved));
    return 0;
  }
  const char* action = pause_->parsed()    ? "pause"
                       : resume_->parsed() ? "resume"
                       : reset_->parsed()  ? "reset"
                                           : "rewind";
  try {
    const auto apply = [&] {
      return relay::apply_subscription_action(
          *conn, *stream, name_, action,
          to_.empty() ? std::nullopt : std::optional<std::string_view>(to_));
    };
    // A rewind to a time looks the position up in the table: shown while it runs.
    const auto after = rewind_->parsed() ? with_elapsed("rewind " + name_, apply) : apply();
    if (!after) {
      std::fprintf(stderr, "outbox: no subscription %s\n", name_.c_str());
      return kFailure;
    }
    std::printf("subscription %s: %s, cursor %s\n", name_.c_str(),
                std::string(to_string(after->status)).c_str(), after->cursor.to_string().c_str());
    return 0;
  } catch (const std::invalid_argument&) {
    throw;
  } catch (const std::logic_error& e) {
    std::fprintf(stderr, "outbox: %s\n", e.what());
    return kFailure;
  }
}

}  // namespace outbox::cli
