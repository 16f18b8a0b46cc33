#include "outbox/sql/value.hpp"

#include <charconv>
#include <cmath>

#include "outbox/errors.hpp"

namespace outbox::sql {

const Value& Row::at(std::size_t i) const {
  if (i >= values_.size()) {
    throw StoreError("column index " + std::to_string(i) + " out of range (row has " +
                     std::to_string(values_.size()) + " columns)");
  }
  return values_[i];
}

bool Row::is_null(std::size_t i) const {
  return std::holds_alternative<std::monostate>(at(i));
}

bool Row::is_blob(std::size_t i) const {
  return std::holds_alternative<Blob>(at(i));
}

std::int64_t Row::get_int(std::size_t i) const {
  const Value& v = at(i);
  if (const auto* n = std::get_if<std::int64_t>(&v)) {
    return *n;
  }
  if (const auto* d = std::get_if<double>(&v)) {
    // Out of range (or NaN) has no integer: casting it would be undefined.
    if (!(*d >= -9.2e18 && *d <= 9.2e18)) {
      throw StoreError("column " + std::to_string(i) + " is a real number out of integer range");
    }
    return static_cast<std::int64_t>(*d);
  }
  if (const auto* s = std::get_if<std::string>(&v)) {
    try {
      return std::stoll(*s);
    } catch (const std::exception&) {
      // Fall through to the type error below.
    }
  }
  throw StoreError("column " + std::to_string(i) + " is not an integer");
}

std::string Row::get_text(std::size_t i) const {
  const Value& v = at(i);
  if (const auto* s = std::get_if<std::string>(&v)) {
    return *s;
  }
  if (const auto* b = std::get_if<Blob>(&v)) {
    return std::string(b->bytes.begin(), b->bytes.end());
  }
  if (const auto* n = std::get_if<std::int64_t>(&v)) {
    return std::to_string(*n);
  }
  if (const auto* d = std::get_if<double>(&v)) {
    // A number another client bound as a float (9.99 is valid JSON text too).
    char text[32];
    const auto [end, ec] = std::to_chars(text, text + sizeof text, *d);
    if (ec == std::errc() && std::isfinite(*d)) {
      return std::string(text, end);
    }
  }
  throw StoreError("column " + std::to_string(i) + " is not text");
}

std::optional<std::string> Row::get_optional_text(std::size_t i) const {
  if (is_null(i)) {
    return std::nullopt;
  }
  return get_text(i);
}

std::optional<std::int64_t> Row::get_optional_int(std::size_t i) const {
  if (is_null(i)) {
    return std::nullopt;
  }
  return get_int(i);
}

}  // namespace outbox::sql
