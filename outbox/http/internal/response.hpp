#pragma once
// What the HTTP publisher makes of a receiver's answer: the result of a status, the Retry-After
// header, the failure reason from the start of the body. Apart from the transfer so it can be
// tested and fuzzed on its own.

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "outbox/publisher.hpp"

namespace outbox::http::internal {

/// The start of a response body, for the failure reason.
struct BodyStart {
  std::string bytes;       ///< at most the first bytes kept
  bool truncated = false;  ///< the body went on past `bytes`
};

/// `in` as valid UTF-8 without control characters (ill-formed sequences become U+FFFD, line breaks
/// and tabs a space, other controls '?'); with `truncated`, a character cut at the end is dropped.
std::string clean_reason_text(std::string_view in, bool truncated);
/// Retry-After as delta-seconds or an HTTP date; nullopt when absent, bad, zero or past; at most
/// an hour.
std::optional<std::chrono::milliseconds> parse_retry_after(const std::string& value);
/// 2xx: Ok; 408, 429, 5xx and past 599: Retriable (with Retry-After); the rest: Permanent.
PublishResult classify_status(long status, const BodyStart& body, const std::string& retry_after);
/// The value of a "Retry-After:" header line (any case; spaces, tabs, CR and LF trimmed), or
/// nullopt for another header.
std::optional<std::string> retry_after_header(std::string_view line);

}  // namespace outbox::http::internal
