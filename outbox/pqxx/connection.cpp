#include "outbox/pqxx/connection.hpp"

#include <charconv>
#include <pqxx/pqxx>
#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/transaction.hpp"

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
  /// A statement run through this connection failed, which aborts a PostgreSQL transaction.
  bool aborted() const noexcept { return aborted_; }

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
    } catch (const pqxx::failure&) {
      aborted_ = true;
      rethrow_typed();
    }
  }

  [[noreturn]] void rethrow_typed() const {
    const std::string prefix = "postgres (pqxx): ";
    try {
      throw;
    } catch (const pqxx::unique_violation& e) {
      throw UniqueViolationError(prefix + e.what(), e.sqlstate());
    } catch (const pqxx::sql_error& e) {
      // A terminated session reports its last error (57P01, …) as an SQL error.
      if (!tx_.conn().is_open() || e.sqlstate().starts_with("08") ||
          e.sqlstate().starts_with("57P")) {
        throw ConnectionLostError(prefix + e.what(), e.sqlstate().empty() ? "08006" : e.sqlstate());
      }
      throw StoreError(prefix + e.what(), e.sqlstate());
    } catch (const pqxx::broken_connection& e) {
      throw ConnectionLostError(prefix + e.what());
    } catch (const pqxx::failure& e) {
      throw StoreError(prefix + e.what());
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
  bool aborted_ = false;
};

}  // namespace

std::unique_ptr<sql::Connection> wrap(pqxx::transaction_base& tx) {
  return std::make_unique<PqxxConnection>(tx);
}

void commit(pqxx::transaction_base& tx, ExternalTransaction& ext) {
  const auto* wrapped = dynamic_cast<const PqxxConnection*>(&ext.connection());
  if (!tx.conn().is_open() || (wrapped != nullptr && wrapped->aborted())) {
    // PostgreSQL answers the COMMIT of an aborted transaction with ROLLBACK, which libpqxx takes
    // for success: it is not sent.
    tx.abort();
    ext.rolled_back();
    if (!tx.conn().is_open()) {
      throw ConnectionLostError(
          "postgres (pqxx): COMMIT not sent: the connection was lost; the server rolled the "
          "transaction back");
    }
    throw StoreError(
        "postgres (pqxx): COMMIT refused: a statement failed and aborted the transaction; it was "
        "rolled back, nothing was committed [SQLSTATE 25P02]",
        "25P02");
  }
  const std::string prefix = "postgres (pqxx): COMMIT failed: ";
  try {
    tx.commit();
  } catch (const pqxx::in_doubt_error& e) {
    ext.outcome_unknown();
    throw CommitOutcomeUnknownError(prefix + e.what());
  } catch (const pqxx::broken_connection& e) {
    ext.rolled_back();
    throw ConnectionLostError(prefix + e.what());
  } catch (const pqxx::sql_error& e) {
    ext.rolled_back();
    throw StoreError(prefix + e.what(), e.sqlstate());
  } catch (const pqxx::failure& e) {
    ext.rolled_back();
    throw StoreError(prefix + e.what());
  }
  ext.committed();
}

}  // namespace outbox::pqxx_adapter
