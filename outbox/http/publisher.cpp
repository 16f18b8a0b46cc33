#include "outbox/http/publisher.hpp"

#include <curl/curl.h>

#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <atomic>

#include <algorithm>
#include <array>
#include <cctype>
#include <ctime>
#include <mutex>
#include <optional>
#include <stdexcept>

#include "outbox/clock.hpp"
#include "outbox/http/internal/response.hpp"
#include "outbox/internal/ascii.hpp"

namespace outbox::http {
namespace {

constexpr std::size_t kReasonBodyChars = 200;

bool is_token_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

// A header that would break or smuggle into the request is refused, never sent half-way.
bool valid_header(std::string_view name, std::string_view value) {
  if (name.empty()) {
    return false;
  }
  for (char c : name) {
    if (!is_token_char(c)) {
      return false;
    }
  }
  return value.find_first_of("\r\n", 0) == std::string_view::npos &&
         value.find('\0') == std::string_view::npos;
}

using ::outbox::internal::iequals;

bool istarts_with(std::string_view text, std::string_view prefix) {
  return text.size() >= prefix.size() && iequals(text.substr(0, prefix.size()), prefix);
}

// The metadata headers of webhook mode. The prefix is reserved as a whole, so a later addition
// cannot be forged by events written before it.
constexpr std::string_view kHeaderEventId = "X-Outbox-Event-Id";
constexpr std::string_view kHeaderEventType = "X-Outbox-Event-Type";
constexpr std::string_view kHeaderAggregateType = "X-Outbox-Aggregate-Type";
constexpr std::string_view kHeaderAggregateId = "X-Outbox-Aggregate-Id";
constexpr std::string_view kHeaderTenantId = "X-Outbox-Tenant-Id";
constexpr std::string_view kHeaderOccurredAt = "X-Outbox-Occurred-At";
constexpr std::string_view kHeaderMessageGroup = "X-Outbox-Message-Group";
constexpr std::string_view kOwnPrefix = "X-Outbox-";

// Headers that belong to the request itself rather than to the event: libcurl computes the
// framing (Content-Length, Transfer-Encoding; a second value would make the receiver or a proxy
// on the way read the body as a second, smuggled request), the target (Host), the body's
// description (Content-*: the publisher sets Content-Type per payload, and no other Content-*
// can be true of a body it builds) and the connection (hop-by-hop headers, RFC 9110 §7.6.1 and
// RFC 9113 §8.2.2, Proxy-*). Expect is blanked on purpose (no 100-continue round trip).
constexpr std::array<std::string_view, 9> kProtocolNames = {
    "Host",       "Transfer-Encoding", "TE",     "Trailer",       "Connection",
    "Keep-Alive", "Upgrade",           "Expect", "HTTP2-Settings"};
constexpr std::array<std::string_view, 2> kProtocolPrefixes = {"Content-", "Proxy-"};

bool is_protocol_header(std::string_view name) {
  return std::any_of(kProtocolNames.begin(), kProtocolNames.end(),
                     [&](std::string_view p) { return iequals(name, p); }) ||
         std::any_of(kProtocolPrefixes.begin(), kProtocolPrefixes.end(),
                     [&](std::string_view p) { return istarts_with(name, p); });
}

bool is_metadata_header(std::string_view name) {
  for (std::string_view own :
       {kHeaderEventId, kHeaderEventType, kHeaderAggregateType, kHeaderAggregateId, kHeaderTenantId,
        kHeaderOccurredAt, kHeaderMessageGroup}) {
    if (iequals(name, own)) {
      return true;
    }
  }
  return false;
}

std::size_t collect_body(char* data, std::size_t size, std::size_t n, void* user) {
  auto* body = static_cast<internal::BodyStart*>(user);
  const std::size_t room =
      kReasonBodyChars > body->bytes.size() ? kReasonBodyChars - body->bytes.size() : 0;
  body->bytes.append(data, std::min(room, size * n));
  body->truncated = body->truncated || size * n > room;
  return size * n;  // read everything (keeps the connection reusable), keep the start
}

struct CurlGlobal {
  CurlGlobal() { curl_global_init(CURL_GLOBAL_DEFAULT); }
  ~CurlGlobal() { curl_global_cleanup(); }
};

struct SList {
  curl_slist* list = nullptr;
  ~SList() { curl_slist_free_all(list); }
  void add(const std::string& line) { list = curl_slist_append(list, line.c_str()); }
};

// Keeps the final response's Retry-After header (its last one). curl passes the header lines of
// every response of the transfer (a 100 or 103 before the answer): each status line starts afresh.
std::size_t collect_header(char* data, std::size_t size, std::size_t n, void* user) {
  const std::string_view line(data, size * n);
  auto& kept = *static_cast<std::string*>(user);
  if (line.starts_with("HTTP/")) {
    kept.clear();
  } else if (auto value = internal::retry_after_header(line)) {
    kept = std::move(*value);
  }
  return size * n;
}

PublishResult classify_curl(CURLcode code, const char* detail) {
  std::string reason = std::string("http: ") + curl_easy_strerror(code);
  if (detail[0] != '\0') {
    reason += std::string(" (") + detail + ")";
  }
  // Transport errors are retried; only a URL that can never work is permanent (schemes are
  // checked before sending, since curl also reports garbled responses as unsupported protocol).
  return code == CURLE_URL_MALFORMAT ? PublishResult::permanent(std::move(reason))
                                     : PublishResult::retriable(std::move(reason));
}

}  // namespace

std::string hmac_sha256_hex(std::string_view secret, std::string_view body) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  HMAC(EVP_sha256(), secret.data(), static_cast<int>(secret.size()),
       reinterpret_cast<const unsigned char*>(body.data()), body.size(), digest, &length);
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  for (unsigned int i = 0; i < length; ++i) {
    out.push_back(kHex[digest[i] >> 4]);
    out.push_back(kHex[digest[i] & 0xf]);
  }
  return out;
}

struct HttpPublisher::Impl {
  Options options;
  std::mutex idle_mutex;  // guards idle
  std::vector<CURL*> idle;
  std::atomic<bool> cancelled{false};

  // Why an envelope header may not travel under `name` (a valid token), or nullptr. libcurl sends
  // a custom header in place of its own or next to ours, so any name the request already carries
  // would let an event rewrite the request instead of annotating it.
  const char* refusal(std::string_view name) const {
    if (is_protocol_header(name) || iequals(name, "Authorization")) {
      return "Host, Content-*, Transfer-Encoding, TE, Trailer, Connection, Keep-Alive, Upgrade, "
             "Expect, Proxy-* and Authorization belong to the request, not the event";
    }
    if (istarts_with(name, kOwnPrefix)) {
      return "X-Outbox-* names are reserved for the publisher's metadata";
    }
    if (iequals(name, "User-Agent") || iequals(name, "Accept")) {
      return "User-Agent and Accept are set by the publisher (and libcurl) on every request";
    }
    if (iequals(name, options.signature_header)) {
      return "it is the publisher's signature header";
    }
    for (const auto& [configured, value] : options.headers) {
      if (iequals(name, configured)) {
        return "the publisher's configuration sets this header";
      }
    }
    return nullptr;
  }

  ~Impl() {
    for (CURL* h : idle) {
      curl_easy_cleanup(h);
    }
  }

  CURL* take() {
    {
      std::lock_guard lock(idle_mutex);
      if (!idle.empty()) {
        CURL* h = idle.back();
        idle.pop_back();
        curl_easy_reset(h);  // keeps its live connections for reuse
        return h;
      }
    }
    return curl_easy_init();
  }
  void give_back(CURL* h) {
    std::lock_guard lock(idle_mutex);
    idle.push_back(h);
  }

  // libcurl calls this during a transfer (at least once a second): non-zero aborts it.
  static int abort_if_cancelled(void* cancelled, curl_off_t, curl_off_t, curl_off_t, curl_off_t) {
    return static_cast<std::atomic<bool>*>(cancelled)->load() ? 1 : 0;
  }

  PublishResult post(const std::string& url, const std::string& body, const char* content_type,
                     const std::vector<std::pair<std::string, std::string>>& extra) {
    if (cancelled) {
      return Publisher::cancelled("http");
    }
    std::string scheme = url.substr(0, url.find("://") + 3);
    std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (scheme != "http://" && scheme != "https://") {
      return PublishResult::permanent("http: target '" + url +
                                      "' does not start with http:// or https://");
    }
    CURL* h = take();
    if (h == nullptr) {
      return PublishResult::retriable("http: curl_easy_init failed");
    }
    SList headers;
    headers.add(std::string("Content-Type: ") + content_type);
    headers.add("Expect:");  // no 100-continue round trip on large bodies
    if (!options.bearer_token.empty()) {
      headers.add("Authorization: Bearer " + options.bearer_token);
    }
    if (!options.hmac_secret.empty()) {
      headers.add(options.signature_header +
                  ": sha256=" + hmac_sha256_hex(options.hmac_secret, body));
    }
    for (const auto& [name, value] : options.headers) {
      headers.add(name + ": " + value);
    }
    for (const auto& [name, value] : extra) {
      headers.add(name + ": " + value);
    }
    internal::BodyStart response;
    std::string retry_after;
    char error[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url.c_str());
    curl_easy_setopt(h, CURLOPT_POST, 1L);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers.list);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS,
                     static_cast<long>(options.connect_timeout.count()));
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, static_cast<long>(options.request_timeout.count()));
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &response);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, collect_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &retry_after);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, error);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "outbox-relay");
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, abort_if_cancelled);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &cancelled);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    const CURLcode code = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, nullptr);
    give_back(h);
    if (code == CURLE_ABORTED_BY_CALLBACK) {
      return Publisher::cancelled("http");
    }
    if (code != CURLE_OK) {
      return classify_curl(code, error);
    }
    return internal::classify_status(status, response, retry_after);
  }

  PublishResult post_one(const PublishRequest& request) {
    const EventEnvelope& e = *request.event;
    std::vector<std::pair<std::string, std::string>> extra = {
        {std::string(kHeaderEventId), e.event_id()},
        {std::string(kHeaderEventType), e.event_type()},
        {std::string(kHeaderAggregateType), e.aggregate_type()},
        {std::string(kHeaderOccurredAt), format_rfc3339(e.occurred_at())}};
    if (e.aggregate_id()) {
      extra.emplace_back(kHeaderAggregateId, *e.aggregate_id());
    }
    if (e.tenant_id()) {
      extra.emplace_back(kHeaderTenantId, *e.tenant_id());
    }
    if (e.message_group()) {
      extra.emplace_back(kHeaderMessageGroup, *e.message_group());
    }
    for (const auto& [name, value] : e.headers()) {
      extra.emplace_back(name, value);
    }
    for (const auto& [name, value] : extra) {
      if (!valid_header(name, value)) {
        return PublishResult::permanent("http: header '" +
                                        internal::clean_reason_text(name, false) +
                                        "' is not a valid HTTP header name or value");
      }
    }
    for (const auto& [name, value] : e.headers()) {
      if (const char* why = refusal(name)) {
        return PublishResult::permanent("http: envelope header '" + name + "' refused: " + why);
      }
    }
    if (e.has_json_payload()) {
      return post(request.target, std::string(e.payload_json()), "application/json", extra);
    }
    const auto bytes = e.payload_bytes();
    return post(request.target, std::string(bytes.begin(), bytes.end()), "application/octet-stream",
                extra);
  }

  // Requests in queue order: consecutive events with one target, up to max_batch, each request
  // sent after the one before it answered; a message group's events after one that failed (its
  // request refused, or its payload) are not sent.
  std::vector<PublishResult> post_batches(std::span<const PublishRequest> batch) {
    std::vector<PublishResult> results(batch.size());
    GroupStops stops;
    for (std::size_t start = 0; start < batch.size();) {
      const std::string_view target = batch[start].target;
      std::string body = "[";
      std::vector<std::size_t> included;
      std::size_t next = start;
      for (; next < batch.size() && batch[next].target == target &&
             included.size() < options.max_batch;
           ++next) {
        const auto& event = *batch[next].event;
        if (stops.stopped(event)) {
          results[next] = GroupStops::not_sent(event, "http");
          continue;
        }
        try {
          std::string item = to_json_object(event);
          if (!included.empty()) {
            body.push_back(',');
          }
          body += item;
          included.push_back(next);
        } catch (const std::exception& ex) {
          results[next] = PublishResult::permanent(std::string("http: ") + ex.what());
          stops.fail(event);
        }
      }
      start = next;
      body.push_back(']');
      if (included.empty()) {
        continue;
      }
      const PublishResult shared = post(std::string(target), body, "application/json", {});
      for (std::size_t i : included) {
        results[i] = shared;
        if (!shared.is_ok()) {
          stops.fail(*batch[i].event);
        }
      }
    }
    return results;
  }
};

HttpPublisher::HttpPublisher(Options options) : impl_(std::make_unique<Impl>()) {
  static CurlGlobal global;
  if (options.max_batch == 0) {
    throw std::invalid_argument("HttpPublisher: max_batch must be >= 1");
  }
  if (options.connect_timeout.count() <= 0 || options.request_timeout.count() <= 0) {
    throw std::invalid_argument("HttpPublisher: connect_timeout and request_timeout must be > 0");
  }
  if (!valid_header(options.signature_header, "")) {
    throw std::invalid_argument("HttpPublisher: signature_header is not a valid header name");
  }
  // The signature may sit under an X-Outbox-* name (the default is X-Outbox-Signature), but not
  // under one the request already carries.
  if (is_protocol_header(options.signature_header) ||
      iequals(options.signature_header, "Authorization") ||
      is_metadata_header(options.signature_header)) {
    throw std::invalid_argument("HttpPublisher: signature_header '" + options.signature_header +
                                "' is a header the publisher or libcurl already sets");
  }
  for (const auto& [name, value] : options.headers) {
    if (!valid_header(name, value)) {
      throw std::invalid_argument("HttpPublisher: headers: '" + name + "' is not a valid header");
    }
    // Configuration is trusted, but the same names are refused as for events: a configured
    // Content-Length or Transfer-Encoding would misframe every request, Content-Type would
    // contradict the one set per payload (JSON or octet-stream), hop-by-hop headers concern the
    // connection libcurl manages, and X-Outbox-* or the signature header would be sent twice,
    // leaving the receiver to guess which one is real. Authorization stays allowed (it is how a
    // scheme other than Bearer is configured) unless bearer_token sets it already.
    const bool taken = is_protocol_header(name) || istarts_with(name, kOwnPrefix) ||
                       iequals(name, options.signature_header) ||
                       (iequals(name, "Authorization") && !options.bearer_token.empty());
    if (taken) {
      throw std::invalid_argument("HttpPublisher: headers: '" + name +
                                  "' is a header the publisher or libcurl sets itself");
    }
  }
  if (!valid_header("Authorization", options.bearer_token)) {
    throw std::invalid_argument("HttpPublisher: bearer_token contains a line break");
  }
  impl_->options = std::move(options);
}

HttpPublisher::~HttpPublisher() = default;

void HttpPublisher::cancel() noexcept {
  impl_->cancelled = true;
}

std::vector<PublishResult> HttpPublisher::publish(std::span<const PublishRequest> batch) {
  if (impl_->options.mode == Mode::Batch) {
    return impl_->post_batches(batch);
  }
  std::vector<PublishResult> results;
  results.reserve(batch.size());
  for (const auto& request : batch) {
    results.push_back(impl_->post_one(request));
  }
  return results;
}

}  // namespace outbox::http
