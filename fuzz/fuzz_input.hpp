#pragma once
// Splits a fuzzer's bytes into fields, so one input drives several parameters.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace outbox::fuzz {

/// The input cut at each NUL byte, at least `count` fields (missing ones empty).
inline std::vector<std::string> fields(const std::uint8_t* data, std::size_t size,
                                       std::size_t count) {
  std::vector<std::string> out(1);
  for (std::size_t i = 0; i < size; ++i) {
    if (data[i] == 0) {
      out.emplace_back();
    } else {
      out.back().push_back(static_cast<char>(data[i]));
    }
  }
  if (out.size() < count) {
    out.resize(count);
  }
  return out;
}

/// True when `s` is well-formed UTF-8 (no overlong forms, surrogates or code points past U+10FFFF).
inline bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    std::size_t n = c < 0x80                   ? 1
                    : (c >= 0xc2 && c <= 0xdf) ? 2
                    : (c >= 0xe0 && c <= 0xef) ? 3
                    : (c >= 0xf0 && c <= 0xf4) ? 4
                                               : 0;
    if (n == 0 || i + n > s.size()) {
      return false;
    }
    for (std::size_t k = 1; k < n; ++k) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      unsigned char low = 0x80, high = 0xbf;
      if (k == 1 && c == 0xe0)
        low = 0xa0;
      if (k == 1 && c == 0xed)
        high = 0x9f;
      if (k == 1 && c == 0xf0)
        low = 0x90;
      if (k == 1 && c == 0xf4)
        high = 0x8f;
      if (b < low || b > high) {
        return false;
      }
    }
    i += n;
  }
  return true;
}

}  // namespace outbox::fuzz
