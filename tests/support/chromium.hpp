#pragma once
// Headless Chromium (Debian's package) driven through the DevTools protocol on a pipe
// (--remote-debugging-pipe: JSON messages ending in NUL on fds 3 and 4), for tests that look at a
// page as a person's browser renders it: evaluate scripts in it, click, take screenshots.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "tests/support/test_support.hpp"

namespace outbox::testing {

class HeadlessChromium {
 public:
  /// Starts the browser with a profile of its own under `dir`. Throws std::runtime_error when it
  /// cannot start (scripts/install-deps installs the package chromium).
  explicit HeadlessChromium(const TempDir& dir, int width = 1280, int height = 1400) {
    signal(SIGPIPE, SIG_IGN);  // a browser that died is an exception here, not the test's end
    int to[2], from[2];
    if (pipe(to) != 0 || pipe(from) != 0) {
      throw std::runtime_error("pipe failed");
    }
    const std::string profile = dir.file("chromium-profile");
    const std::string size =
        "--window-size=" + std::to_string(width) + "," + std::to_string(height);
    pid_ = fork();
    if (pid_ < 0) {
      throw std::runtime_error("fork failed");
    }
    if (pid_ == 0) {
      // The protocol's fds: 3 reads commands, 4 writes answers.
      const int in = dup(to[0]), out = dup(from[1]);
      dup2(in, 3);
      dup2(out, 4);
      const int null = ::open("/dev/null", O_WRONLY);
      dup2(null, STDOUT_FILENO);
      dup2(null, STDERR_FILENO);
      for (int fd = 5; fd < 1024; ++fd) {
        close(fd);
      }
      execlp("chromium", "chromium", "--headless", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--hide-scrollbars", "--remote-debugging-pipe",
             ("--user-data-dir=" + profile).c_str(), size.c_str(), "about:blank",
             static_cast<char*>(nullptr));
      _exit(127);
    }
    close(to[0]);
    close(from[1]);
    to_ = to[1];
    from_ = from[0];
    call("Target.setDiscoverTargets", {{"discover", false}});
  }
  ~HeadlessChromium() {
    if (to_ >= 0) {
      close(to_);
    }
    if (from_ >= 0) {
      close(from_);
    }
    kill(pid_, SIGKILL);
    int status = 0;
    waitpid(pid_, &status, 0);
  }
  HeadlessChromium(const HeadlessChromium&) = delete;
  HeadlessChromium& operator=(const HeadlessChromium&) = delete;

  /// Opens `url` in a new tab, which later calls act on.
  void open(const std::string& url) {
    const auto target = call("Target.createTarget", {{"url", url}});
    const auto attached =
        call("Target.attachToTarget", {{"targetId", target.at("targetId")}, {"flatten", true}});
    session_ = attached.at("sessionId");
  }
  /// The value of `expression` in the page (promises awaited). Throws on a script error.
  nlohmann::json evaluate(const std::string& expression) {
    const auto r = call(
        "Runtime.evaluate",
        {{"expression", expression}, {"returnByValue", true}, {"awaitPromise", true}}, session_);
    if (r.contains("exceptionDetails")) {
      throw std::runtime_error("script failed: " + r.at("exceptionDetails").dump());
    }
    return r.at("result").value("value", nlohmann::json());
  }
  /// Bounded polling until `expression` is true in the page (an error, such as an element not
  /// there yet while the page loads, counts as false).
  bool wait_for(const std::string& expression) {
    return wait_until([&] {
      return evaluate("(() => { try { return Boolean(" + expression +
                      "); } catch (e) { return false; } })()") == true;
    });
  }
  /// A PNG of the page as rendered, written to `path`.
  void screenshot(const std::string& path) {
    const auto r = call("Page.captureScreenshot", {{"format", "png"}}, session_);
    std::ofstream(path, std::ios::binary) << decode_base64(r.at("data").get<std::string>());
  }

 private:
  nlohmann::json call(const std::string& method, nlohmann::json params,
                      const std::string& session = "") {
    nlohmann::json message{{"id", ++id_}, {"method", method}, {"params", std::move(params)}};
    if (!session.empty()) {
      message["sessionId"] = session;
    }
    const std::string text = message.dump() + std::string(1, '\0');
    for (std::size_t sent = 0; sent < text.size();) {
      const auto n = write(to_, text.data() + sent, text.size() - sent);
      if (n <= 0) {
        throw std::runtime_error("chromium: the protocol pipe closed (is chromium installed?)");
      }
      sent += static_cast<std::size_t>(n);
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (;;) {
      for (auto end = buffer_.find('\0'); end != std::string::npos; end = buffer_.find('\0')) {
        auto answer = nlohmann::json::parse(buffer_.substr(0, end));
        buffer_.erase(0, end + 1);
        if (answer.value("id", 0) != id_) {
          continue;  // an event, or another call's late answer
        }
        if (answer.contains("error")) {
          throw std::runtime_error("chromium: " + method + ": " + answer.at("error").dump());
        }
        return answer.value("result", nlohmann::json::object());
      }
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      pollfd p{from_, POLLIN, 0};
      if (left.count() <= 0 || poll(&p, 1, static_cast<int>(left.count())) <= 0) {
        throw std::runtime_error("chromium: no answer to " + method);
      }
      char chunk[65536];
      const auto n = read(from_, chunk, sizeof chunk);
      if (n <= 0) {
        throw std::runtime_error("chromium: the protocol pipe closed (is chromium installed?)");
      }
      buffer_.append(chunk, static_cast<std::size_t>(n));
    }
  }

  static std::string decode_base64(const std::string& in) {
    std::string out;
    int value = 0, bits = -8;
    for (const unsigned char c : in) {
      int d;
      if (c >= 'A' && c <= 'Z') {
        d = c - 'A';
      } else if (c >= 'a' && c <= 'z') {
        d = c - 'a' + 26;
      } else if (c >= '0' && c <= '9') {
        d = c - '0' + 52;
      } else if (c == '+') {
        d = 62;
      } else if (c == '/') {
        d = 63;
      } else {
        continue;
      }
      value = (value << 6) | d;
      bits += 6;
      if (bits >= 0) {
        out.push_back(static_cast<char>((value >> bits) & 0xFF));
        bits -= 8;
      }
    }
    return out;
  }

  pid_t pid_ = -1;
  int to_ = -1, from_ = -1;
  int id_ = 0;
  std::string buffer_;
  std::string session_;
};

}  // namespace outbox::testing
