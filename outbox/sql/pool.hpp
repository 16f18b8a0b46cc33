#pragma once
// A bounded pool of connections made by a factory.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

#include "outbox/sql/connection.hpp"

namespace outbox::sql {

/// Creates connections lazily up to `max_size` and reuses them. Thread-safe.
class ConnectionPool final : public ConnectionProvider {
 public:
  using Factory = std::function<std::unique_ptr<Connection>()>;

  struct Options {
    Factory factory;                                  ///< required; may throw StoreError
    std::size_t max_size = 8;                         ///< > 0
    std::chrono::milliseconds acquire_timeout{5000};  ///< wait for a free connection
  };

  /// Throws std::invalid_argument on a missing factory or zero size.
  explicit ConnectionPool(Options options);
  ~ConnectionPool() override;
  ConnectionPool(const ConnectionPool&) = delete;
  ConnectionPool& operator=(const ConnectionPool&) = delete;

  /// Borrows an idle connection or makes one; waits up to acquire_timeout, then throws StoreError.
  PooledConnection acquire() override;
  /// A new connection from the factory, not counted against max_size. Throws StoreError.
  std::unique_ptr<Connection> open_dedicated() override { return options_.factory(); }
  /// Connections currently lent out.
  std::size_t in_use() const;

 private:
  // What lent connections return to: shared with them, so one may outlive the pool.
  struct Idle {
    std::unique_ptr<Connection> conn;
    std::chrono::steady_clock::time_point since;
  };
  struct Shared {
    std::mutex mutex;  // guards idle, created
    std::condition_variable returned;
    std::vector<Idle> idle;
    std::size_t created = 0;
  };
  static void give_back(void* owner, std::unique_ptr<Connection> conn, bool broken);
  PooledConnection lend(std::unique_ptr<Connection> conn);

  Options options_;
  std::shared_ptr<Shared> shared_ = std::make_shared<Shared>();
};

}  // namespace outbox::sql
