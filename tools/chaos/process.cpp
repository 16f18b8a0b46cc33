#include "process.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <stdexcept>
#include <thread>

namespace outbox::chaos {

Child::Child(std::string name, std::vector<std::string> argv, std::string log)
    : name_(std::move(name)), argv_(std::move(argv)), log_(std::move(log)) {}

Child::~Child() {
  kill_hard();
}

void Child::start() {
  if (running()) {
    return;
  }
  std::vector<char*> args;
  for (auto& a : argv_) {
    args.push_back(a.data());
  }
  args.push_back(nullptr);
  const pid_t parent = getpid();
  const pid_t pid = fork();
  if (pid < 0) {
    throw std::runtime_error("fork failed for " + name_);
  }
  if (pid == 0) {
    const int fd = open(log_.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) {
      dup2(fd, STDOUT_FILENO);
      dup2(fd, STDERR_FILENO);
      close(fd);
    }
    // Its own process group (signals reach whatever it starts too), away from the terminal's: a
    // Ctrl-C reaches the harness, which stops the round. Killed with the harness, however it dies.
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    // A stop sent while the program is still loading would end it by the signal's default
    // action, before it could answer (seen: a relay restarted 0.1 s before the round's end, on a
    // loaded machine, counted as an unclean stop). Blocked across exec, the signal waits for the
    // program: the relay takes its stop signals with sigwait, the writer unblocks them once its
    // handlers are in.
    sigset_t stops;
    sigemptyset(&stops);
    sigaddset(&stops, SIGTERM);
    sigaddset(&stops, SIGINT);
    sigaddset(&stops, SIGHUP);
    sigprocmask(SIG_BLOCK, &stops, nullptr);
    if (getppid() != parent) {
      _exit(127);
    }
    execv(args[0], args.data());
    _exit(127);
  }
  setpgid(pid, pid);  // as the child does: whichever runs first, signals to the group work
  pid_ = pid;
  paused_ = false;
}

void Child::kill_hard() {
  if (!running()) {
    return;
  }
  ::kill(-pid_, SIGKILL);
  int status = 0;
  waitpid(pid_, &status, 0);
  pid_ = -1;
  paused_ = false;
}

void Child::pause() {
  if (running() && !paused_) {
    ::kill(-pid_, SIGSTOP);
    paused_ = true;
  }
}

void Child::resume() {
  if (running() && paused_) {
    ::kill(-pid_, SIGCONT);
    paused_ = false;
  }
}

bool Child::stop(std::chrono::milliseconds timeout) {
  if (!running()) {
    return false;
  }
  resume();
  ::kill(-pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) == pid_) {
      ::kill(-pid_, SIGKILL);  // anything it started and left behind
      pid_ = -1;
      return WIFEXITED(status) && WEXITSTATUS(status) == 0;
    }
    if (std::chrono::steady_clock::now() > deadline) {
      kill_hard();
      return false;
    }
    // The poll period of a bounded wait for another process.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

std::optional<std::string> Child::ended() {
  if (!running()) {
    return std::nullopt;
  }
  int status = 0;
  if (waitpid(pid_, &status, WNOHANG) != pid_) {
    return std::nullopt;
  }
  ::kill(-pid_, SIGKILL);
  pid_ = -1;
  paused_ = false;
  return WIFSIGNALED(status) ? "signal " + std::to_string(WTERMSIG(status))
                             : "exit " + std::to_string(WEXITSTATUS(status));
}

int run_shell(const std::string& command, const std::string& log) {
  const int rc = std::system(("(" + command + ") >>'" + log + "' 2>&1").c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

}  // namespace outbox::chaos
