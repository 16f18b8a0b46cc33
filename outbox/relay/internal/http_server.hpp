#pragma once
// A small HTTP/1.1 server for the admin endpoints, built to stay up under hostile clients: all
// socket I/O on one poll loop (a slow or idle client costs a buffer, never a thread), bounded
// heads, headers and bodies, a deadline on each whole request, and stop() that never waits for
// a client. Handlers that may block (database reads) run on a small worker pool.

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace outbox::relay::internal {

/// One request. `path` and `query` are raw (not percent-decoded): routing splits first.
struct HttpRequest {
  std::string method, path, query, body;
  std::vector<std::pair<std::string, std::string>> headers;
  /// The first header with this name (case-insensitive), or "".
  std::string header(std::string_view name) const;
};

/// One response; every response closes the connection.
struct HttpResponse {
  int status = 200;
  std::string content_type = "text/plain";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;
};

struct HttpLimits {
  std::size_t max_head_bytes = 16 * 1024;  ///< request line + headers (431 beyond)
  std::size_t max_headers = 64;            ///< header lines (431 beyond)
  std::size_t max_body_bytes = 64 * 1024;  ///< Content-Length (413 beyond, never read)
  /// From accept to the last byte of the request; the client is dropped after it.
  std::chrono::milliseconds request_deadline{10000};
  std::chrono::milliseconds write_deadline{5000};  ///< to send a response
  /// Open at once; beyond it a new client replaces the oldest one still sending its request (a
  /// flood of idle or stalled connections cannot lock out a liveness probe).
  std::size_t max_connections = 256;
  /// Response bytes waiting for slow readers, all clients together; a response that would pass
  /// it is replaced by a 503.
  std::size_t max_buffered_output = 64 * 1024 * 1024;
  int workers = 4;              ///< threads running blocking handlers
  std::size_t max_queued = 64;  ///< requests waiting for a worker (503 beyond)
};

class HttpServer {
 public:
  /// Sees each request once its head is read, before any body: a response ends it at once on
  /// the loop (refusals, cheap answers such as liveness); nullopt sends it to a worker.
  using Screen = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;
  /// Runs on a worker; may block. An exception becomes a 500 with its message.
  using Handler = std::function<HttpResponse(const HttpRequest& request)>;

  /// Binds host:port (0 = any free port). Throws std::runtime_error when it cannot.
  HttpServer(const std::string& host, int port, HttpLimits limits, Screen screen, Handler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void start();
  /// Closes every connection and returns once running handlers finished. Idempotent.
  void stop();
  int port() const noexcept;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Percent-decodes `text` ('+' stays '+'; with `form` true it becomes a space). Nullopt when an
/// escape is malformed.
std::optional<std::string> percent_decode(std::string_view text, bool form = false);

/// Parses a request head (the request line and header lines, without the blank line after them)
/// into `request` (method, raw path and query, headers) and `content_length`: what the server
/// does with each head it reads. A refusal (400, 431, 501) when it is not acceptable.
std::optional<HttpResponse> parse_request_head(std::string_view head, const HttpLimits& limits,
                                               HttpRequest& request, std::size_t& content_length);

}  // namespace outbox::relay::internal
