#pragma once
// Child processes of the chaos harness: started with their output in a log file, killed, paused,
// resumed, restarted.

#include <sys/types.h>

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace outbox::chaos {

/// One child process, restartable with the same command. The destructor kills it (SIGKILL).
class Child {
 public:
  /// `argv[0]` is the executable; output (stdout and stderr) is appended to `log`.
  Child(std::string name, std::vector<std::string> argv, std::string log);
  ~Child();
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  const std::string& name() const { return name_; }
  /// Starts it (again), with SIGTERM, SIGINT and SIGHUP blocked (the program takes them when it
  /// is ready). Throws std::runtime_error when fork fails.
  void start();
  bool running() const { return pid_ > 0; }
  /// Signals go to its process group (what it started, too). SIGKILL and reap. No-op when not
  /// running.
  void kill_hard();
  /// SIGSTOP / SIGCONT.
  void pause();
  void resume();
  bool paused() const { return paused_; }
  /// SIGTERM (after SIGCONT), then waits up to `timeout`; SIGKILL past it. Returns true when it
  /// exited on its own with status 0.
  bool stop(std::chrono::milliseconds timeout);
  /// How it ended by itself ("exit 1", "signal 11"), once reaped; nullopt while it runs (or
  /// when it is not running at all).
  std::optional<std::string> ended();

 private:
  std::string name_;
  std::vector<std::string> argv_;
  std::string log_;
  pid_t pid_ = -1;
  bool paused_ = false;
};

/// Runs `command` with /bin/sh, output appended to `log`; returns its exit status (-1: killed).
int run_shell(const std::string& command, const std::string& log);

}  // namespace outbox::chaos
