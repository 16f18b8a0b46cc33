#pragma once
// Encoding of the headers column: a flat JSON object of string values.

#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace outbox {

/// Event headers: string keys (never empty) to string values, ordered for stable encoding.
using Headers = std::map<std::string, std::string, std::less<>>;
/// An event's tags: name → value (stored as a JSON object, like headers).
using Tags = Headers;

/// Encodes and decodes header maps. Implementations must be thread-safe.
class JsonCodec {
 public:
  virtual ~JsonCodec() = default;
  /// JSON object text, or nullopt for an empty map. Throws std::invalid_argument on an empty key.
  virtual std::optional<std::string> to_json(const Headers& headers) const = 0;
  /// Parses a flat object of string values (a `null` value: the header is absent, as other
  /// producers write it); empty input or `null` give an empty map.
  /// Throws std::invalid_argument (with the offset) on malformed or non-object input.
  virtual Headers parse_object(std::string_view json) const = 0;
  /// The built-in zero-dependency codec, shared.
  static const JsonCodec& default_codec();
};

/// Named lists of strings: {"a": ["x", "y"], "b": []}.
using StringLists = std::map<std::string, std::vector<std::string>, std::less<>>;
/// Parses a JSON object whose values are arrays of strings (null: an empty list). Throws
/// std::invalid_argument (with the offset) otherwise.
StringLists parse_string_lists(std::string_view json);
/// Encodes `lists` as parse_string_lists reads it.
std::string to_json(const StringLists& lists);

/// Appends `s` to `out` as a quoted JSON string literal (escaping quotes, backslashes, controls).
void append_json_string(std::string& out, std::string_view s);

}  // namespace outbox
