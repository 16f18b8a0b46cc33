#include "outbox/pqxx/connection.hpp"

#include <charconv>
#include <pqxx/pqxx>
#include <stdexcept>

#include "outbox/errors.hpp"

namespace outbox::pqxx_adapter {
namespace {

// Type OIDs decoded natively (pg_type.h).
constexpr unsigned kInt8 = 20;
constexpr unsigned kInt2 = 21;
constexpr unsigned kInt4 = 23;
constexpr unsigned kBytea = 17;

class PqxxConnection final : public sql::Connection {
 public:
  explicit PqxxConnection(pqxx::transaction_base& tx) : tx_(tx) {}

  using sql::Connection::execute;
  using sql::Connection::query;

  std::int64_t execute(std::string_view sql, std::span<const sql::Value> params) override {
    track_statement(sql);
    return static_cast<std::int64_t>(run(sql, params).affected_rows());
  }

  std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override {
    track_statement(sql);
    const pqxx::result res = run(sql, params);
    std::vector<sql::Row> rows;
    rows.reserve(res.size());
    for (const auto& r : res) {
      std::vector<sql::Value> values;
      values.reserve(r.size());
      for (const auto& f : r) {
        values.push_back(value(f));
      }
      rows.emplace_back(std::move(values));
    }
    return rows;
  }

  void begin() override { throw std::logic_error("pqxx adapter: the caller owns the transaction"); }
  void commit() override { begin(); }
  void rollback() override { begin(); }
  bool in_transaction() const override { return true; }
  std::string_view dialect() const override { return "postgres"; }

 private:
  pqxx::result run(std::string_view sql, std::span<const sql::Value> params) {
    // Every parameter goes as text (bytea as \x hex), NULL as a null pointer.
    std::vector<std::string> storage(params.size());
    std::vector<const char*> args(params.size(), nullptr);
    for (std::size_t i = 0; i < params.size(); ++i) {
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            if constexpr (std::is_same_v<T, std::monostate>) {
              return;
            } else if constexpr (std::is_same_v<T, std::int64_t> || std::is_same_v<T, double>) {
              storage[i] = std::to_string(x);
            } else if constexpr (std::is_same_v<T, std::string>) {
              storage[i] = x;
            } else if constexpr (std::is_same_v<T, sql::TextRef>) {
              storage[i] = std::string(x.text);
            } else {
              static constexpr char kHex[] = "0123456789abcdef";
              storage[i] = "\\x";
              for (auto b : x.bytes) {
                storage[i].push_back(kHex[b >> 4]);
                storage[i].push_back(kHex[b & 0xF]);
              }
            }
            args[i] = storage[i].c_str();
          },
          params[i]);
    }
    try {
      if (params.empty()) {
        return tx_.exec(std::string(sql));  // simple protocol: allows several statements
      }
      return tx_.exec_params(std::string(sql), pqxx::prepare::make_dynamic_params(args));
    } catch (const pqxx::sql_error& e) {
      throw StoreError(std::string("postgres (pqxx): ") + e.what(), e.sqlstate());
    } catch (const pqxx::broken_connection& e) {
      throw StoreError(std::string("postgres (pqxx): ") + e.what(), "08006");
    }
  }

  static sql::Value value(const pqxx::field& f) {
    if (f.is_null()) {
      return std::monostate{};
    }
    const char* v = f.c_str();
    const std::size_t len = f.size();
    switch (static_cast<unsigned>(f.type())) {
      case kInt8:
      case kInt4:
      case kInt2: {
        std::int64_t n = 0;
        std::from_chars(v, v + len, n);
        return n;
      }
      case kBytea: {
        const pqxx::binarystring b(f);
        return sql::Blob{std::vector<std::uint8_t>(b.begin(), b.end())};
      }
      default:
        return std::string(v, len);
    }
  }

  pqxx::transaction_base& tx_;
};

}  // namespace

std::unique_ptr<sql::Connection> wrap(pqxx::transaction_base& tx) {
  return std::make_unique<PqxxConnection>(tx);
}

}  // namespace outbox::pqxx_adapter
