#pragma once
// What a loopback httplib server needs to take many clients the way a production webhook
// receiver does (Debian's libcpp-httplib compiles in small limits).

#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <stdexcept>
#include <string>

namespace outbox::testing {

/// Requests a connection serves before the server closes it: httplib's default (5) makes clients
/// reconnect so often that their SYNs overflow its listen queue, and each dropped SYN stalls a
/// request for 1 s (the retransmit). nginx keeps a connection for 1,000 requests.
inline constexpr std::size_t kRequestsPerConnection = 100000;

/// Sets how many requests a connection of `server` serves and widens its listen queue; `server`
/// is bound to `port` and not yet accepting. Call before listen_after_bind(). Throws
/// std::runtime_error when no listening socket of this process is bound to `port`.
inline void accept_like_a_receiver(httplib::Server& server, int port,
                                   std::size_t requests_per_connection = kRequestsPerConnection) {
  server.set_keep_alive_max_count(requests_per_connection);
  // Linux lets listen() be called again on a listening socket to widen its queue: 16 relay
  // workers connecting at once would overflow 5 too.
  for (int fd = 0; fd < 1024; ++fd) {
    int listening = 0;
    socklen_t len = sizeof listening;
    sockaddr_in addr{};
    socklen_t addr_len = sizeof addr;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) == 0 && listening != 0 &&
        getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &addr_len) == 0 &&
        addr.sin_family == AF_INET && ntohs(addr.sin_port) == port) {
      if (::listen(fd, 1024) != 0) {
        throw std::runtime_error("accept_like_a_receiver: listen() failed");
      }
      return;
    }
  }
  throw std::runtime_error("accept_like_a_receiver: no listening socket on port " +
                           std::to_string(port));
}

}  // namespace outbox::testing
