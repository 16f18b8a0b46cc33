#pragma once
// Text from the database made safe to print on an operator's terminal.

#include <string>
#include <string_view>

#include "outbox/store.hpp"

namespace outbox::cli {

/// `text` with bytes that are not UTF-8 as U+FFFD and every control character but newline and
/// tab (C0, DEL and the C1 range, which terminals read as escape sequences) as '?': a row's error
/// or type can neither cut the output short (NUL) nor retitle or clear the terminal (ESC).
inline std::string for_terminal(std::string_view text) {
  std::string out;
  const std::string valid = sanitize_utf8(text);
  out.reserve(valid.size());
  for (std::size_t i = 0; i < valid.size(); ++i) {
    const auto c = static_cast<unsigned char>(valid[i]);
    if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7F) {
      out += '?';
    } else if (c == 0xC2 && i + 1 < valid.size() &&
               static_cast<unsigned char>(valid[i + 1]) >= 0x80 &&
               static_cast<unsigned char>(valid[i + 1]) <= 0x9F) {
      out += '?';  // U+0080..U+009F
      ++i;
    } else {
      out += static_cast<char>(c);
    }
  }
  return out;
}

}  // namespace outbox::cli
