#include "outbox/sql/dialect.hpp"

#include <algorithm>
#include <bit>

#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox::sql {
namespace {

// A text[] literal: {"a","b"} with quotes and backslashes escaped.
std::string text_array(const std::vector<std::string>& items, std::size_t from, std::size_t n) {
  std::string out = "{";
  for (std::size_t i = from; i < from + n; ++i) {
    if (i > from) {
      out.push_back(',');
    }
    out.push_back('"');
    for (char c : items[i]) {
      if (c == '"' || c == '\\') {
        out.push_back('\\');
      }
      out.push_back(c);
    }
    out.push_back('"');
  }
  out.push_back('}');
  return out;
}

}  // namespace

std::string status_sql(EventStatus status) {
  return std::to_string(static_cast<int>(status));
}

std::string status_list(std::initializer_list<EventStatus> statuses) {
  std::string out = "(";
  for (const auto status : statuses) {
    if (out.size() > 1) {
      out += ", ";
    }
    out += status_sql(status);
  }
  return out + ")";
}

std::string pending_statuses() {
  return "status IN " + status_list({EventStatus::New, EventStatus::Retry});
}

std::string terminal_statuses() {
  return "status IN " + status_list({EventStatus::Done, EventStatus::Dead});
}

std::string Dialect::pending_filter() const {
  return pending_statuses() + " AND message_group IS NULL";
}

std::string Dialect::group_pending_filter() const {
  return pending_statuses() + " AND message_group IS NOT NULL";
}

std::string Dialect::retry_dead_filter() const {
  return "status IN (" + status_sql(EventStatus::Retry) + ", " + status_sql(EventStatus::Dead) +
         ")";
}

std::string Dialect::terminal_filter() const {
  return terminal_statuses();
}

Statement& Statement::param(Value value, std::string_view type) {
  params_.push_back(std::move(value));
  const std::string marker = dialect_.placeholder(static_cast<int>(params_.size()));
  sql_ += type.empty() ? marker : dialect_.typed(marker, type);
  return *this;
}

Statement& Statement::at(Timestamp t) {
  params_.emplace_back(to_micros(t));
  sql_ += dialect_.instant(dialect_.placeholder(static_cast<int>(params_.size())));
  return *this;
}

Statement& Statement::now(Timestamp now) {
  if (database_clock_) {
    if (auto server = dialect_.server_now(); !server.empty()) {
      sql_ += server;
      return *this;
    }
  }
  return at(now);
}

Statement& Statement::micros(std::int64_t micros) {
  params_.emplace_back(micros);
  sql_ += dialect_.micros_interval(dialect_.placeholder(static_cast<int>(params_.size())));
  return *this;
}

Statement& Statement::ids_in(std::string_view column, const std::vector<std::string>& ids,
                             std::size_t from, std::size_t n) {
  sql_ += ' ';
  sql_ += column;
  if (dialect_.id_array()) {
    sql_ += " = ANY(";
    param(text_array(ids, from, n), "text[]");
    sql_ += ')';
    return *this;
  }
  sql_ += " IN (";
  // Padded to a power of two up to 64 and to a multiple of 64 above, the last id repeated (an IN
  // list is a set): the texts then repeat, so statements stay prepared. A text per list length
  // had every grouped claim on SQLite prepare a statement of several kilobytes again.
  const std::size_t padded = n == 0 ? 0 : n <= 64 ? std::bit_ceil(n) : (n + 63) / 64 * 64;
  for (std::size_t k = 0; k < padded; ++k) {
    if (k > 0) {
      sql_ += ',';
    }
    param(TextRef{ids[from + std::min(k, n - 1)]});
  }
  sql_ += ')';
  return *this;
}

Statement& Statement::owned_by(std::string_view owner) {
  if (!owner.empty()) {
    sql_ += " AND locked_by = ";
    param(TextRef{owner});
  }
  return *this;
}

std::int64_t Statement::execute(Connection& conn) const {
  return conn.execute(sql_, params_);
}

std::vector<Row> Statement::query(Connection& conn) const {
  return conn.query(sql_, params_);
}

}  // namespace outbox::sql
