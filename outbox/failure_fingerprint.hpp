#pragma once
// Failure fingerprints: DEAD events that failed for the same reason, grouped for triage.

#include <string>
#include <string_view>

namespace outbox {

/// The failure class of a DEAD event.
struct FailureFingerprint {
  std::string id;          ///< 16 lower-case hex digits of event type + pattern; URL-safe
  std::string event_type;  ///< the event's type
  std::string pattern;     ///< the normalized error (normalize_error)
};

/// The first line of `error` (at most 500 bytes of it) with what differs between occurrences of
/// one failure replaced: single- and back-quoted values by `'?'` (an apostrophe inside a word is
/// no quote), numbers by `N` (except a status or error code after "HTTP", "error", "code",
/// "status", "errno" or "SQLSTATE", also written `status: 400`, `status=400`, `HTTP/1.1 400`),
/// ids (UUIDs, and words of 6 characters or more mixing digits and letters, such as ULIDs and
/// hex) by `<id>`; whitespace runs become one space. Never throws on any input (invalid UTF-8
/// is kept as bytes).
std::string normalize_error(std::string_view error);

/// The fingerprint of a DEAD event of `event_type` whose last error is `last_error`.
FailureFingerprint fingerprint_failure(std::string_view event_type, std::string_view last_error);

}  // namespace outbox
