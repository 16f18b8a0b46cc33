#pragma once
// Small JSON writing helpers shared by the operator views (status, dead events, subscriptions).

#include <optional>
#include <string>

#include "outbox/json_codec.hpp"

namespace outbox::relay::internal {

/// Appends `value` as a JSON string, or null.
inline void append_optional(std::string& out, const std::optional<std::string>& value) {
  if (value) {
    append_json_string(out, *value);
  } else {
    out += "null";
  }
}

}  // namespace outbox::relay::internal
