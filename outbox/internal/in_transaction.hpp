#pragma once
// The transaction a store's write opens when its caller has none (the SQL group store's files).

#include <exception>

#include "outbox/sql/connection.hpp"

namespace outbox::internal {

// Runs `fn` in a transaction of its own unless the connection is in one already.
template <typename Fn>
auto in_transaction(sql::Connection& conn, Fn&& fn) {
  if (conn.in_transaction()) {
    return fn();
  }
  conn.begin();
  try {
    auto result = fn();
    conn.commit();
    return result;
  } catch (...) {
    try {
      conn.rollback();
    } catch (const std::exception&) {
      // The original error is the one worth reporting.
    }
    throw;
  }
}

}  // namespace outbox::internal
