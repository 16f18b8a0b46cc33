#include "outbox/publisher.hpp"

#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "outbox/clock.hpp"
#include "outbox/json_codec.hpp"

namespace outbox {
namespace {

void append_base64(std::string& out, std::span<const std::uint8_t> bytes) {
  static constexpr char kAlphabet[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::size_t i = 0;
  for (; i + 3 <= bytes.size(); i += 3) {
    const std::uint32_t v = (bytes[i] << 16) | (bytes[i + 1] << 8) | bytes[i + 2];
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(kAlphabet[(v >> 6) & 63]);
    out.push_back(kAlphabet[v & 63]);
  }
  if (const std::size_t rest = bytes.size() - i; rest > 0) {
    const std::uint32_t v = (bytes[i] << 16) | (rest == 2 ? bytes[i + 1] << 8 : 0);
    out.push_back(kAlphabet[(v >> 18) & 63]);
    out.push_back(kAlphabet[(v >> 12) & 63]);
    out.push_back(rest == 2 ? kAlphabet[(v >> 6) & 63] : '=');
    out.push_back('=');
  }
}

void append_optional(std::string& out, const std::optional<std::string>& value) {
  if (value) {
    append_json_string(out, *value);
  } else {
    out += "null";
  }
}

// Recursive-descent syntax check; positions advance through `p`.
class JsonChecker {
 public:
  explicit JsonChecker(std::string_view s) : s_(s) {}
  bool check() { return value(0) && (skip_ws(), p_ == s_.size()); }

 private:
  void skip_ws() {
    while (p_ < s_.size() &&
           (s_[p_] == ' ' || s_[p_] == '\t' || s_[p_] == '\n' || s_[p_] == '\r')) {
      ++p_;
    }
  }
  bool literal(std::string_view word) {
    if (s_.substr(p_, word.size()) != word) {
      return false;
    }
    p_ += word.size();
    return true;
  }
  bool digits() {
    const auto start = p_;
    while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') {
      ++p_;
    }
    return p_ > start;
  }
  bool number() {
    if (s_[p_] == '-') {
      ++p_;
    }
    if (p_ < s_.size() && s_[p_] == '0') {
      ++p_;
    } else if (!digits()) {
      return false;
    }
    if (p_ < s_.size() && s_[p_] == '.') {
      ++p_;
      if (!digits()) {
        return false;
      }
    }
    if (p_ < s_.size() && (s_[p_] == 'e' || s_[p_] == 'E')) {
      ++p_;
      if (p_ < s_.size() && (s_[p_] == '+' || s_[p_] == '-')) {
        ++p_;
      }
      return digits();
    }
    return true;
  }
  bool string() {
    ++p_;  // opening quote
    while (p_ < s_.size()) {
      const auto c = static_cast<unsigned char>(s_[p_++]);
      if (c == '"') {
        return true;
      }
      if (c < 0x20) {
        return false;
      }
      if (c == '\\') {
        if (p_ >= s_.size()) {
          return false;
        }
        const char e = s_[p_++];
        if (e == 'u') {
          for (int i = 0; i < 4; ++i, ++p_) {
            if (p_ >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[p_]))) {
              return false;
            }
          }
        } else if (std::string_view("\"\\/bfnrt").find(e) == std::string_view::npos) {
          return false;
        }
      }
    }
    return false;
  }
  template <typename Element>
  bool sequence(char close, Element element) {
    ++p_;  // opening bracket
    skip_ws();
    if (p_ < s_.size() && s_[p_] == close) {
      ++p_;
      return true;
    }
    for (;;) {
      if (!element()) {
        return false;
      }
      skip_ws();
      if (p_ >= s_.size()) {
        return false;
      }
      if (s_[p_] == close) {
        ++p_;
        return true;
      }
      if (s_[p_++] != ',') {
        return false;
      }
    }
  }
  bool value(int depth) {
    skip_ws();
    if (p_ >= s_.size() || depth > 512) {
      return false;
    }
    switch (s_[p_]) {
      case '{':
        return sequence('}', [&] {
          skip_ws();
          if (p_ >= s_.size() || s_[p_] != '"' || !string()) {
            return false;
          }
          skip_ws();
          return p_ < s_.size() && s_[p_++] == ':' && value(depth + 1);
        });
      case '[':
        return sequence(']', [&] { return value(depth + 1); });
      case '"':
        return string();
      case 't':
        return literal("true");
      case 'f':
        return literal("false");
      case 'n':
        return literal("null");
      default:
        return number();
    }
  }

  std::string_view s_;
  std::size_t p_ = 0;
};

}  // namespace

bool is_valid_json(std::string_view text) noexcept {
  return JsonChecker(text).check();
}

std::string to_json_object(const EventEnvelope& event) {
  std::string out;
  out.reserve(192 + event.payload_bytes().size());
  out += "{\"event_id\":";
  append_json_string(out, event.event_id());
  out += ",\"event_type\":";
  append_json_string(out, event.event_type());
  out += ",\"aggregate_type\":";
  append_json_string(out, event.aggregate_type());
  out += ",\"aggregate_id\":";
  append_optional(out, event.aggregate_id());
  out += ",\"tenant_id\":";
  append_optional(out, event.tenant_id());
  out += ",\"occurred_at\":\"";
  out += format_rfc3339(event.occurred_at());
  out += "\",\"headers\":";
  out += JsonCodec::default_codec().to_json(event.headers()).value_or("{}");
  if (!event.tags().empty()) {
    out += ",\"tags\":";
    out += JsonCodec::default_codec().to_json(event.tags()).value_or("{}");
  }
  if (event.message_group()) {
    out += ",\"message_group\":";
    append_json_string(out, *event.message_group());
  }
  out += ",";
  if (event.has_json_payload()) {
    if (!is_valid_json(event.payload_json())) {
      throw std::invalid_argument("payload of event " + event.event_id() + " is not valid JSON");
    }
    out += "\"payload\":";
    out += event.payload_json();
  } else {
    out += "\"payload_base64\":\"";
    append_base64(out, event.payload_bytes());
    out.push_back('"');
  }
  out.push_back('}');
  return out;
}

bool GroupStops::stopped(const EventEnvelope& event) const {
  const auto& group = event.message_group();
  return group && std::find(groups_.begin(), groups_.end(), *group) != groups_.end();
}

void GroupStops::fail(const EventEnvelope& event) {
  if (const auto& group = event.message_group(); group && !stopped(event)) {
    groups_.push_back(*group);
  }
}

PublishResult GroupStops::not_sent(const EventEnvelope& event, const std::string& who) {
  return PublishResult::retriable(who + ": not sent: an earlier event of message group '" +
                                      event.message_group().value_or("") +
                                      "' failed in the same batch",
                                  std::chrono::milliseconds(1));
}

}  // namespace outbox
