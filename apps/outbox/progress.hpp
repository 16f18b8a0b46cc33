#pragma once
// Progress of a long command on stderr: a redrawn bar with counts and rate on a terminal, a plain
// line every few seconds otherwise (logs, pipes); and Ctrl-C that stops between batches.

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <future>
#include <optional>
#include <string>

namespace outbox::cli {

/// The exit status of a command stopped by Ctrl-C (128 + SIGINT, as a shell reports it).
inline constexpr int kInterruptedExit = 130;

/// Thrown between two batches once Ctrl-C (SIGINT) or SIGTERM was received during a command that
/// installed an InterruptGuard; what was done before stays done.
struct Interrupted {};

/// While it lives, SIGINT and SIGTERM only set a flag (the command stops at its next check);
/// the previous handlers come back after it.
class InterruptGuard {
 public:
  InterruptGuard();
  ~InterruptGuard();
  InterruptGuard(const InterruptGuard&) = delete;
  InterruptGuard& operator=(const InterruptGuard&) = delete;
  /// True once a signal came.
  static bool requested();
  /// Throws Interrupted once a signal came.
  static void check();
};

class Progress {
 public:
  /// `what` names the work ("purge"); `total` when known. Draws on `out` (stderr), as a bar when
  /// it is a terminal.
  Progress(std::string what, std::optional<std::int64_t> total, std::FILE* out = stderr,
           bool counts = true);
  /// `done` items so far (or, without counts, the step under way in `step`).
  void update(std::int64_t done, const std::string& step = "");
  /// The last line; `note` after it (e.g. "interrupted").
  void finish(const std::string& note = "");

 private:
  void draw(bool final);
  std::string what_;
  std::optional<std::int64_t> total_;
  std::FILE* out_;
  bool tty_;
  std::int64_t done_ = 0;
  std::string step_;
  std::chrono::steady_clock::time_point start_, last_draw_;
  bool drawn_ = false;
  bool counts_ = true;
};

/// Runs `work` (one statement, one transaction: nothing to stop between) on a thread of its own
/// while the elapsed time is shown as `what`; returns its result, rethrows its exception. Ctrl-C
/// ends the process as usual, and the database rolls the transaction back.
template <typename Work>
auto with_elapsed(const std::string& what, Work&& work) {
  auto job = std::async(std::launch::async, std::forward<Work>(work));
  Progress bar(what, std::nullopt, stderr, false);
  while (job.wait_for(std::chrono::milliseconds(100)) != std::future_status::ready) {
    bar.update(0, "working");
  }
  bar.finish();
  return job.get();
}

}  // namespace outbox::cli
