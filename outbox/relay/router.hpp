#pragma once
// Routing of events to publishers: glob matching on event and aggregate type, target templates.

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/envelope.hpp"
#include "outbox/glob.hpp"
#include "outbox/relay/config.hpp"

namespace outbox::relay {

/// Why `target` is not a valid template (an unknown or unterminated {placeholder}), or nullopt.
/// Placeholders: {event_type}, {aggregate_type}, {aggregate_id}, {tenant_id}.
std::optional<std::string> template_problem(std::string_view target);

/// `target` with its placeholders replaced from `event` (absent ids become empty). In http(s)
/// targets values are percent-encoded (/ ? # % too) so they cannot leave their component; a
/// value in the host must be one DNS label. Throws std::invalid_argument for a value that
/// cannot be placed (then the event is refused, never sent elsewhere).
std::string expand_target(std::string_view target, const EventEnvelope& event);

/// Ordered routes; the first match wins. Immutable, so thread-safe.
class Router {
 public:
  explicit Router(std::vector<RouteConfig> routes) : routes_(std::move(routes)) {}
  /// Index (in configuration order) of the first route matching both types, or nullopt (the
  /// event is then unroutable → DEAD).
  std::optional<std::size_t> match(std::string_view aggregate_type,
                                   std::string_view event_type) const;
  const std::vector<RouteConfig>& routes() const noexcept { return routes_; }

 private:
  std::vector<RouteConfig> routes_;
};

}  // namespace outbox::relay
