#include "outbox/dead_event_manager.hpp"

#include <algorithm>
#include <limits>
#include <map>
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
    int limit, const Progress& progress) {
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
  const int total = static_cast<int>(ids.size());
  for (const auto& id : ids) {
    if (progress && !progress(result.replayed + result.skipped, total)) {
      result.stopped = true;
      break;
    }
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

namespace {

// When a DEAD row went DEAD (done_at; rows another client made DEAD may lack it).
Timestamp went_dead(const OutboxEvent& e) {
  return e.done_at.value_or(e.created_at);
}

// Reads up to `limit` DEAD rows without payloads; `more` when the table had more.
std::vector<OutboxEvent> dead_rows(OutboxStore& store, sql::Connection& conn, int limit,
                                   bool& more) {
  if (limit < 1) {
    throw std::invalid_argument("DeadEventManager: limit must be >= 1");
  }
  const int fetch = limit < std::numeric_limits<int>::max() ? limit + 1 : limit;
  auto rows = store.query_dead(conn, std::nullopt, std::nullopt, fetch, false);
  more = rows.size() > static_cast<std::size_t>(limit);
  if (more) {
    rows.resize(static_cast<std::size_t>(limit));
  }
  return rows;
}

}  // namespace

std::vector<DeadEventManager::Group> DeadEventManager::groups(int limit, bool* more) {
  auto conn = provider_->acquire();
  bool capped = false;
  const auto rows = dead_rows(*store_, *conn, limit, capped);
  if (more) {
    *more = capped;
  }
  std::map<std::string, Group> by_id;
  for (const auto& row : rows) {
    auto fp = fingerprint_failure(row.event_type, row.last_error.value_or(""));
    const auto at = went_dead(row);
    auto [it, fresh] = by_id.try_emplace(fp.id);
    Group& g = it->second;
    if (fresh) {
      g.fingerprint = std::move(fp);
      g.first_seen = at;
      g.last_seen = at;
    }
    ++g.count;
    g.first_seen = std::min(g.first_seen, at);
    if (at >= g.last_seen || g.sample_event_id.empty()) {
      g.last_seen = std::max(g.last_seen, at);
      g.sample_event_id = row.event_id;
      g.sample_error = row.last_error.value_or("");
    }
  }
  std::vector<Group> out;
  out.reserve(by_id.size());
  for (auto& [id, g] : by_id) {
    out.push_back(std::move(g));
  }
  std::stable_sort(out.begin(), out.end(), [](const Group& a, const Group& b) {
    return a.count != b.count ? a.count > b.count : a.last_seen > b.last_seen;
  });
  return out;
}

std::vector<std::pair<std::string, std::optional<std::string>>> DeadEventManager::members(
    sql::Connection& conn, std::string_view id, int limit, bool& more) {
  std::vector<std::pair<std::string, std::optional<std::string>>> out;
  for (auto& row : dead_rows(*store_, conn, limit, more)) {
    if (fingerprint_failure(row.event_type, row.last_error.value_or("")).id == id) {
      out.emplace_back(std::move(row.event_id), std::move(row.last_error));
    }
  }
  return out;
}

DeadEventManager::GroupActionResult DeadEventManager::act_on_group(
    std::string_view id, int limit, const Progress& progress,
    const std::function<bool(sql::Connection&, const std::string&,
                             const std::optional<std::string>&)>& action) {
  auto conn = provider_->acquire();
  GroupActionResult result;
  // Taken once, in insert order: a message group's events come back head first. Each acts
  // only while the row still holds the error it was listed with: one replayed by someone else
  // that failed again for another reason belongs to another group now.
  const auto rows = members(*conn, id, limit, result.more);
  const int total = static_cast<int>(rows.size());
  for (const auto& [event_id, last_error] : rows) {
    if (progress && !progress(result.changed + result.skipped, total)) {
      result.stopped = true;
      break;
    }
    ++(action(*conn, event_id, last_error) ? result.changed : result.skipped);
  }
  return result;
}

DeadEventManager::GroupActionResult DeadEventManager::replay_group(std::string_view id, int limit,
                                                                   const Progress& progress) {
  return act_on_group(
      id, limit, progress,
      [this](sql::Connection& conn, const std::string& e, const std::optional<std::string>& error) {
        return store_->replay_dead_if(conn, e, error, clock_->now()) > 0;
      });
}

DeadEventManager::GroupActionResult DeadEventManager::discard_group(std::string_view id, int limit,
                                                                    const Progress& progress) {
  return act_on_group(
      id, limit, progress,
      [this](sql::Connection& conn, const std::string& e, const std::optional<std::string>& error) {
        return store_->discard_dead(conn, e, error) > 0;
      });
}

}  // namespace outbox
