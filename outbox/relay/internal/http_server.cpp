#include "outbox/relay/internal/http_server.hpp"

#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "outbox/internal/ascii.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/store.hpp"

namespace outbox::relay::internal {
namespace {

using Clock = std::chrono::steady_clock;

using ::outbox::internal::iequals;
using ::outbox::internal::trim_blanks;

const char* reason_phrase(int status) {
  switch (status) {
    case 200:
      return "OK";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 413:
      return "Content Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Status";
  }
}

HttpResponse error_response(int status, const std::string& message) {
  HttpResponse r;
  r.status = status;
  r.content_type = "application/json";
  r.body = "{\"error\":";
  append_json_string(r.body, sanitize_utf8(message));
  r.body += "}";
  return r;
}

std::string serialize(const HttpResponse& r) {
  std::string out = "HTTP/1.1 " + std::to_string(r.status) + " " + reason_phrase(r.status) +
                    "\r\nContent-Type: " + r.content_type +
                    "\r\nContent-Length: " + std::to_string(r.body.size()) +
                    "\r\nConnection: close\r\n";
  for (const auto& [name, value] : r.headers) {
    out += name + ": " + value + "\r\n";
  }
  out += "\r\n";
  out += r.body;
  return out;
}

struct Connection {
  enum class State { Head, Body, Handling, Writing };
  int fd = -1;
  State state = State::Head;
  std::string in;
  HttpRequest request;
  std::size_t body_start = 0, content_length = 0;
  std::string out;
  std::size_t written = 0;
  Clock::time_point deadline;
};

}  // namespace

std::optional<HttpResponse> parse_request_head(std::string_view head, const HttpLimits& limits,
                                               HttpRequest& request, std::size_t& content_length) {
  const auto line_end = head.find("\r\n");
  const std::string_view line = head.substr(0, line_end);
  const auto sp1 = line.find(' ');
  const auto sp2 = line.rfind(' ');
  if (sp1 == std::string_view::npos || sp2 == sp1 ||
      line.substr(sp2 + 1).rfind("HTTP/1.", 0) != 0) {
    return error_response(400, "malformed request line");
  }
  request.method = std::string(line.substr(0, sp1));
  const std::string_view target = line.substr(sp1 + 1, sp2 - sp1 - 1);
  if (target.empty() || target.front() != '/') {
    return error_response(400, "the request target must be a path");
  }
  const auto question = target.find('?');
  request.path = std::string(target.substr(0, question));
  if (question != std::string_view::npos) {
    request.query = std::string(target.substr(question + 1));
  }
  std::optional<std::size_t> length;
  std::size_t pos = line_end == std::string_view::npos ? head.size() : line_end + 2;
  while (pos < head.size()) {
    auto end = head.find("\r\n", pos);
    if (end == std::string_view::npos) {
      end = head.size();
    }
    const std::string_view header = head.substr(pos, end - pos);
    pos = end + 2;
    if (request.headers.size() >= limits.max_headers) {
      return error_response(431, "more than " + std::to_string(limits.max_headers) + " headers");
    }
    const auto colon = header.find(':');
    if (colon == 0 || colon == std::string_view::npos || header.front() == ' ' ||
        header.front() == '\t') {
      return error_response(400, "malformed header line");
    }
    std::string name(trim_blanks(header.substr(0, colon)));
    std::string value(trim_blanks(header.substr(colon + 1)));
    if (iequals(name, "Transfer-Encoding")) {
      return error_response(501, "chunked or encoded bodies are not accepted; send Content-Length");
    }
    if (iequals(name, "Content-Length")) {
      if (value.empty() || value.size() > 18 ||
          value.find_first_not_of("0123456789") != std::string::npos) {
        return error_response(400, "bad Content-Length");
      }
      const std::size_t n = std::stoull(value);
      if (length && *length != n) {
        return error_response(400, "conflicting Content-Length headers");
      }
      length = n;
    }
    request.headers.emplace_back(std::move(name), std::move(value));
  }
  content_length = length.value_or(0);
  return std::nullopt;
}

namespace {

int listen_socket(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (getaddrinfo(host.empty() ? nullptr : host.c_str(), service.c_str(), &hints, &found) != 0) {
    return -1;
  }
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) {
      continue;
    }
    const int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0 || listen(fd, 128) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  return fd;
}

int bound_port(int fd) {
  sockaddr_storage address{};
  socklen_t size = sizeof address;
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&address), &size) != 0) {
    return -1;
  }
  if (address.ss_family == AF_INET6) {
    return ntohs(reinterpret_cast<sockaddr_in6*>(&address)->sin6_port);
  }
  return ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port);
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (iequals(n, name)) {
      return v;
    }
  }
  return {};
}

std::optional<std::string> percent_decode(std::string_view text, bool form) {
  std::string out;
  out.reserve(text.size());
  auto hex = [](char c) -> int {
    if (c >= '0' && c <= '9')
      return c - '0';
    if (c >= 'a' && c <= 'f')
      return c - 'a' + 10;
    if (c >= 'A' && c <= 'F')
      return c - 'A' + 10;
    return -1;
  };
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%') {
      if (i + 2 >= text.size()) {
        return std::nullopt;
      }
      const int hi = hex(text[i + 1]), lo = hex(text[i + 2]);
      if (hi < 0 || lo < 0) {
        return std::nullopt;
      }
      out.push_back(static_cast<char>(hi * 16 + lo));
      i += 2;
    } else if (form && text[i] == '+') {
      out.push_back(' ');
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

struct HttpServer::Impl {
  HttpLimits limits;
  Screen screen;
  Handler handler;
  int listener = -1;
  int wake = -1;  // eventfd: stop, or a worker finished a response
  int port = 0;
  std::thread loop_thread;
  std::vector<std::thread> workers;
  bool started = false;

  std::mutex mutex;  // guards the fields below
  std::condition_variable work_ready;
  bool stopping = false;
  std::deque<std::pair<std::uint64_t, HttpRequest>> queue;      // waiting for a worker
  std::vector<std::pair<std::uint64_t, HttpResponse>> answers;  // back from workers

  // Owned by the loop thread.
  std::map<std::uint64_t, Connection> connections;
  std::uint64_t next_id = 1;
  std::size_t buffered_output = 0;  // bytes of responses not yet sent

  void notify() const {
    const std::uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(wake, &one, sizeof one);
  }

  void respond(Connection& c, const HttpResponse& response) {
    c.out = serialize(response);
    if (buffered_output + c.out.size() > limits.max_buffered_output) {
      c.out = serialize(error_response(503, "too many responses waiting for slow clients"));
    }
    buffered_output += c.out.size();
    c.written = 0;
    c.state = Connection::State::Writing;
    c.deadline = Clock::now() + limits.write_deadline;
    shutdown(c.fd, SHUT_RD);  // whatever else the client sends is not read
  }

  void accept_all() {
    for (;;) {
      const int fd = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        return;  // EAGAIN, or an error that the next poll reports again
      }
      if (connections.size() >= limits.max_connections && !evict_oldest_unfinished_request()) {
        close(fd);
        continue;
      }
      Connection c;
      c.fd = fd;
      c.deadline = Clock::now() + limits.request_deadline;
      connections.emplace(next_id++, std::move(c));
    }
  }

  // Reads what is there; false when the connection is finished with (closed by the peer).
  bool read_some(std::uint64_t id, Connection& c) {
    char buffer[8192];
    for (;;) {
      const ssize_t n = recv(c.fd, buffer, sizeof buffer, 0);
      if (n == 0) {
        return false;
      }
      if (n < 0) {
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      }
      c.in.append(buffer, static_cast<std::size_t>(n));
      if (c.state == Connection::State::Head) {
        const auto end = c.in.find("\r\n\r\n");
        if (end == std::string::npos) {
          if (c.in.size() > limits.max_head_bytes) {
            respond(c, error_response(431, "the request head is over " +
                                               std::to_string(limits.max_head_bytes) + " bytes"));
            return true;
          }
          continue;
        }
        if (end > limits.max_head_bytes) {
          respond(c, error_response(431, "the request head is over " +
                                             std::to_string(limits.max_head_bytes) + " bytes"));
          return true;
        }
        if (auto refusal = parse_request_head(std::string_view(c.in.data(), end), limits, c.request,
                                              c.content_length)) {
          respond(c, *refusal);
          return true;
        }
        // Screened before any body is read: an unauthorised client cannot make us buffer one.
        if (auto now = screen(c.request)) {
          respond(c, *now);
          return true;
        }
        if (c.content_length > limits.max_body_bytes) {
          respond(c, error_response(413, "the body is over " +
                                             std::to_string(limits.max_body_bytes) + " bytes"));
          return true;
        }
        c.body_start = end + 4;
        c.state = Connection::State::Body;
      }
      if (c.state == Connection::State::Body) {
        if (c.in.size() - c.body_start > c.content_length) {
          respond(c, error_response(400, "more bytes than Content-Length"));
          return true;
        }
        if (c.in.size() - c.body_start == c.content_length) {
          c.request.body = c.in.substr(c.body_start);
          c.in.clear();
          dispatch(id, c);
          return true;
        }
      }
    }
  }

  void dispatch(std::uint64_t id, Connection& c) {
    std::lock_guard lock(mutex);
    if (queue.size() >= limits.max_queued) {
      respond(c, error_response(503, "too many requests in progress"));
      return;
    }
    c.state = Connection::State::Handling;
    queue.emplace_back(id, std::move(c.request));
    work_ready.notify_one();
  }

  // Writes what it can; false when the connection is done (all sent, or failed).
  static bool write_some(Connection& c) {
    while (c.written < c.out.size()) {
      const ssize_t n =
          send(c.fd, c.out.data() + c.written, c.out.size() - c.written, MSG_NOSIGNAL);
      if (n < 0) {
        return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR;
      }
      c.written += static_cast<std::size_t>(n);
    }
    return false;
  }

  void take_answers() {
    std::vector<std::pair<std::uint64_t, HttpResponse>> ready;
    {
      std::lock_guard lock(mutex);
      ready.swap(answers);
    }
    for (auto& [id, response] : ready) {
      auto it = connections.find(id);
      if (it != connections.end()) {
        respond(it->second, response);
      }
    }
  }

  void close_connection(std::map<std::uint64_t, Connection>::iterator it) {
    close(it->second.fd);
    buffered_output -= it->second.out.size();
    connections.erase(it);
  }

  // Closes the oldest connection still sending its request (head or body); false when there is
  // none.
  bool evict_oldest_unfinished_request() {
    auto oldest = connections.end();
    for (auto it = connections.begin(); it != connections.end(); ++it) {
      const auto state = it->second.state;
      if ((state == Connection::State::Head || state == Connection::State::Body) &&
          (oldest == connections.end() || it->second.deadline < oldest->second.deadline)) {
        oldest = it;
      }
    }
    if (oldest == connections.end()) {
      return false;
    }
    close_connection(oldest);
    return true;
  }

  void loop() {
    std::vector<pollfd> fds;
    std::vector<std::uint64_t> ids;
    for (;;) {
      {
        std::lock_guard lock(mutex);
        if (stopping) {
          break;
        }
      }
      fds.clear();
      ids.clear();
      fds.push_back({listener, POLLIN, 0});
      fds.push_back({wake, POLLIN, 0});
      auto next_deadline = Clock::now() + std::chrono::seconds(1);
      for (auto& [id, c] : connections) {
        if (c.state == Connection::State::Handling) {
          continue;  // the handler's time is not the client's
        }
        next_deadline = std::min(next_deadline, c.deadline);
        fds.push_back({c.fd,
                       static_cast<short>(c.state == Connection::State::Writing ? POLLOUT : POLLIN),
                       0});
        ids.push_back(id);
      }
      const auto wait =
          std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - Clock::now());
      poll(fds.data(), fds.size(), static_cast<int>(std::max<std::int64_t>(0, wait.count()) + 1));
      if ((fds[1].revents & POLLIN) != 0) {
        std::uint64_t drained = 0;
        [[maybe_unused]] const auto n = ::read(wake, &drained, sizeof drained);
      }
      take_answers();
      for (std::size_t i = 2; i < fds.size(); ++i) {
        auto it = connections.find(ids[i - 2]);
        if (it == connections.end() || fds[i].revents == 0) {
          continue;
        }
        Connection& c = it->second;
        bool keep = true;
        if (c.state == Connection::State::Writing) {
          keep = write_some(c);
        } else if (c.state != Connection::State::Handling) {
          keep = read_some(it->first, c);
          if (keep && c.state == Connection::State::Writing) {
            keep = write_some(c);
          }
        }
        if (!keep) {
          close_connection(it);
        }
      }
      // Clients past their deadline are dropped (slow senders, idle sockets, slow readers).
      const auto now = Clock::now();
      for (auto it = connections.begin(); it != connections.end();) {
        const auto next = std::next(it);
        if (it->second.state != Connection::State::Handling && now >= it->second.deadline) {
          close_connection(it);
        }
        it = next;
      }
      if ((fds[0].revents & POLLIN) != 0) {
        accept_all();
      }
    }
    for (auto it = connections.begin(); it != connections.end();) {
      const auto next = std::next(it);
      close_connection(it);
      it = next;
    }
  }

  void work() {
    for (;;) {
      std::pair<std::uint64_t, HttpRequest> item;
      {
        std::unique_lock lock(mutex);
        work_ready.wait(lock, [&] { return stopping || !queue.empty(); });
        if (stopping) {
          return;
        }
        item = std::move(queue.front());
        queue.pop_front();
      }
      HttpResponse response;
      try {
        response = handler(item.second);
      } catch (const std::exception& e) {
        response = error_response(500, e.what());
      } catch (...) {
        response = error_response(500, "handler failed");
      }
      {
        std::lock_guard lock(mutex);
        answers.emplace_back(item.first, std::move(response));
      }
      notify();
    }
  }
};

HttpServer::HttpServer(const std::string& host, int port, HttpLimits limits, Screen screen,
                       Handler handler)
    : impl_(std::make_unique<Impl>()) {
  impl_->limits = limits;
  impl_->screen = std::move(screen);
  impl_->handler = std::move(handler);
  impl_->listener = listen_socket(host, port);
  if (impl_->listener < 0) {
    throw std::runtime_error("admin server: cannot listen on " + host + ":" + std::to_string(port) +
                             ": " + std::strerror(errno));
  }
  impl_->port = bound_port(impl_->listener);
  impl_->wake = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (impl_->wake < 0) {
    close(impl_->listener);
    throw std::runtime_error(std::string("admin server: eventfd: ") + std::strerror(errno));
  }
}

HttpServer::~HttpServer() {
  stop();
  close(impl_->wake);
}

void HttpServer::start() {
  if (impl_->started) {
    return;
  }
  impl_->started = true;
  Impl* impl = impl_.get();
  impl_->loop_thread = std::thread([impl] { impl->loop(); });
  for (int i = 0; i < impl_->limits.workers; ++i) {
    impl_->workers.emplace_back([impl] { impl->work(); });
  }
}

void HttpServer::stop() {
  {
    std::lock_guard lock(impl_->mutex);
    impl_->stopping = true;
  }
  impl_->work_ready.notify_all();
  impl_->notify();
  if (impl_->loop_thread.joinable()) {
    impl_->loop_thread.join();
  }
  if (impl_->listener >= 0) {
    close(impl_->listener);  // new connections are refused from now on, not left waiting
    impl_->listener = -1;
  }
  for (auto& w : impl_->workers) {
    w.join();
  }
  impl_->workers.clear();
}

int HttpServer::port() const noexcept {
  return impl_->port;
}

}  // namespace outbox::relay::internal
