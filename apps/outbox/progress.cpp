#include "progress.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>

namespace outbox::cli {
namespace {

std::atomic<bool> interrupt_requested{false};

extern "C" void on_interrupt(int) {
  interrupt_requested = true;
}

// A terminal redraws often; a log gets a line now and then.
constexpr auto kTerminalPeriod = std::chrono::milliseconds(100);
constexpr auto kLogPeriod = std::chrono::seconds(5);
constexpr int kBarWidth = 30;

std::string thousands(std::int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (std::size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) {
      out += ',';
    }
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

struct sigaction previous_int, previous_term;

}  // namespace

InterruptGuard::InterruptGuard() {
  interrupt_requested = false;
  struct sigaction sa {};
  sa.sa_handler = on_interrupt;
  sigaction(SIGINT, &sa, &previous_int);
  sigaction(SIGTERM, &sa, &previous_term);
}

InterruptGuard::~InterruptGuard() {
  sigaction(SIGINT, &previous_int, nullptr);
  sigaction(SIGTERM, &previous_term, nullptr);
}

bool InterruptGuard::requested() {
  return interrupt_requested;
}

void InterruptGuard::check() {
  if (interrupt_requested) {
    throw Interrupted{};
  }
}

Progress::Progress(std::string what, std::optional<std::int64_t> total, std::FILE* out, bool counts)
    : what_(std::move(what)),
      total_(total),
      out_(out),
      tty_(isatty(fileno(out)) == 1),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_),
      counts_(counts) {}

void Progress::update(std::int64_t done, const std::string& step) {
  done_ = done;
  step_ = step;
  const auto now = std::chrono::steady_clock::now();
  if (now - last_draw_ >=
      (tty_ ? std::chrono::duration_cast<std::chrono::milliseconds>(kTerminalPeriod)
            : std::chrono::duration_cast<std::chrono::milliseconds>(kLogPeriod))) {
    last_draw_ = now;
    draw(false);
  }
}

void Progress::finish(const std::string& note) {
  draw(true);
  if (!note.empty()) {
    std::fprintf(out_, "%s: %s\n", what_.c_str(), note.c_str());
  }
  std::fflush(out_);
}

void Progress::draw(bool final) {
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  std::string line = what_;
  if (counts_) {
    line += "  " + thousands(done_);
  }
  if (counts_ && total_) {
    line += " / " + thousands(*total_);
  }
  if (total_ && *total_ > 0) {
    const double share = std::min(1.0, static_cast<double>(done_) / static_cast<double>(*total_));
    if (tty_) {
      const int filled = static_cast<int>(share * kBarWidth);
      line += "  [" + std::string(static_cast<std::size_t>(filled), '#') +
              std::string(static_cast<std::size_t>(kBarWidth - filled), '.') + "]";
    }
    line += "  " + std::to_string(static_cast<int>(share * 100)) + "%";
  }
  char rate[64];
  if (counts_ && seconds >= 1) {  // a rate over less than a second says little
    std::snprintf(rate, sizeof rate, "  %.0f/s  %.1f s", done_ / seconds, seconds);
  } else {
    std::snprintf(rate, sizeof rate, "  %.1f s", seconds);
  }
  line += rate;
  if (!step_.empty() && !final) {
    line += "  " + step_;
  }
  if (tty_) {
    // Redrawn in place; the final one stays.
    std::fprintf(out_, "\r\x1b[2K%s%s", line.c_str(), final ? "\n" : "");
  } else if (final || drawn_ || done_ > 0 || !step_.empty()) {
    std::fprintf(out_, "%s\n", line.c_str());
  }
  drawn_ = true;
  std::fflush(out_);
}

}  // namespace outbox::cli
