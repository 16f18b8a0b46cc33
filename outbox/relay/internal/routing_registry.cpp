#include "outbox/relay/internal/routing_registry.hpp"

#include <algorithm>
#include <chrono>
#include <span>

#include "outbox/delivery_result.hpp"
#include "outbox/prometheus/metrics.hpp"
#include "outbox/relay/router.hpp"

namespace outbox::relay::internal {
namespace {

// One publish result as the dispatcher's delivery result.
DeliveryResult to_delivery(const PublishResult& result) {
  switch (result.kind) {
    case PublishResult::Kind::Ok:
      return DeliveryResult::delivered();
    case PublishResult::Kind::Retriable:
      if (result.retry_after) {
        return DeliveryResult::retry_later(*result.retry_after, result.reason);
      }
      return DeliveryResult::failed(result.reason);
    case PublishResult::Kind::Permanent:
      return DeliveryResult::permanent(result.reason);
  }
  return DeliveryResult::failed(result.reason);
}

// Publishers that take many events per call get the dispatcher's batches; a webhook publisher
// posts one event per call, so it gets single events from many workers in parallel instead.
bool takes_batches(const PublisherConfig& p) {
  return p.type != PublisherConfig::Type::Http || p.batch;
}

// Routes each event to the first matching route's publisher; no match → unroutable → DEAD.
class RoutingRegistry final : public ListenerRegistry {
 public:
  RoutingRegistry(const std::vector<RouteConfig>& routes,
                  const std::vector<PublisherConfig>& configs,
                  const std::map<std::string, std::shared_ptr<Publisher>>& publishers,
                  std::shared_ptr<prometheus::PrometheusMetrics> metrics,
                  std::shared_ptr<PublishSpanHook> spans)
      : router_(routes) {
    for (const auto& route : routes) {
      auto publish = [publisher = publishers.at(route.publisher), metrics, name = route.publisher,
                      target = route.target, spans](std::span<const EventEnvelope* const> events) {
        std::vector<PublishRequest> requests;
        requests.reserve(events.size());
        // An event whose target cannot be built is refused alone; the others still go, but for
        // the later events of its message group.
        std::vector<DeliveryResult> results(events.size());
        std::vector<std::size_t> sent;
        sent.reserve(events.size());
        GroupStops stops;
        std::vector<EventEnvelope> traced;  // events forwarded with their span's context
        traced.reserve(spans ? events.size() : 0);
        for (std::size_t i = 0; i < events.size(); ++i) {
          if (stops.stopped(*events[i])) {
            results[i] = to_delivery(GroupStops::not_sent(*events[i], "relay"));
            continue;
          }
          std::string expanded;
          try {
            expanded = expand_target(target, *events[i]);
          } catch (const std::invalid_argument& e) {
            results[i] = DeliveryResult::permanent(std::string("target: ") + e.what());
            stops.fail(*events[i]);
            continue;
          }
          const EventEnvelope* forwarded = events[i];
          if (spans) {
            if (auto child = start_publish_span(*spans, *events[i])) {
              traced.push_back(std::move(*child));
              forwarded = &traced.back();
            }
          }
          requests.push_back({forwarded, std::move(expanded)});
          sent.push_back(i);
        }
        if (requests.empty()) {
          return results;
        }
        const auto start = std::chrono::steady_clock::now();
        std::vector<PublishResult> published;
        try {
          published = publisher->publish(requests);
        } catch (const std::exception& e) {
          if (spans) {  // every span started ends, whatever the publisher did
            for (std::size_t k : sent) {
              try {
                spans->end(*events[k], false, e.what());
              } catch (...) {
                // A failing tracer never fails a publish.
              }
            }
          }
          throw;
        }
        const auto elapsed = std::chrono::steady_clock::now() - start;
        for (std::size_t k = 0; k < sent.size(); ++k) {
          const auto result = k < published.size()
                                  ? published[k]
                                  : PublishResult::retriable("publisher returned no result");
          metrics->record_publish(name, result.kind, elapsed);
          results[sent[k]] = to_delivery(result);
          if (spans) {
            try {
              spans->end(*events[sent[k]], result.kind == PublishResult::Kind::Ok, result.reason);
            } catch (...) {
              // A failing tracer never fails a publish.
            }
          }
        }
        return results;
      };
      singles_.push_back(std::make_shared<const ResultListener>([publish](const EventEnvelope& e) {
        const EventEnvelope* one = &e;
        return publish(std::span(&one, 1)).at(0);
      }));
      const bool batches = takes_batches(
          *std::find_if(configs.begin(), configs.end(),
                        [&](const PublisherConfig& p) { return p.name == route.publisher; }));
      batches_.push_back(batches ? std::make_shared<const BatchEventListener>(publish) : nullptr);
    }
  }

  // Every routed event has a result listener; none matches an unrouted one (→ unroutable).
  std::shared_ptr<const EventListener> listener_for(std::string_view,
                                                    std::string_view) const override {
    return nullptr;
  }
  std::shared_ptr<const ResultListener> result_listener_for(
      std::string_view aggregate_type, std::string_view event_type) const override {
    const auto index = router_.match(aggregate_type, event_type);
    return index ? singles_[*index] : nullptr;
  }
  std::shared_ptr<const BatchEventListener> batch_listener_for(
      std::string_view aggregate_type, std::string_view event_type) const override {
    const auto index = router_.match(aggregate_type, event_type);
    return index ? batches_[*index] : nullptr;
  }

 private:
  Router router_;
  // One entry per route, in the same order.
  std::vector<std::shared_ptr<const ResultListener>> singles_;
  std::vector<std::shared_ptr<const BatchEventListener>> batches_;
};

}  // namespace

std::shared_ptr<ListenerRegistry> make_routing_registry(
    const std::vector<RouteConfig>& routes, const std::vector<PublisherConfig>& configs,
    const std::map<std::string, std::shared_ptr<Publisher>>& publishers,
    std::shared_ptr<prometheus::PrometheusMetrics> metrics,
    std::shared_ptr<PublishSpanHook> spans) {
  return std::make_shared<RoutingRegistry>(routes, configs, publishers, std::move(metrics),
                                           std::move(spans));
}

}  // namespace outbox::relay::internal
