#pragma once
// A server that never answers: a loopback listener whose connections complete (through the
// backlog) and then hear nothing, as from a database host that hangs.

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <stdexcept>

namespace outbox::testing {

class Tarpit {
 public:
  Tarpit() {
    fd_ = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t size = sizeof a;
    if (fd_ < 0 || bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(fd_, 16) != 0 || getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &size) != 0) {
      throw std::runtime_error("Tarpit: cannot listen on loopback");
    }
    port_ = ntohs(a.sin_port);
  }
  ~Tarpit() {
    if (accepted_ >= 0) {
      close(accepted_);
    }
    close(fd_);
  }
  Tarpit(const Tarpit&) = delete;
  Tarpit& operator=(const Tarpit&) = delete;

  int port() const noexcept { return port_; }
  /// True once a client has connected (non-blocking; the connection is kept open, unanswered).
  bool accepted_one() {
    if (accepted_ < 0) {
      accepted_ = accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK);
    }
    return accepted_ >= 0;
  }

 private:
  int fd_ = -1;
  int accepted_ = -1;
  int port_ = 0;
};

}  // namespace outbox::testing
