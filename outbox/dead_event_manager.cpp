#include "outbox/dead_event_manager.hpp"

#include <limits>
#include <stdexcept>
#include <string>

#include "outbox/sql/connection.hpp"

namespace outbox {

DeadEventManager::DeadEventManager(std::shared_ptr<sql::ConnectionProvider> provider,
                                   std::shared_ptr<OutboxStore> store, std::shared_ptr<Clock> clock)
    : provider_(std::move(provider)), store_(std::move(store)), clock_(std::move(clock)) {
  if (!provider_ || !store_) {
    throw std::invalid_argument("DeadEventManager: provider and store are required");
  }
  if (!clock_) {
    clock_ = Clock::system();
  }
}

std::vector<OutboxEvent> DeadEventManager::query(std::optional<std::string_view> event_type,
                                                 std::optional<std::string_view> aggregate_type,
                                                 int limit, bool with_payloads) {
  auto conn = provider_->acquire();
  return store_->query_dead(*conn, event_type, aggregate_type, limit, with_payloads);
}

bool DeadEventManager::replay(std::string_view event_id) {
  auto conn = provider_->acquire();
  return store_->replay_dead(*conn, event_id, clock_->now()) > 0;
}

DeadEventManager::ReplayAllResult DeadEventManager::replay_all(
    std::optional<std::string_view> event_type, std::optional<std::string_view> aggregate_type,
    int limit) {
  if (limit < 1) {
    throw std::invalid_argument("DeadEventManager::replay_all: limit must be >= 1");
  }
  auto conn = provider_->acquire();
  // The list is taken once: re-querying after each pass would find the events a running relay
  // has just sent DEAD again and replay them over and over.
  std::vector<std::string> ids;
  {
    const int fetch = limit < std::numeric_limits<int>::max() ? limit + 1 : limit;
    const auto rows = store_->query_dead(*conn, event_type, aggregate_type, fetch, false);
    ids.reserve(rows.size());
    for (const auto& row : rows) {
      ids.push_back(row.event_id);
    }
  }
  ReplayAllResult result;
  if (ids.size() > static_cast<std::size_t>(limit)) {
    ids.resize(static_cast<std::size_t>(limit));
    result.more = true;
  }
  for (const auto& id : ids) {
    if (store_->replay_dead(*conn, id, clock_->now()) > 0) {
      ++result.replayed;
    } else {
      ++result.skipped;
    }
  }
  return result;
}

int DeadEventManager::count(std::optional<std::string_view> event_type) {
  auto conn = provider_->acquire();
  return store_->count_dead(*conn, event_type);
}

}  // namespace outbox
