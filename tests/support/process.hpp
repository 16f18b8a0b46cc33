#pragma once
// Child processes for the multi-process tests: spawn, wait with a deadline, kill.

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace outbox::testing {

/// Starts `argv[0]` with `argv`; returns the pid. Throws std::runtime_error if fork fails.
inline pid_t spawn(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& a : argv) {
    args.push_back(const_cast<char*>(a.c_str()));
  }
  args.push_back(nullptr);
  const pid_t pid = fork();
  if (pid < 0) {
    throw std::runtime_error("fork failed");
  }
  if (pid == 0) {
    execv(args[0], args.data());
    _exit(127);
  }
  return pid;
}

/// Waits for `pid` to exit; returns its exit code, or nullopt if it is still running at the
/// deadline (it is then killed) or died from a signal.
inline std::optional<int> wait_exit(pid_t pid, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    const pid_t r = waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      if (WIFEXITED(status)) {
        return WEXITSTATUS(status);
      }
      return std::nullopt;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return std::nullopt;
    }
    // The poll interval of a bounded wait for another process.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

/// Kills `pid` with SIGKILL and reaps it.
inline void kill_hard(pid_t pid) {
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
}

}  // namespace outbox::testing
