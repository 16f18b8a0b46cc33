#include "outbox/relay/router.hpp"

#include <array>
#include <cctype>
#include <stdexcept>

namespace outbox::relay {
namespace {

constexpr std::array<std::string_view, 4> kPlaceholders = {"event_type", "aggregate_type",
                                                           "aggregate_id", "tenant_id"};

}  // namespace

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

namespace {

bool starts_with_nocase(std::string_view text, std::string_view prefix) {
  if (text.size() < prefix.size()) {
    return false;
  }
  for (std::size_t i = 0; i < prefix.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(text[i])) != prefix[i]) {
      return false;
    }
  }
  return true;
}

// RFC 3986 unreserved characters pass; everything else (/ ? # % @ : and non-ASCII bytes
// included) is percent-encoded, so a value stays inside the one component it was placed in.
void append_encoded(std::string& out, std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  for (const char c : value) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalnum(u) != 0 || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(c);
    } else {
      out.push_back('%');
      out.push_back(kHex[u >> 4]);
      out.push_back(kHex[u & 0xF]);
    }
  }
}

bool is_dns_label(std::string_view value) {
  if (value.empty() || value.size() > 63) {
    return false;
  }
  for (const char c : value) {
    if (std::isalnum(static_cast<unsigned char>(c)) == 0 && c != '-') {
      return false;
    }
  }
  return true;
}

// Refuses a URL whose path holds a "." or ".." segment: libcurl (and servers) would remove
// it and send the request to another path.
void refuse_dot_segments(std::string_view url) {
  const auto authority_end = url.find_first_of("/?#", url.find("://") + 3);
  if (authority_end == std::string_view::npos || url[authority_end] != '/') {
    return;
  }
  const auto path_end = std::min(url.find_first_of("?#", authority_end), url.size());
  std::size_t segment = authority_end + 1;
  while (segment <= path_end) {
    const auto end = std::min(url.find('/', segment), path_end);
    const auto text = url.substr(segment, end - segment);
    if (text == "." || text == "..") {
      throw std::invalid_argument("the URL path would hold a '" + std::string(text) +
                                  "' segment, which moves the request elsewhere");
    }
    segment = end + 1;
  }
}

}  // namespace

std::string expand_target(std::string_view target, const EventEnvelope& event) {
  const bool url = starts_with_nocase(target, "http://") || starts_with_nocase(target, "https://");
  // The authority (host and port) ends at the first / ? or # after the scheme.
  const std::size_t authority_end =
      url ? target.find_first_of("/?#", target.find("://") + 3) : std::string_view::npos;
  std::string out;
  std::size_t pos = 0;
  for (;;) {
    const auto open = target.find('{', pos);
    const auto close = open == std::string_view::npos ? open : target.find('}', open);
    if (close == std::string_view::npos) {
      out.append(target.substr(pos));
      if (url) {
        refuse_dot_segments(out);
      }
      return out;
    }
    out.append(target.substr(pos, open - pos));
    const auto name = target.substr(open + 1, close - open - 1);
    std::optional<std::string_view> value;
    if (name == "event_type") {
      value = event.event_type();
    } else if (name == "aggregate_type") {
      value = event.aggregate_type();
    } else if (name == "aggregate_id") {
      value = event.aggregate_id() ? std::string_view(*event.aggregate_id()) : std::string_view();
    } else if (name == "tenant_id") {
      value = event.tenant_id() ? std::string_view(*event.tenant_id()) : std::string_view();
    }
    if (!value) {
      out.append(target.substr(open, close - open + 1));
    } else if (!url) {
      out.append(*value);
    } else if (open < authority_end) {
      if (!is_dns_label(*value)) {
        throw std::invalid_argument("{" + std::string(name) +
                                    "} is in the target's host and must be one DNS label "
                                    "(letters, digits, '-'), not '" +
                                    std::string(value->substr(0, 64)) + "'");
      }
      out.append(*value);
    } else {
      // "." and ".." survive encoding and would climb the path once normalized (also when
      // they only form with the text around them: checked on the whole path at the end). An
      // empty value as a whole segment names the parent: "/orders/" or "//", which many
      // servers merge.
      const bool empty_segment =
          value->empty() && !out.empty() && out.back() == '/' &&
          (close + 1 == target.size() ||
           std::string_view("/?#").find(target[close + 1]) != std::string_view::npos);
      if (*value == "." || *value == ".." || empty_segment) {
        throw std::invalid_argument("{" + std::string(name) + "} = '" + std::string(*value) +
                                    "' cannot be placed in a URL path");
      }
      append_encoded(out, *value);
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
