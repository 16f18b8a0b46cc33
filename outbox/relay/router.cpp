#include "outbox/relay/router.hpp"

#include <array>

namespace outbox::relay {
namespace {

constexpr std::array<std::string_view, 4> kPlaceholders = {"event_type", "aggregate_type",
                                                           "aggregate_id", "tenant_id"};

}  // namespace

bool glob_match(std::string_view pattern, std::string_view text) noexcept {
  // Iterative matcher with one backtrack point for the last '*': linear in practice.
  std::size_t p = 0, t = 0, star = std::string_view::npos, mark = 0;
  while (t < text.size()) {
    if (p < pattern.size() && (pattern[p] == '?' || pattern[p] == text[t])) {
      ++p;
      ++t;
    } else if (p < pattern.size() && pattern[p] == '*') {
      star = p++;
      mark = t;
    } else if (star != std::string_view::npos) {
      p = star + 1;
      t = ++mark;
    } else {
      return false;
    }
  }
  while (p < pattern.size() && pattern[p] == '*') {
    ++p;
  }
  return p == pattern.size();
}

std::optional<std::string> template_problem(std::string_view target) {
  for (std::size_t pos = target.find('{'); pos != std::string_view::npos;
       pos = target.find('{', pos + 1)) {
    const auto end = target.find('}', pos);
    if (end == std::string_view::npos) {
      return "unterminated '{' in '" + std::string(target) + "'";
    }
    const auto name = target.substr(pos + 1, end - pos - 1);
    bool known = false;
    for (auto p : kPlaceholders) {
      known = known || p == name;
    }
    if (!known) {
      return "unknown placeholder {" + std::string(name) +
             "} (use {event_type}, {aggregate_type}, {aggregate_id} or {tenant_id})";
    }
  }
  return std::nullopt;
}

std::string expand_target(std::string_view target, const EventEnvelope& event) {
  std::string out;
  std::size_t pos = 0;
  for (;;) {
    const auto open = target.find('{', pos);
    const auto close = open == std::string_view::npos ? open : target.find('}', open);
    if (close == std::string_view::npos) {
      out.append(target.substr(pos));
      return out;
    }
    out.append(target.substr(pos, open - pos));
    const auto name = target.substr(open + 1, close - open - 1);
    if (name == "event_type") {
      out += event.event_type();
    } else if (name == "aggregate_type") {
      out += event.aggregate_type();
    } else if (name == "aggregate_id") {
      out += event.aggregate_id().value_or("");
    } else if (name == "tenant_id") {
      out += event.tenant_id().value_or("");
    } else {
      out.append(target.substr(open, close - open + 1));
    }
    pos = close + 1;
  }
}

std::optional<std::size_t> Router::match(std::string_view aggregate_type,
                                         std::string_view event_type) const {
  for (std::size_t i = 0; i < routes_.size(); ++i) {
    if (glob_match(routes_[i].event_type, event_type) &&
        glob_match(routes_[i].aggregate_type, aggregate_type)) {
      return i;
    }
  }
  return std::nullopt;
}

}  // namespace outbox::relay
