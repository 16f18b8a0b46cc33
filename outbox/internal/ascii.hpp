#pragma once
// ASCII text helpers for protocol tokens (HTTP header names, trace context values): the locale
// must never matter for them.

#include <algorithm>
#include <string_view>

namespace outbox::internal {

/// `c` in lowercase when it is an ASCII capital letter, otherwise unchanged.
constexpr char ascii_lower(char c) noexcept {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

/// True when equal with ASCII letters compared case-insensitively (as HTTP compares names).
inline bool iequals(std::string_view a, std::string_view b) noexcept {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return ascii_lower(x) == ascii_lower(y);
         });
}

/// `s` without the spaces and tabs around it (HTTP's optional whitespace).
inline std::string_view trim_blanks(std::string_view s) noexcept {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) {
    s.remove_prefix(1);
  }
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) {
    s.remove_suffix(1);
  }
  return s;
}

}  // namespace outbox::internal
