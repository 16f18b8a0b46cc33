#pragma once
// The dashboard page (outbox/relay/dashboard/index.html), built into the binary.

#include <string_view>

namespace outbox::relay::internal {

/// The page's HTML, as served at / by the admin server.
std::string_view dashboard_page();

}  // namespace outbox::relay::internal
