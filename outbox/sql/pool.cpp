#include "outbox/sql/pool.hpp"

#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/log.hpp"

namespace outbox::sql {

PooledConnection::PooledConnection(PooledConnection&& other) noexcept
    : conn_(std::move(other.conn_)),
      owner_(other.owner_),
      releaser_(other.releaser_),
      keep_alive_(std::move(other.keep_alive_)),
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
    keep_alive_ = std::move(other.keep_alive_);
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
  keep_alive_.reset();  // last: the releaser wrote into what it kept alive
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

PooledConnection ConnectionPool::lend(std::unique_ptr<Connection> conn) {
  return PooledConnection(std::move(conn), shared_.get(), &ConnectionPool::give_back, shared_);
}

PooledConnection ConnectionPool::acquire() {
  auto& s = *shared_;
  std::unique_lock lock(s.mutex);
  const bool ready = s.returned.wait_for(lock, options_.acquire_timeout, [&] {
    return !s.idle.empty() || s.created < options_.max_size;
  });
  if (!ready) {
    throw StoreError("ConnectionPool: no connection free after " +
                     std::to_string(options_.acquire_timeout.count()) + " ms (max_size " +
                     std::to_string(options_.max_size) + ")");
  }
  while (!s.idle.empty()) {
    auto idle = std::move(s.idle.back());
    s.idle.pop_back();
    lock.unlock();
    // Probed outside the lock: a probe may be a round trip (MariaDB's ping).
    const auto idle_for = std::chrono::duration_cast<std::chrono::milliseconds>(
        std::chrono::steady_clock::now() - idle.since);
    if (idle.conn->alive(idle_for)) {
      return lend(std::move(idle.conn));
    }
    log(LogLevel::Info, "ConnectionPool: an idle connection was closed by the server; reopening");
    idle.conn.reset();
    lock.lock();
    --s.created;
    if (s.idle.empty() && s.created >= options_.max_size) {
      // Another borrower took the last slot meanwhile: wait for a connection again.
      lock.unlock();
      return acquire();
    }
  }
  ++s.created;
  lock.unlock();
  try {
    return lend(options_.factory());
  } catch (...) {
    lock.lock();
    --s.created;
    s.returned.notify_one();
    throw;
  }
}

std::size_t ConnectionPool::in_use() const {
  std::lock_guard lock(shared_->mutex);
  return shared_->created - shared_->idle.size();
}

void ConnectionPool::give_back(void* owner, std::unique_ptr<Connection> conn, bool broken) {
  // The shared state, kept alive by the connection: the pool itself may be gone.
  auto* s = static_cast<Shared*>(owner);
  {
    std::lock_guard lock(s->mutex);
    if (broken) {
      --s->created;
    } else {
      s->idle.push_back({std::move(conn), std::chrono::steady_clock::now()});
    }
  }
  s->returned.notify_one();
  // A broken connection is destroyed here, outside the lock.
}

}  // namespace outbox::sql
