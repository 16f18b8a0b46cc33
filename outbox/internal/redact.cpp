#include "outbox/internal/redact.hpp"

#include <algorithm>
#include <cctype>
#include <vector>

namespace outbox::internal {
namespace {

struct Span {
  std::size_t begin, end;
};

// Where the secrets are in `url`: the userinfo password and every password=… value.
std::vector<Span> secret_spans(std::string_view url) {
  std::vector<Span> spans;
  const auto scheme = url.find("://");
  if (scheme != std::string_view::npos) {
    const std::size_t start = scheme + 3;
    // The user info ends at the last '@': a password may hold an unencoded '/', '?' or '#'
    // (drivers then split the URL elsewhere, but the secret is still all of it). An '@' later
    // in the URL only makes more of it redacted.
    const auto at = url.substr(start).rfind('@');
    if (at != std::string_view::npos) {
      const auto colon = url.substr(start, at).find(':');
      if (colon != std::string_view::npos) {
        spans.push_back({start + colon + 1, start + at});
      }
    }
  }
  // password=… in a query string (&-separated) or a conninfo (space-separated, maybe quoted).
  for (std::size_t pos = url.find("password="); pos != std::string_view::npos;
       pos = url.find("password=", pos + 1)) {
    if (pos > 0 && std::isalnum(static_cast<unsigned char>(url[pos - 1])) != 0) {
      continue;  // e.g. "sslpassword=" is someone else's key; its value is still secret below
    }
    std::size_t begin = pos + 9, end = begin;
    if (begin < url.size() && url[begin] == '\'') {
      end = begin + 1;
      while (end < url.size() && url[end] != '\'') {
        end += url[end] == '\\' ? 2 : 1;
      }
      end = std::min(end + 1, url.size());
    } else {
      while (end < url.size() && url[end] != '&' && url[end] != ' ' && url[end] != '#') {
        ++end;
      }
    }
    spans.push_back({begin, end});
  }
  return spans;
}

std::string percent_decode(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '%' && i + 2 < text.size() &&
        std::isxdigit(static_cast<unsigned char>(text[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(text[i + 2]))) {
      out.push_back(static_cast<char>(std::stoi(std::string(text.substr(i + 1, 2)), nullptr, 16)));
      i += 2;
    } else {
      out.push_back(text[i]);
    }
  }
  return out;
}

void replace_all(std::string& text, std::string_view what, std::string_view with) {
  if (what.empty()) {
    return;
  }
  for (auto pos = text.find(what); pos != std::string::npos;
       pos = text.find(what, pos + with.size())) {
    text.replace(pos, what.size(), with);
  }
}

}  // namespace

std::string redact_url(std::string_view url) {
  std::string out(url);
  auto spans = secret_spans(url);
  // Back to front, so earlier offsets stay valid.
  std::sort(spans.begin(), spans.end(), [](Span a, Span b) { return a.begin > b.begin; });
  for (const auto& s : spans) {
    out.replace(s.begin, s.end - s.begin, "***");
  }
  return out;
}

std::string redact_secrets(std::string message, std::string_view url) {
  replace_all(message, url, redact_url(url));
  for (const auto& s : secret_spans(url)) {
    const auto secret = url.substr(s.begin, s.end - s.begin);
    // The whole secret, decoded, and the pieces a driver that split the URL elsewhere may quote.
    std::vector<std::string> forms = {std::string(secret), percent_decode(secret)};
    std::size_t piece_start = 0;
    for (std::size_t i = 0; i <= secret.size(); ++i) {
      if (i == secret.size() ||
          std::string_view("/:@?#").find(secret[i]) != std::string_view::npos) {
        forms.emplace_back(secret.substr(piece_start, i - piece_start));
        piece_start = i + 1;
      }
    }
    std::sort(forms.begin(), forms.end(),
              [](const std::string& a, const std::string& b) { return a.size() > b.size(); });
    for (const auto& form : forms) {
      if (form.size() >= 3) {  // shorter would mangle the message; the URL was redacted above
        replace_all(message, form, "***");
      }
    }
  }
  return message;
}

}  // namespace outbox::internal
