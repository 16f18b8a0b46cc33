#include "outbox/failure_fingerprint.hpp"

#include <array>
#include <cstdint>

namespace outbox {
namespace {

// Enough of an error to tell failures apart; the rest is usually a body or a stack.
constexpr std::size_t kMaxErrorBytes = 500;

bool is_word_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
         c == '-' || c == '.' || c == ':' || static_cast<unsigned char>(c) >= 0x80;
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

bool is_hex(char c) {
  return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

bool is_alpha(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
}

std::string lower(std::string_view s) {
  std::string out(s);
  for (auto& c : out) {
    if (c >= 'A' && c <= 'Z') {
      c = static_cast<char>(c - 'A' + 'a');
    }
  }
  return out;
}

bool is_uuid(std::string_view w) {
  if (w.size() != 36) {
    return false;
  }
  for (std::size_t i = 0; i < w.size(); ++i) {
    const bool dash = i == 8 || i == 13 || i == 18 || i == 23;
    if (dash ? w[i] != '-' : !is_hex(w[i])) {
      return false;
    }
  }
  return true;
}

// A word after which a number names a kind of failure rather than an occurrence of one.
bool names_a_code(std::string_view word) {
  const auto w = lower(word);
  return w == "http" || w == "error" || w == "code" || w == "status" || w == "errno" ||
         w == "sqlstate";
}

bool is_alnum(char c) {
  return is_digit(c) || is_alpha(c);
}

// What the last words said about the next number.
struct CodeState {
  bool code_next = false;     // a code word came: the next number is a code, kept
  bool version_next = false;  // "HTTP/": a protocol version (1.1) comes first, kept too
};

// One word, normalized: a number (digits with . or : between) → N unless it is a code, an id →
// <id>, else itself; `state` follows what it was.
std::string normalize_word(std::string_view w, CodeState& state) {
  // Trailing punctuation of a sentence stays outside the replacement.
  std::size_t end = w.size();
  while (end > 0 && (w[end - 1] == '.' || w[end - 1] == ':' || w[end - 1] == ',')) {
    --end;
  }
  const std::string_view core = w.substr(0, end), tail = w.substr(end);
  if (core.empty()) {
    return std::string(tail);
  }
  bool digits = false, letters = false, numeric = true;
  for (char c : core) {
    digits = digits || is_digit(c);
    letters = letters || is_alpha(c);
    numeric = numeric && (is_digit(c) || c == '.' || c == ':' || c == ',');
  }
  if (numeric && digits) {
    const bool keep = (state.code_next || state.version_next) && core.size() <= 5;
    // After "HTTP/" the version is kept and the status still comes.
    state.code_next = state.version_next && keep;
    state.version_next = false;
    return (keep ? std::string(core) : "N") + std::string(tail);
  }
  state.code_next = names_a_code(core);
  state.version_next = false;
  if (is_uuid(core) || (digits && letters && core.size() >= 6)) {
    return "<id>" + std::string(tail);
  }
  return std::string(core) + std::string(tail);
}

}  // namespace

std::string normalize_error(std::string_view error) {
  const auto eol = error.find_first_of("\r\n");
  if (eol != std::string_view::npos) {
    error = error.substr(0, eol);
  }
  if (error.size() > kMaxErrorBytes) {
    error = error.substr(0, kMaxErrorBytes);
  }
  std::string out;
  out.reserve(error.size());
  CodeState state;
  std::size_t i = 0;
  while (i < error.size()) {
    const char c = error[i];
    // An apostrophe inside a word (couldn't) is no quote.
    const bool apostrophe = c == '\'' && i > 0 && is_alnum(error[i - 1]) && i + 1 < error.size() &&
                            is_alpha(error[i + 1]);
    if ((c == '\'' || c == '`') && !apostrophe) {
      const auto close = error.find(c, i + 1);
      if (close != std::string_view::npos) {
        out += c;
        out += '?';
        out += c;
        i = close + 1;
        state = {};
        continue;
      }
    }
    if (c == ' ' || c == '\t' || c == '\f' || c == '\v') {
      if (!out.empty() && out.back() != ' ') {
        out += ' ';
      }
      ++i;
      continue;
    }
    if (is_word_char(c)) {
      std::size_t j = i;
      while (j < error.size() && is_word_char(error[j])) {
        ++j;
      }
      out += normalize_word(error.substr(i, j - i), state);
      i = j;
      continue;
    }
    out += c;
    if (c == '/' && state.code_next) {
      state.version_next = true;  // HTTP/1.1
    } else if (c != '=' && c != ':' && c != '#' && !apostrophe) {
      state = {};  // status=400, code: 42, errno#111 keep their code
    }
    ++i;
  }
  while (!out.empty() && out.back() == ' ') {
    out.pop_back();
  }
  return out;
}

FailureFingerprint fingerprint_failure(std::string_view event_type, std::string_view last_error) {
  FailureFingerprint f;
  f.event_type = std::string(event_type);
  f.pattern = normalize_error(last_error);
  // FNV-1a, 64 bits: stable across builds and platforms (std::hash is not).
  std::uint64_t h = 0xcbf29ce484222325ULL;
  auto mix = [&](std::string_view s) {
    for (unsigned char c : s) {
      h ^= c;
      h *= 0x100000001b3ULL;
    }
  };
  mix(f.event_type);
  mix(std::string_view("\n", 1));
  mix(f.pattern);
  static constexpr std::array<char, 16> kHex{'0', '1', '2', '3', '4', '5', '6', '7',
                                             '8', '9', 'a', 'b', 'c', 'd', 'e', 'f'};
  f.id.resize(16);
  for (int k = 15; k >= 0; --k) {
    f.id[static_cast<std::size_t>(k)] = kHex[h & 0xF];
    h >>= 4;
  }
  return f;
}

}  // namespace outbox
