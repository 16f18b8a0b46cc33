#include "outbox/sql/lease_store.hpp"

#include <stdexcept>

#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox::sql {
namespace {

std::int64_t ttl_micros(std::chrono::milliseconds ttl) {
  if (ttl.count() <= 0 || ttl > std::chrono::hours(24 * 365)) {
    throw std::invalid_argument("lease ttl must be > 0 and at most a year");
  }
  return std::chrono::duration_cast<std::chrono::microseconds>(ttl).count();
}

std::optional<Timestamp> instant_or_null(const Row& row, std::size_t i) {
  if (auto us = row.get_optional_int(i)) {
    return from_micros(*us);
  }
  return std::nullopt;
}

}  // namespace

std::string lease_table_name(const std::string& table) {
  return derived_name(table, "_lease");
}

SqlLeaseStore::SqlLeaseStore(const Dialect& dialect, const std::string& table)
    : dialect_(dialect), lease_table_((validate_table_name(table), lease_table_name(table))) {}

std::optional<LeaseToken> SqlLeaseStore::acquire(Connection& conn, std::string_view name,
                                                 std::string_view owner,
                                                 std::chrono::milliseconds ttl) {
  validate_lease_name(name);
  validate_lease_name(owner);
  const auto ttl_us = ttl_micros(ttl);
  const std::string name_text(name);
  const std::string owner_text(owner);
  // The row exists from the first acquisition on; the decision is the conditional UPDATE alone.
  conn.execute(dialect_.insert_ignore("INTO " + lease_table_ + " (name, epoch) VALUES (" +
                                          dialect_.placeholder(1) + ", 0)",
                                      "name"),
               {TextRef{name_text}});

  const std::string now = dialect_.lease_now();
  Statement s(dialect_, true);
  s.sql("UPDATE " + lease_table_ + " SET owner = ").param(TextRef{owner_text});
  s.sql(", epoch = " + dialect_.remember("epoch + 1") + ", acquired_at = " + now +
        ", renewed_at = " + now + ", expires_at = " + now + " + ");
  s.micros(ttl_us).sql(" WHERE name = ").param(TextRef{name_text});
  s.sql(" AND (owner IS NULL OR expires_at IS NULL OR expires_at <= " + now + ")");
  if (dialect_.update_returning()) {
    s.sql(" RETURNING epoch");
    const auto rows = s.query(conn);
    if (rows.empty()) {
      return std::nullopt;
    }
    return LeaseToken{name_text, owner_text, rows[0].get_int(0)};
  }
  if (s.execute(conn) != 1) {
    return std::nullopt;
  }
  // The epoch this statement set, from the session: a second read of the row could see a later
  // holding (the same owner string in another process, after this one lapsed).
  const auto rows = conn.query(dialect_.remembered(), {});
  return LeaseToken{name_text, owner_text, rows.at(0).get_int(0)};
}

bool SqlLeaseStore::renew(Connection& conn, const LeaseToken& token,
                          std::chrono::milliseconds ttl) {
  const auto ttl_us = ttl_micros(ttl);
  const std::string now = dialect_.lease_now();
  Statement s(dialect_, true);
  s.sql("UPDATE " + lease_table_ + " SET renewed_at = " + now + ", expires_at = " + now + " + ");
  s.micros(ttl_us).sql(" WHERE name = ").param(TextRef{token.name});
  s.sql(" AND owner = ").param(TextRef{token.owner});
  s.sql(" AND epoch = ").param(token.epoch).sql(" AND expires_at > " + now);
  return s.execute(conn) == 1;
}

bool SqlLeaseStore::release(Connection& conn, const LeaseToken& token) {
  Statement s(dialect_, true);
  s.sql("UPDATE " + lease_table_ + " SET owner = NULL, expires_at = NULL WHERE name = ")
      .param(TextRef{token.name});
  s.sql(" AND owner = ").param(TextRef{token.owner});
  s.sql(" AND epoch = ").param(token.epoch);
  return s.execute(conn) == 1;
}

bool SqlLeaseStore::holds(Connection& conn, const LeaseToken& token) {
  Statement s(dialect_, true);
  s.sql("SELECT 1 FROM " + lease_table_ + " WHERE name = ").param(TextRef{token.name});
  s.sql(" AND owner = ").param(TextRef{token.owner});
  s.sql(" AND epoch = ").param(token.epoch).sql(" AND expires_at > " + dialect_.lease_now());
  return !s.query(conn).empty();
}

std::optional<LeaseInfo> SqlLeaseStore::find(Connection& conn, std::string_view name) {
  validate_lease_name(name);
  auto rows = select(conn, name);
  if (rows.empty()) {
    return std::nullopt;
  }
  return std::move(rows[0]);
}

std::vector<LeaseInfo> SqlLeaseStore::list(Connection& conn) {
  return select(conn, {});
}

std::vector<LeaseInfo> SqlLeaseStore::select(Connection& conn, std::string_view name) {
  const std::string now = dialect_.lease_now();
  const std::string name_text(name);
  Statement s(dialect_, true);
  s.sql("SELECT name, owner, epoch, " + dialect_.micros("acquired_at") + ", " +
        dialect_.micros("renewed_at") + ", " + dialect_.micros("expires_at") +
        ", CASE WHEN owner IS NOT NULL AND expires_at > " + now + " THEN 1 ELSE 0 END FROM " +
        lease_table_);
  if (!name.empty()) {
    s.sql(" WHERE name = ").param(TextRef{name_text});
  }
  s.sql(" ORDER BY name");
  std::vector<LeaseInfo> out;
  for (const auto& row : s.query(conn)) {
    out.push_back(LeaseInfo{.name = row.get_text(0),
                            .owner = row.get_optional_text(1),
                            .epoch = row.get_int(2),
                            .acquired_at = instant_or_null(row, 3),
                            .renewed_at = instant_or_null(row, 4),
                            .expires_at = instant_or_null(row, 5),
                            .live = row.get_int(6) == 1});
  }
  return out;
}

void append_fence(Statement& s, const Dialect& dialect, const std::string& lease_table,
                  const LeaseToken& token) {
  s.sql(" AND ");
  append_fence_condition(s, dialect, lease_table, token);
}

void append_fence_condition(Statement& s, const Dialect& dialect, const std::string& lease_table,
                            const LeaseToken& token, bool share_lock) {
  // Copies, not TextRefs: callers hold the token only while they build the statement.
  s.sql("EXISTS (SELECT 1 FROM " + lease_table + " WHERE name = ").param(token.name);
  s.sql(" AND owner = ").param(token.owner);
  s.sql(" AND epoch = ").param(token.epoch);
  s.sql(" AND expires_at > " + dialect.lease_now() + (share_lock ? dialect.share_lock() : "") +
        ")");
}

}  // namespace outbox::sql
