#pragma once
// Parameter and column values exchanged with a sql::Connection.

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

namespace outbox::sql {

/// Borrowed text parameter: valid only for the duration of the call it is passed to.
struct TextRef {
  std::string_view text;
};
/// Borrowed binary parameter: valid only for the duration of the call it is passed to.
struct BlobRef {
  std::span<const std::uint8_t> bytes;
};
/// Owned binary value.
struct Blob {
  std::vector<std::uint8_t> bytes;
  friend bool operator==(const Blob&, const Blob&) = default;
};

/// A parameter or column value. Columns always come back owned (no TextRef/BlobRef).
using Value =
    std::variant<std::monostate, std::int64_t, double, std::string, Blob, TextRef, BlobRef>;

/// A nullable text parameter that borrows `s` when set.
inline Value text_or_null(const std::optional<std::string>& s) {
  return s ? Value(TextRef{*s}) : Value(std::monostate{});
}
/// A nullable text parameter that borrows `s` when set.
inline Value text_or_null(std::optional<std::string_view> s) {
  return s ? Value(TextRef{*s}) : Value(std::monostate{});
}

/// One result row. Accessors throw outbox::StoreError on a type mismatch or a bad index.
class Row {
 public:
  explicit Row(std::vector<Value> values) : values_(std::move(values)) {}
  std::size_t size() const noexcept { return values_.size(); }
  bool is_null(std::size_t i) const;
  std::int64_t get_int(std::size_t i) const;
  /// Text (a blob is returned as its bytes).
  std::string get_text(std::size_t i) const;
  /// Null gives nullopt.
  std::optional<std::string> get_optional_text(std::size_t i) const;
  std::optional<std::int64_t> get_optional_int(std::size_t i) const;
  bool is_blob(std::size_t i) const;
  const Value& at(std::size_t i) const;

 private:
  std::vector<Value> values_;
};

}  // namespace outbox::sql
