#include "outbox/http/internal/response.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <ctime>

namespace outbox::http::internal {
namespace {

// Longest Retry-After honoured: a receiver asking for more still gets called back within this.
constexpr std::chrono::seconds kMaxRetryAfter{3600};

}  // namespace

// Reason text ends up in the outbox table's last_error (PostgreSQL refuses invalid UTF-8 and NUL
// in text) and in logs, but a response body is whatever the receiver sent. Ill-formed sequences
// become U+FFFD (one per maximal ill-formed subpart, Unicode §3.9), line breaks and tabs a space,
// other control bytes '?'. With `truncated`, a character left incomplete at the end was cut by the
// byte limit and is dropped rather than reported as garbage. Kept local (not truncate_error) so
// the publisher's own results are clean whoever stores them.
std::string clean_reason_text(std::string_view in, bool truncated) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(in.size());
  std::size_t i = 0;
  while (i < in.size()) {
    const auto lead = static_cast<unsigned char>(in[i]);
    if (lead < 0x80) {
      out.push_back(lead == '\t' || lead == '\n' || lead == '\r' ? ' '
                    : lead < 0x20 || lead == 0x7f                ? '?'
                                                                 : static_cast<char>(lead));
      ++i;
      continue;
    }
    // Well-formed sequences (Unicode Table 3-7): the second byte's range depends on the lead
    // (no overlong forms, no surrogates, nothing past U+10FFFF).
    std::size_t length = 0;
    unsigned char low = 0x80;
    unsigned char high = 0xbf;
    if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3;
      low = lead == 0xe0 ? 0xa0 : 0x80;
      high = lead == 0xed ? 0x9f : 0xbf;
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4;
      low = lead == 0xf0 ? 0x90 : 0x80;
      high = lead == 0xf4 ? 0x8f : 0xbf;
    }
    std::size_t good = length == 0 ? 0 : 1;  // bytes of a well-formed prefix
    while (good != 0 && good < length && i + good < in.size()) {
      const auto c = static_cast<unsigned char>(in[i + good]);
      if (c < (good == 1 ? low : 0x80) || c > (good == 1 ? high : 0xbf)) {
        break;
      }
      ++good;
    }
    if (length != 0 && good == length) {
      out.append(in.substr(i, length));
      i += length;
      continue;
    }
    if (truncated && length != 0 && i + good == in.size()) {
      break;
    }
    out.append(kReplacement);
    i += std::max<std::size_t>(good, 1);
  }
  return out;
}

// Retry-After as delta-seconds or an HTTP date (RFC 9110 §10.2.3); nullopt when absent, bad,
// zero or in the past (then the normal backoff applies and the attempt counts).
std::optional<std::chrono::milliseconds> parse_retry_after(const std::string& value) {
  if (value.empty()) {
    return std::nullopt;
  }
  std::chrono::seconds delay;
  if (value.find_first_not_of("0123456789") == std::string::npos) {
    // Leading zeros do not make a number large ("0000000000" is zero, not an hour).
    const std::string digits = value.substr(std::min(value.find_first_not_of('0'), value.size()));
    delay = std::chrono::seconds(digits.empty()      ? 0
                                 : digits.size() > 9 ? kMaxRetryAfter.count()
                                                     : std::stoll(digits));
  } else {
    const time_t at = curl_getdate(value.c_str(), nullptr);
    if (at < 0) {
      return std::nullopt;
    }
    delay = std::chrono::seconds(std::max<time_t>(0, at - std::time(nullptr)));
  }
  if (delay.count() <= 0) {
    return std::nullopt;
  }
  // Clamped in seconds: a date in the year 2147483647 is ~6.8e16 s, which overflows as
  // milliseconds.
  return std::min(delay, kMaxRetryAfter);
}

PublishResult classify_status(long status, const BodyStart& body, const std::string& retry_after) {
  if (status >= 200 && status < 300) {
    return PublishResult::ok();
  }
  std::string reason = "HTTP " + std::to_string(status);
  if (!body.bytes.empty()) {
    reason += ": " + clean_reason_text(body.bytes, body.truncated);
  }
  // Past 599 is no HTTP status, but some rate limiters answer 999: retried like a 5xx, as curl's
  // garbled responses are.
  if (status == 408 || status == 429 || status >= 500) {
    return PublishResult::retriable(std::move(reason), parse_retry_after(retry_after));
  }
  return PublishResult::permanent(std::move(reason));
}

std::optional<std::string> retry_after_header(std::string_view line) {
  constexpr std::string_view kName = "retry-after:";
  if (line.size() <= kName.size()) {
    return std::nullopt;
  }
  for (std::size_t i = 0; i < kName.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(line[i])) != kName[i]) {
      return std::nullopt;
    }
  }
  // Trimmed alike at both ends: "Retry-After: \r\n", curl's line for an empty value, is "".
  constexpr std::string_view kSpace = " \t\r\n";
  auto value = line.substr(kName.size());
  const auto first = value.find_first_not_of(kSpace);
  return first == std::string_view::npos
             ? ""
             : std::string(value.substr(first, value.find_last_not_of(kSpace) - first + 1));
}

}  // namespace outbox::http::internal
