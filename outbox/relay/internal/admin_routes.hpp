#pragma once
// The admin endpoints without the socket: for the fuzzer and tests that need no port.

#include <string>

#include "outbox/relay/admin_server.hpp"
#include "outbox/relay/internal/http_server.hpp"

namespace outbox::relay {

/// What an AdminServer with `token` and `handlers` answers to `request`: its screening (routes,
/// methods, the token), then the handler. Handler exceptions propagate as they would to the
/// server (which answers 500).
internal::HttpResponse admin_response(const std::string& token, AdminHandlers handlers,
                                      const internal::HttpRequest& request);

}  // namespace outbox::relay
