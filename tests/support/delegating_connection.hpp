#pragma once
// A connection that hands every call to another one (borrowed): tests derive from it to watch or
// change what one call does, and leave the rest as the engine's.

#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "outbox/sql/connection.hpp"

namespace outbox::testing {

class DelegatingConnection : public sql::Connection {
 public:
  explicit DelegatingConnection(sql::Connection& inner) : inner_(inner) {}
  std::int64_t execute(std::string_view sql, std::span<const sql::Value> params) override {
    return inner_.execute(sql, params);
  }
  std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override {
    return inner_.query(sql, params);
  }
  void begin() override { inner_.begin(); }
  void commit() override { inner_.commit(); }
  void rollback() override { inner_.rollback(); }
  bool in_transaction() const override { return inner_.in_transaction(); }
  std::string_view dialect() const override { return inner_.dialect(); }
  bool single_writer() const override { return inner_.single_writer(); }

 protected:
  sql::Connection& inner() { return inner_; }

 private:
  sql::Connection& inner_;
};

}  // namespace outbox::testing
