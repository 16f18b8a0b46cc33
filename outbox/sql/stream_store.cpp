#include "outbox/sql/stream_store.hpp"

#include "outbox/errors.hpp"
#include "outbox/internal/event_row.hpp"
#include "outbox/lease.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/sql/lease_store.hpp"

namespace outbox::sql {
namespace {

constexpr const char* kSubscriptionColumns =
    "name, filter, publisher, target, status, cursor_xid, cursor_seq, error_count, last_error, "
    "delivered, ";

std::string status_literal(SubscriptionStatus s) {
  return "'" + std::string(to_string(s)) + "'";
}

std::string status_in(const std::vector<SubscriptionStatus>& statuses) {
  std::string out = "status IN (";
  for (std::size_t i = 0; i < statuses.size(); ++i) {
    out += (i ? ", " : "") + status_literal(statuses[i]);
  }
  return out + ")";
}

StreamPosition position_at(const Row& row, std::size_t i) {
  return {row.get_int(i), row.get_int(i + 1)};
}

}  // namespace

std::string subscription_table_name(const std::string& table) {
  return derived_name(table, "_subscription");
}

SqlStreamStore::SqlStreamStore(const Dialect& dialect, std::string table)
    : dialect_(dialect), table_(std::move(table)) {
  validate_table_name(table_);
  subscription_table_ = subscription_table_name(table_);
  lease_table_ = lease_table_name(table_);
  columns_ = internal::event_columns(dialect_, true);
}

void SqlStreamStore::after(Statement& s, StreamPosition after) const {
  s.sql("stream_seq > ").param(after.seq);
}

std::vector<StreamEvent> SqlStreamStore::read(Connection& conn, StreamPosition from, int limit) {
  auto s = statement();
  s.sql("SELECT " + columns_ + ", " + position_columns() + " FROM " + table_ + " WHERE ");
  after(s, from);
  s.sql(readable() + " ORDER BY " + order(false) + " LIMIT ").param(std::int64_t{limit});
  const auto rows = s.query(conn);
  std::vector<StreamEvent> out;
  out.reserve(rows.size());
  for (const auto& row : rows) {
    out.push_back({position_at(row, row.size() - 2), internal::event_from_row(row)});
  }
  return out;
}

StreamPosition SqlStreamStore::head(Connection& conn) {
  auto s = statement();
  s.sql("SELECT " + position_columns() + " FROM " + table_ + " WHERE ");
  after(s, {});
  s.sql(readable() + " ORDER BY " + order(true) + " LIMIT 1");
  const auto rows = s.query(conn);
  return rows.empty() ? StreamPosition{} : position_at(rows[0], 0);
}

StreamPosition SqlStreamStore::position_before(Connection& conn, Timestamp t) {
  auto s = statement();
  s.sql("SELECT " + position_columns() + " FROM " + table_ + " WHERE ");
  after(s, {});
  s.sql(readable() + " AND created_at >= ").at(t).sql(" ORDER BY " + order(false) + " LIMIT 1");
  const auto rows = s.query(conn);
  return rows.empty() ? head(conn) : before(position_at(rows[0], 0));
}

StreamLag SqlStreamStore::lag(Connection& conn, StreamPosition from) {
  auto s = statement();
  s.sql("SELECT COUNT(*), " + dialect_.micros("MIN(created_at)") + " FROM " + table_ + " WHERE ");
  after(s, from);
  s.sql(readable());
  const auto rows = s.query(conn);
  StreamLag lag;
  if (!rows.empty()) {
    lag.events = rows[0].get_int(0);
    if (auto us = rows[0].get_optional_int(1)) {
      lag.oldest_unread = from_micros(*us);
    }
  }
  return lag;
}

std::optional<StreamHoldback> SqlStreamStore::holdback(Connection&) {
  return std::nullopt;
}

void SqlStreamStore::check(Connection&) {}

bool SqlStreamStore::create(Connection& conn, const SubscriptionSpec& spec, StreamPosition start) {
  validate_subscription_name(spec.name);
  if (spec.publisher.empty()) {
    throw std::invalid_argument("subscription " + spec.name + ": a publisher is required");
  }
  spec.filter.validate();
  const std::string filter = spec.filter.to_json();
  auto s = statement();
  const auto now = Clock::system()->now();
  s.sql("INTO " + subscription_table_ +
        " (name, filter, publisher, target, status, cursor_xid, cursor_seq, error_count, "
        "delivered, created_at, updated_at) VALUES (")
      .param(TextRef{spec.name})
      .sql(", ")
      .param(TextRef{filter})
      .sql(", ")
      .param(TextRef{spec.publisher})
      .sql(", ")
      .param(TextRef{spec.target})
      .sql(", " + status_literal(SubscriptionStatus::Active) + ", ")
      .param(start.xid)
      .sql(", ")
      .param(start.seq)
      .sql(", 0, 0, ")
      .now(now)
      .sql(", ")
      .now(now)
      .sql(")");
  s.set_text(dialect_.insert_ignore(s.text(), "name"));
  return s.execute(conn) == 1;
}

bool SqlStreamStore::update_spec(Connection& conn, const SubscriptionSpec& spec) {
  spec.filter.validate();
  const std::string filter = spec.filter.to_json();
  auto s = statement();
  s.sql("UPDATE " + subscription_table_ + " SET filter = ")
      .param(TextRef{filter})
      .sql(", publisher = ")
      .param(TextRef{spec.publisher})
      .sql(", target = ")
      .param(TextRef{spec.target})
      .sql(", updated_at = ")
      .now(Clock::system()->now())
      .sql(" WHERE name = ")
      .param(TextRef{spec.name});
  return s.execute(conn) == 1;
}

bool SqlStreamStore::remove(Connection& conn, std::string_view name) {
  auto s = statement();
  s.sql("DELETE FROM " + subscription_table_ + " WHERE name = ").param(TextRef{name});
  return s.execute(conn) == 1;
}

std::vector<SubscriptionState> SqlStreamStore::select(Connection& conn, std::string_view name) {
  auto s = statement();
  s.sql(std::string("SELECT ") + kSubscriptionColumns + dialect_.micros("created_at") + ", " +
        dialect_.micros("updated_at") + ", " + dialect_.micros("last_delivered_at") + ", " +
        dialect_.micros("released_at") + " FROM " + subscription_table_);
  if (!name.empty()) {
    s.sql(" WHERE name = ").param(TextRef{name});
  }
  s.sql(" ORDER BY name");
  std::vector<SubscriptionState> out;
  for (const auto& row : s.query(conn)) {
    SubscriptionState st;
    st.spec.name = row.get_text(0);
    try {
      st.spec.filter = SubscriptionFilter::from_json(row.get_text(1));
    } catch (const std::invalid_argument& e) {
      st.problem = std::string("filter column: ") + e.what();
    }
    st.spec.publisher = row.get_text(2);
    st.spec.target = row.get_text(3);
    try {
      st.status = parse_subscription_status(row.get_text(4));
    } catch (const std::invalid_argument& e) {
      throw StoreError("subscription " + st.spec.name + ": " + e.what());
    }
    st.cursor = position_at(row, 5);
    st.error_count = static_cast<int>(row.get_int(7));
    st.last_error = row.get_optional_text(8);
    st.delivered = row.get_int(9);
    st.created_at = from_micros(row.get_int(10));
    st.updated_at = from_micros(row.get_int(11));
    if (auto us = row.get_optional_int(12)) {
      st.last_delivered_at = from_micros(*us);
    }
    if (auto us = row.get_optional_int(13)) {
      st.released_at = from_micros(*us);
    }
    out.push_back(std::move(st));
  }
  return out;
}

std::optional<SubscriptionState> SqlStreamStore::find(Connection& conn, std::string_view name) {
  validate_subscription_name(name);
  auto rows = select(conn, name);
  if (rows.empty()) {
    return std::nullopt;
  }
  return std::move(rows.front());
}

std::vector<SubscriptionState> SqlStreamStore::list(Connection& conn) {
  return select(conn, {});
}

Statement SqlStreamStore::move_cursor(StreamPosition to, Timestamp now) const {
  auto s = statement();
  s.sql("UPDATE " + subscription_table_ + " SET cursor_xid = ")
      .param(to.xid)
      .sql(", cursor_seq = ")
      .param(to.seq)
      .sql(", error_count = 0, updated_at = ")
      .now(now);
  return s;
}

void SqlStreamStore::fence(Statement& s, const LeaseToken* token) const {
  if (token != nullptr) {
    append_fence(s, dialect_, lease_table_, *token);
  }
}

bool SqlStreamStore::advance(Connection& conn, std::string_view name, StreamPosition from,
                             StreamPosition to, std::int64_t delivered, const LeaseToken* token) {
  const auto now = Clock::system()->now();
  auto s = move_cursor(to, now);
  s.sql(", delivered = delivered + ").param(delivered);
  if (delivered > 0) {
    s.sql(", last_delivered_at = ").now(now);
  }
  s.sql(" WHERE name = ")
      .param(TextRef{name})
      .sql(" AND cursor_xid = ")
      .param(from.xid)
      .sql(" AND cursor_seq = ")
      .param(from.seq);
  fence(s, token);
  return s.execute(conn) == 1;
}

std::optional<SubscriptionStatus> SqlStreamStore::record_error(Connection& conn,
                                                               std::string_view name,
                                                               std::string_view error,
                                                               int max_errors,
                                                               const LeaseToken* token) {
  const std::string text = truncate_error(error);
  auto s = statement();
  // status first: MariaDB evaluates SET left to right with the values already set.
  // Only an ACTIVE subscription fails: a PAUSED one stays paused (an operator's choice).
  s.sql("UPDATE " + subscription_table_ +
        " SET status = CASE WHEN status = " + status_literal(SubscriptionStatus::Active) + " AND ")
      .param(std::int64_t{max_errors})
      .sql(" > 0 AND error_count + 1 >= ")
      .param(std::int64_t{max_errors})
      .sql(" THEN " + status_literal(SubscriptionStatus::Failed) +
           " ELSE status END, error_count = error_count + 1, last_error = ")
      .param(TextRef{text})
      .sql(", updated_at = ")
      .now(Clock::system()->now())
      .sql(" WHERE name = ")
      .param(TextRef{name});
  fence(s, token);
  if (s.execute(conn) != 1) {
    return std::nullopt;
  }
  const auto now = find(conn, name);
  return now ? std::optional(now->status) : std::nullopt;
}

bool SqlStreamStore::set_status(Connection& conn, std::string_view name, SubscriptionStatus to,
                                std::vector<SubscriptionStatus> from) {
  if (from.empty()) {
    return false;
  }
  auto s = statement();
  s.sql("UPDATE " + subscription_table_ + " SET status = " + status_literal(to));
  if (to == SubscriptionStatus::Active) {
    s.sql(", error_count = 0, last_error = NULL, released_at = NULL");
  }
  s.sql(", updated_at = ")
      .now(Clock::system()->now())
      .sql(" WHERE name = ")
      .param(TextRef{name})
      .sql(" AND " + status_in(from));
  return s.execute(conn) == 1;
}

bool SqlStreamStore::rewind(Connection& conn, std::string_view name, StreamPosition to) {
  auto s = move_cursor(to, Clock::system()->now());
  s.sql(" WHERE name = ").param(TextRef{name});
  return s.execute(conn) == 1;
}

bool SqlStreamStore::release_retention(Connection& conn, std::string_view name,
                                       std::string_view reason) {
  const std::string text = truncate_error(reason);
  const auto now = Clock::system()->now();
  auto s = statement();
  s.sql("UPDATE " + subscription_table_ +
        " SET status = " + status_literal(SubscriptionStatus::Failed) + ", last_error = ")
      .param(TextRef{text})
      .sql(", released_at = ")
      .now(now)
      .sql(", updated_at = ")
      .now(now)
      .sql(" WHERE name = ")
      .param(TextRef{name});
  return s.execute(conn) == 1;
}

std::optional<StreamPosition> SqlStreamStore::retained_from(Connection& conn) {
  auto s = statement();
  s.sql("SELECT cursor_xid, cursor_seq FROM " + subscription_table_ +
        " WHERE released_at IS NULL ORDER BY cursor_xid, cursor_seq LIMIT 1");
  const auto rows = s.query(conn);
  if (rows.empty()) {
    return std::nullopt;
  }
  return position_at(rows[0], 0);
}

}  // namespace outbox::sql
