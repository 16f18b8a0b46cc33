#include "outbox/sql/pool.hpp"

#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/log.hpp"

namespace outbox::sql {

PooledConnection::PooledConnection(PooledConnection&& other) noexcept
    : conn_(std::move(other.conn_)),
      owner_(other.owner_),
      releaser_(other.releaser_),
      broken_(other.broken_) {
  other.owner_ = nullptr;
  other.releaser_ = nullptr;
}

PooledConnection& PooledConnection::operator=(PooledConnection&& other) noexcept {
  if (this != &other) {
    release();
    conn_ = std::move(other.conn_);
    owner_ = other.owner_;
    releaser_ = other.releaser_;
    broken_ = other.broken_;
    other.owner_ = nullptr;
    other.releaser_ = nullptr;
  }
  return *this;
}

PooledConnection::~PooledConnection() {
  release();
}

void PooledConnection::release() noexcept {
  if (!conn_) {
    return;
  }
  if (conn_->in_transaction()) {
    try {
      conn_->rollback();
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("rollback on connection return failed: ") + e.what());
      broken_ = true;
    }
  }
  if (releaser_) {
    // A session left in a transaction (a chained COMMIT/ROLLBACK) or with autocommit off would
    // swallow the next borrower's status writes into a transaction that is never committed.
    const bool broken =
        broken_ || conn_->is_broken() || conn_->in_transaction() || !conn_->session_reusable();
    releaser_(owner_, std::move(conn_), broken);
  }
  conn_.reset();
}

ConnectionPool::ConnectionPool(Options options) : options_(std::move(options)) {
  if (!options_.factory) {
    throw std::invalid_argument("ConnectionPool: factory is required");
  }
  if (options_.max_size == 0) {
    throw std::invalid_argument("ConnectionPool: max_size must be positive");
  }
}

ConnectionPool::~ConnectionPool() = default;

PooledConnection ConnectionPool::acquire() {
  std::unique_lock lock(pool_mutex_);
  const bool ready = returned_.wait_for(lock, options_.acquire_timeout, [&] {
    return !idle_.empty() || created_ < options_.max_size;
  });
  if (!ready) {
    throw StoreError("ConnectionPool: no connection free after " +
                     std::to_string(options_.acquire_timeout.count()) + " ms (max_size " +
                     std::to_string(options_.max_size) + ")");
  }
  while (!idle_.empty()) {
    auto idle = std::move(idle_.back());
    idle_.pop_back();
    lock.unlock();
    // Probed outside the lock: a probe may be a round trip (MariaDB's ping).
    const auto idle_for = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - idle.since);
    if (idle.conn->alive(idle_for)) {
      return PooledConnection(std::move(idle.conn), this, &ConnectionPool::give_back);
    }
    log(LogLevel::Info, "ConnectionPool: an idle connection was closed by the server; reopening");
    idle.conn.reset();
    lock.lock();
    --created_;
    if (idle_.empty() && created_ >= options_.max_size) {
      // Another borrower took the last slot meanwhile: wait for a connection again.
      lock.unlock();
      return acquire();
    }
  }
  ++created_;
  lock.unlock();
  try {
    return PooledConnection(options_.factory(), this, &ConnectionPool::give_back);
  } catch (...) {
    lock.lock();
    --created_;
    returned_.notify_one();
    throw;
  }
}

std::size_t ConnectionPool::in_use() const {
  std::lock_guard lock(pool_mutex_);
  return created_ - idle_.size();
}

void ConnectionPool::give_back(void* owner, std::unique_ptr<Connection> conn, bool broken) {
  auto* pool = static_cast<ConnectionPool*>(owner);
  {
    std::lock_guard lock(pool->pool_mutex_);
    if (broken) {
      --pool->created_;
    } else {
      pool->idle_.push_back({std::move(conn), std::chrono::steady_clock::now()});
    }
  }
  pool->returned_.notify_one();
  // A broken connection is destroyed here, outside the lock.
}

}  // namespace outbox::sql
