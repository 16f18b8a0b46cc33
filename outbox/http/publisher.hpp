#pragma once
// HTTP publisher (libcurl): one POST per event (webhook) or a JSON array per batch (batch API).

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "outbox/publisher.hpp"

namespace outbox::http {

/// Posts events to the request's target URL. Thread-safe; connections are kept alive and reused.
///
/// Webhook mode: the body is the payload (application/json, or application/octet-stream for
/// binary payloads); the event's metadata travels in X-Outbox-* headers (Event-Id, Event-Type,
/// Aggregate-Type, Aggregate-Id, Tenant-Id, Occurred-At) and the envelope's headers as is. An
/// envelope header that is not a valid HTTP header, or whose name (any case) the request already
/// owns (Host, Content-*, Transfer-Encoding, TE, Trailer, Connection, Keep-Alive, Upgrade,
/// Expect, HTTP2-Settings, Proxy-*, Authorization, X-Outbox-*, signature_header, a name in
/// `headers`), fails the event as Permanent without sending anything.
/// Batch mode: the body is a JSON array of objects {event_id, event_type, aggregate_type,
/// aggregate_id, tenant_id, occurred_at, headers, payload | payload_base64}, at most max_batch per
/// request; every event of a request shares its outcome. Envelope headers are JSON members there,
/// not HTTP headers, so none is refused for its name.
/// Outcome: 2xx Ok; 408, 429, 5xx (and past 599), timeouts and connection errors Retriable (with
/// retry_after from a Retry-After header, seconds or HTTP date, at most one hour); any other status
/// Permanent, with "HTTP <status>: <start of the response body>" as the reason (at most 200 bytes
/// of the body, made valid UTF-8 without control characters).
class HttpPublisher final : public Publisher {
 public:
  enum class Mode { Webhook, Batch };
  struct Options {
    Mode mode = Mode::Webhook;
    std::size_t max_batch = 100;                       ///< batch mode: events per request; >= 1
    std::string bearer_token;                          ///< sent as Authorization when not empty
    std::chrono::milliseconds connect_timeout{2000};   ///< > 0
    std::chrono::milliseconds request_timeout{10000};  ///< whole request; > 0
    /// When not empty, signature_header carries "sha256=" + hex HMAC-SHA256(body, hmac_secret).
    std::string hmac_secret;
    /// Not a name the request already carries (listed above) nor an X-Outbox-* metadata name.
    std::string signature_header = "X-Outbox-Signature";
    /// Extra headers on every request. The names refused for envelope headers are refused here
    /// too, except Authorization when bearer_token is empty.
    std::map<std::string, std::string> headers;
  };

  /// Throws std::invalid_argument naming a bad field.
  explicit HttpPublisher(Options options);
  ~HttpPublisher() override;
  HttpPublisher(const HttpPublisher&) = delete;
  HttpPublisher& operator=(const HttpPublisher&) = delete;

  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override;
  /// Aborts transfers in progress (within about a second) and refuses new ones.
  void cancel() noexcept override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Hex HMAC-SHA256 of `body` under `secret` (what the signature header carries after "sha256=").
std::string hmac_sha256_hex(std::string_view secret, std::string_view body);

}  // namespace outbox::http
