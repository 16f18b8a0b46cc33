#include "outbox/json_codec.hpp"

#include <cstdint>
#include <stdexcept>

namespace outbox {

void append_json_string(std::string& out, std::string_view s) {
  static constexpr char kHex[] = "0123456789abcdef";
  out.push_back('"');
  for (char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          out += "\\u00";
          out.push_back(kHex[(c >> 4) & 0xf]);
          out.push_back(kHex[c & 0xf]);
        } else {
          out.push_back(c);
        }
    }
  }
  out.push_back('"');
}

namespace {

void append_utf8(std::string& out, std::uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// Recursive-descent parser for one flat object of string values.
class Parser {
 public:
  explicit Parser(std::string_view text) : text_(text) {}

  Headers parse() {
    skip_ws();
    if (pos_ == text_.size()) {
      return {};
    }
    if (text_.substr(pos_, 4) == "null" && only_ws_after(pos_ + 4)) {
      return {};
    }
    if (text_[pos_] != '{') {
      fail("expected a JSON object");
    }
    ++pos_;
    Headers result;
    skip_ws();
    if (peek() == '}') {
      ++pos_;
    } else {
      for (;;) {
        skip_ws();
        if (peek() != '"') {
          fail("expected a string key");
        }
        std::string key = parse_string();
        if (key.empty()) {
          fail("empty key");
        }
        skip_ws();
        expect(':');
        skip_ws();
        if (text_.substr(pos_, 4) == "null") {
          // Other producers write absent headers as null: the header is absent.
          pos_ += 4;
          result.erase(key);
        } else if (peek() != '"') {
          fail("values must be strings or null");
        } else {
          result.insert_or_assign(std::move(key), parse_string());
        }
        skip_ws();
        if (peek() == ',') {
          ++pos_;
          continue;
        }
        expect('}');
        break;
      }
    }
    skip_ws();
    if (pos_ != text_.size()) {
      fail("unexpected text after the object");
    }
    return result;
  }

  // An object whose values are arrays of strings (or null, or absent keys: empty lists).
  StringLists parse_lists() {
    StringLists result;
    skip_ws();
    expect_char('{', "expected a JSON object");
    skip_ws();
    for (bool first = true; peek() != '}'; first = false) {
      if (!first) {
        expect(',');
        skip_ws();
      }
      if (peek() != '"') {
        fail("expected a string key");
      }
      auto& list = result[parse_string()];
      skip_ws();
      expect(':');
      skip_ws();
      if (text_.substr(pos_, 4) == "null") {
        pos_ += 4;
      } else {
        expect_char('[', "values must be arrays of strings");
        skip_ws();
        for (bool first_item = true; peek() != ']'; first_item = false) {
          if (!first_item) {
            expect_char(',', "expected ',' or ']'");
            skip_ws();
          }
          if (peek() != '"') {
            fail("array items must be strings");
          }
          list.push_back(parse_string());
          skip_ws();
        }
        ++pos_;
      }
      skip_ws();
    }
    ++pos_;
    skip_ws();
    if (pos_ != text_.size()) {
      fail("unexpected text after the object");
    }
    return result;
  }

 private:
  void expect_char(char c, const char* what) {
    if (peek() != c) {
      fail(what);
    }
    ++pos_;
  }
  [[noreturn]] void fail(const char* what) const {
    throw std::invalid_argument(std::string("invalid JSON at offset ") + std::to_string(pos_) +
                                ": " + what);
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  bool only_ws_after(std::size_t p) const {
    for (; p < text_.size(); ++p) {
      if (!is_ws(text_[p])) {
        return false;
      }
    }
    return true;
  }
  static bool is_ws(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
  void skip_ws() {
    while (pos_ < text_.size() && is_ws(text_[pos_])) {
      ++pos_;
    }
  }
  void expect(char c) {
    if (peek() != c) {
      fail(c == ':' ? "expected ':'" : c == '}' ? "expected ',' or '}'" : "unexpected character");
    }
    ++pos_;
  }
  std::uint32_t parse_hex4() {
    if (pos_ + 4 > text_.size()) {
      fail("truncated \\u escape");
    }
    std::uint32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      char c = text_[pos_++];
      v <<= 4;
      if (c >= '0' && c <= '9') {
        v |= static_cast<std::uint32_t>(c - '0');
      } else if (c >= 'a' && c <= 'f') {
        v |= static_cast<std::uint32_t>(c - 'a' + 10);
      } else if (c >= 'A' && c <= 'F') {
        v |= static_cast<std::uint32_t>(c - 'A' + 10);
      } else {
        fail("bad hex digit in \\u escape");
      }
    }
    return v;
  }
  std::string parse_string() {
    ++pos_;  // opening quote
    std::string out;
    for (;;) {
      if (pos_ >= text_.size()) {
        fail("unterminated string");
      }
      char c = text_[pos_++];
      if (c == '"') {
        return out;
      }
      if (static_cast<unsigned char>(c) < 0x20) {
        fail("control character in string");
      }
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= text_.size()) {
        fail("unterminated escape");
      }
      char e = text_[pos_++];
      switch (e) {
        case '"':
        case '\\':
        case '/':
          out.push_back(e);
          break;
        case 'b':
          out.push_back('\b');
          break;
        case 'f':
          out.push_back('\f');
          break;
        case 'n':
          out.push_back('\n');
          break;
        case 'r':
          out.push_back('\r');
          break;
        case 't':
          out.push_back('\t');
          break;
        case 'u': {
          std::uint32_t cp = parse_hex4();
          if (cp >= 0xD800 && cp <= 0xDBFF) {
            if (text_.substr(pos_, 2) != "\\u") {
              fail("high surrogate without a low surrogate");
            }
            pos_ += 2;
            std::uint32_t low = parse_hex4();
            if (low < 0xDC00 || low > 0xDFFF) {
              fail("high surrogate followed by a non-low surrogate");
            }
            cp = 0x10000 + ((cp - 0xD800) << 10) + (low - 0xDC00);
          } else if (cp >= 0xDC00 && cp <= 0xDFFF) {
            fail("lone low surrogate");
          }
          append_utf8(out, cp);
          break;
        }
        default:
          fail("unknown escape");
      }
    }
  }

  std::string_view text_;
  std::size_t pos_ = 0;
};

class DefaultJsonCodec final : public JsonCodec {
 public:
  std::optional<std::string> to_json(const Headers& headers) const override {
    if (headers.empty()) {
      return std::nullopt;
    }
    std::string out = "{";
    bool first = true;
    for (const auto& [key, value] : headers) {
      if (key.empty()) {
        throw std::invalid_argument("header keys must not be empty");
      }
      if (!first) {
        out.push_back(',');
      }
      first = false;
      append_json_string(out, key);
      out.push_back(':');
      append_json_string(out, value);
    }
    out.push_back('}');
    return out;
  }

  Headers parse_object(std::string_view json) const override { return Parser(json).parse(); }
};

}  // namespace

StringLists parse_string_lists(std::string_view json) {
  return Parser(json).parse_lists();
}

std::string to_json(const StringLists& lists) {
  std::string out = "{";
  for (const auto& [key, items] : lists) {
    if (out.size() > 1) {
      out.push_back(',');
    }
    append_json_string(out, key);
    out += ":[";
    for (std::size_t i = 0; i < items.size(); ++i) {
      if (i > 0) {
        out.push_back(',');
      }
      append_json_string(out, items[i]);
    }
    out.push_back(']');
  }
  out.push_back('}');
  return out;
}

const JsonCodec& JsonCodec::default_codec() {
  static const DefaultJsonCodec instance;
  return instance;
}

}  // namespace outbox
