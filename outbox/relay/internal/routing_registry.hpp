#pragma once
// The relay's listeners: each event to the first matching route's publisher.

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "outbox/listener.hpp"
#include "outbox/publisher.hpp"
#include "outbox/relay/config.hpp"
#include "outbox/trace_context.hpp"

namespace outbox::prometheus {
class PrometheusMetrics;
}

namespace outbox::relay::internal {

/// Routes each event to the first of `routes` that matches it, to that route's publisher (in
/// batches for publishers that take them); an event no route matches has no listener (the
/// dispatcher makes it DEAD as unroutable). Every publish is recorded in `metrics`. `publishers`
/// must hold every route's publisher (std::out_of_range otherwise). With `spans`, each publish
/// runs in a span of its own whose context is forwarded (see PublishSpanHook).
std::shared_ptr<ListenerRegistry> make_routing_registry(
    const std::vector<RouteConfig>& routes, const std::vector<PublisherConfig>& configs,
    const std::map<std::string, std::shared_ptr<Publisher>>& publishers,
    std::shared_ptr<prometheus::PrometheusMetrics> metrics,
    std::shared_ptr<PublishSpanHook> spans = {});

}  // namespace outbox::relay::internal
