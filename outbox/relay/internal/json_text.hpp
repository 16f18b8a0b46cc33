#pragma once
// Small JSON writing helpers shared by the operator views (status, dead events, subscriptions).

#include <optional>
#include <string>

#include "outbox/json_codec.hpp"
#include "outbox/store.hpp"

namespace outbox::relay::internal {

/// Appends `value` as a JSON string; bytes that are not UTF-8 (a row another client wrote)
/// become U+FFFD, so every answer is JSON a strict reader accepts.
inline void append_text(std::string& out, std::string_view value) {
  append_json_string(out, sanitize_utf8(value));
}

/// Appends `value` as append_text does, or null.
inline void append_optional(std::string& out, const std::optional<std::string>& value) {
  if (value) {
    append_text(out, *value);
  } else {
    out += "null";
  }
}

}  // namespace outbox::relay::internal
