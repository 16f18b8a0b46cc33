// The admin server's requests as a client sends them: the head as the server parses it (request
// line, headers, Content-Length), then routing, query strings, percent-decoding and the token.
// A head is refused (400, 431, 501) or routed; an action (replay, a subscription's or a group's)
// runs only for a POST with the right bearer token; error bodies are valid UTF-8 JSON text.

#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz/fuzz_input.hpp"
#include "outbox/relay/internal/admin_routes.hpp"

namespace {

constexpr const char* kToken = "fuzz-token-123";

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  namespace internal = outbox::relay::internal;
  const std::string input(reinterpret_cast<const char*>(data), size);
  const auto blank = input.find("\r\n\r\n");
  const std::string head = input.substr(0, blank);
  internal::HttpRequest request;
  std::size_t content_length = 0;
  if (auto refusal =
          internal::parse_request_head(head, internal::HttpLimits{}, request, content_length)) {
    if (refusal->status != 400 && refusal->status != 431 && refusal->status != 501) {
      std::abort();
    }
    return 0;
  }
  request.body = blank == std::string::npos ? "" : input.substr(blank + 4);
  bool acted = false;
  outbox::relay::AdminHandlers handlers;
  handlers.check_ready = [] {};
  handlers.metrics = [] { return std::string("outbox_up 1\n"); };
  handlers.status_json = [] { return std::string("{}"); };
  handlers.dead_json = [](const std::string&, std::optional<std::string>,
                          std::optional<std::string>, int limit) {
    if (limit < 1 || limit > 10000) {
      std::abort();  // the route checks the limit before asking
    }
    return std::string("[]");
  };
  handlers.replay = [&](const std::string&, const std::string&) {
    acted = true;
    return 1;
  };
  handlers.dead_groups_json = [](const std::string&, int limit, int top) {
    if (limit < 1 || limit > 100000 || top < 1 || top > 10000) {
      std::abort();  // the route checks the limit before asking
    }
    return std::string("{}");
  };
  handlers.dead_group_action = [&](const std::string&, const std::string&,
                                   const std::string&) -> std::optional<std::string> {
    acted = true;
    return "{}";
  };
  handlers.subscriptions_json = [](const std::string& name) -> std::optional<std::string> {
    return name.empty() ? "{}" : std::optional<std::string>();
  };
  handlers.subscription_action = [&](const std::string&, const std::string&,
                                     std::optional<std::string>) -> std::optional<std::string> {
    acted = true;
    return "{}";
  };
  handlers.groups_json = [](const std::string&, const std::string&) {
    return std::optional<std::string>("{}");
  };
  handlers.group_action = [&](const std::string&, const std::string&,
                              const std::string&) -> std::optional<std::string> {
    acted = true;
    return "{}";
  };
  const auto response = outbox::relay::admin_response(kToken, handlers, request);
  if (acted && (request.method != "POST" ||
                request.header("Authorization") != std::string("Bearer ") + kToken)) {
    std::abort();  // an action without the token, or by another method
  }
  if (response.content_type == "application/json" && !outbox::fuzz::valid_utf8(response.body)) {
    std::abort();
  }
  return 0;
}
