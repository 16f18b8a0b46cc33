#include "outbox/dead_event_manager.hpp"

#include <stdexcept>

#include "outbox/log.hpp"
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
                                                 int limit) {
  try {
    auto conn = provider_->acquire();
    return store_->query_dead(*conn, event_type, aggregate_type, limit);
  } catch (const std::exception& e) {
    log(LogLevel::Error, std::string("DeadEventManager::query failed: ") + e.what());
    return {};
  }
}

bool DeadEventManager::replay(std::string_view event_id) {
  try {
    auto conn = provider_->acquire();
    return store_->replay_dead(*conn, event_id, clock_->now()) > 0;
  } catch (const std::exception& e) {
    log(LogLevel::Error, std::string("DeadEventManager::replay failed: ") + e.what());
    return false;
  }
}

int DeadEventManager::replay_all(std::optional<std::string_view> event_type,
                                 std::optional<std::string_view> aggregate_type, int batch_size) {
  if (batch_size < 1) {
    throw std::invalid_argument("DeadEventManager::replay_all: batch_size must be >= 1");
  }
  int total = 0;
  try {
    auto conn = provider_->acquire();
    for (;;) {
      auto batch = store_->query_dead(*conn, event_type, aggregate_type, batch_size);
      int replayed = 0;
      for (const auto& e : batch) {
        replayed += store_->replay_dead(*conn, e.event_id, clock_->now());
      }
      total += replayed;
      if (static_cast<int>(batch.size()) < batch_size || replayed == 0) {
        break;
      }
    }
  } catch (const std::exception& e) {
    log(LogLevel::Error, std::string("DeadEventManager::replay_all failed: ") + e.what());
  }
  return total;
}

int DeadEventManager::count(std::optional<std::string_view> event_type) {
  try {
    auto conn = provider_->acquire();
    return store_->count_dead(*conn, event_type);
  } catch (const std::exception& e) {
    log(LogLevel::Error, std::string("DeadEventManager::count failed: ") + e.what());
    return 0;
  }
}

}  // namespace outbox
