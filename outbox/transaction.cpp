#include "outbox/transaction.hpp"

#include <algorithm>
#include <stdexcept>
#include <utility>

#include "outbox/errors.hpp"
#include "outbox/log.hpp"

namespace outbox {
namespace {

// Which frame each context has open on this thread. A thread rarely uses more than one context.
thread_local std::vector<std::pair<const void*, void*>> tls_frames;

void run_callbacks(std::vector<std::function<void()>>& callbacks, const char* what) noexcept {
  for (auto& cb : callbacks) {
    try {
      cb();
    } catch (const std::exception& e) {
      log(LogLevel::Error, std::string(what) + " callback threw: " + e.what());
    } catch (...) {
      log(LogLevel::Error, std::string(what) + " callback threw a non-standard exception");
    }
  }
}

}  // namespace

// Runs one of Savepoint's own statements: the outbox follows these exactly, so they do not make
// the transaction suspect (see sql::Connection::transaction_suspect).
void Savepoint::run(sql::Connection& conn, const std::string& sql) {
  const bool suspect = conn.suspect_;
  try {
    conn.execute(sql);
  } catch (...) {
    conn.suspect_ = suspect;
    throw;
  }
  conn.suspect_ = suspect;
}

ThreadLocalTxContext::~ThreadLocalTxContext() = default;

ThreadLocalTxContext::Frame* ThreadLocalTxContext::frame() const {
  for (auto& [ctx, f] : tls_frames) {
    if (ctx == this) {
      return static_cast<Frame*>(f);
    }
  }
  return nullptr;
}

void ThreadLocalTxContext::bind(Frame* f) {
  if (frame() != nullptr) {
    throw std::logic_error("a transaction is already active on this thread for this context");
  }
  tls_frames.emplace_back(this, f);
}

void ThreadLocalTxContext::unbind() {
  std::erase_if(tls_frames, [this](const auto& p) { return p.first == this; });
}

bool ThreadLocalTxContext::is_transaction_active() const {
  return frame() != nullptr;
}

sql::Connection& ThreadLocalTxContext::current_connection() const {
  Frame* f = frame();
  if (f == nullptr) {
    throw std::logic_error("no active transaction on this thread");
  }
  return *f->connection;
}

void ThreadLocalTxContext::after_commit(std::function<void()> callback) {
  Frame* f = frame();
  if (f == nullptr) {
    throw std::logic_error("after_commit: no active transaction on this thread");
  }
  f->on_commit.push_back(std::move(callback));
}

void ThreadLocalTxContext::after_rollback(std::function<void()> callback) {
  Frame* f = frame();
  if (f == nullptr) {
    throw std::logic_error("after_rollback: no active transaction on this thread");
  }
  f->on_rollback.push_back(std::move(callback));
}

void ThreadLocalTxContext::after_unknown_outcome(std::function<void()> callback) {
  Frame* f = frame();
  if (f == nullptr) {
    throw std::logic_error("after_unknown_outcome: no active transaction on this thread");
  }
  f->on_unknown.push_back(std::move(callback));
}

void ThreadLocalTxContext::Frame::end(Outcome outcome) noexcept {
  for (auto& mark : savepoints) {
    mark.savepoint->frame_ = nullptr;
  }
  savepoints.clear();
  switch (outcome) {
    case Outcome::Committed:
      run_callbacks(on_commit, "after-commit");
      break;
    case Outcome::RolledBack:
      run_callbacks(on_rollback, "after-rollback");
      break;
    case Outcome::Unknown:
      run_callbacks(on_unknown, "after-unknown-outcome");
      break;
  }
}

Savepoint::Savepoint(ThreadLocalTxContext::Frame& frame)
    : frame_(&frame), name_("outbox_sp_" + std::to_string(++frame.savepoint_names)) {
  run(*frame.connection, "SAVEPOINT " + name_);
  frame.savepoints.push_back(
      {this, frame.on_commit.size(), frame.on_rollback.size(), frame.on_unknown.size()});
}

Savepoint::Savepoint(Savepoint&& other) noexcept
    : frame_(std::exchange(other.frame_, nullptr)), name_(std::move(other.name_)) {
  if (frame_ != nullptr) {
    for (auto& mark : frame_->savepoints) {
      if (mark.savepoint == &other) {
        mark.savepoint = this;
      }
    }
  }
}

Savepoint::~Savepoint() {
  if (frame_ != nullptr) {
    try {
      // Inner savepoints left open end with this one.
      while (frame_ != nullptr && frame_->savepoints.back().savepoint != this) {
        frame_->savepoints.back().savepoint->rollback();
      }
      rollback();
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("rollback in ~Savepoint failed: ") + e.what());
    }
  }
}

std::size_t Savepoint::position(const char* what) const {
  if (frame_ == nullptr) {
    throw std::logic_error(std::string("Savepoint::") + what + ": the savepoint has ended");
  }
  if (frame_->savepoints.empty() || frame_->savepoints.back().savepoint != this) {
    throw std::logic_error(std::string("Savepoint::") + what +
                           ": an inner savepoint is still open; end it first");
  }
  return frame_->savepoints.size() - 1;
}

void Savepoint::rollback() {
  const std::size_t at = position("rollback");
  auto* frame = frame_;
  run(*frame->connection, "ROLLBACK TO SAVEPOINT " + name_);
  // Another context sharing this connection may have written since the mark too: its events
  // are checked after commit.
  frame->connection->suspect_ = true;
  const auto mark = frame->savepoints[at];
  frame->savepoints.pop_back();
  frame_ = nullptr;
  // The rows are gone: the events written since the mark are rolled back for the outbox too.
  std::vector<std::function<void()>> undone(
      std::make_move_iterator(frame->on_rollback.begin() + static_cast<long>(mark.rollbacks)),
      std::make_move_iterator(frame->on_rollback.end()));
  frame->on_rollback.resize(mark.rollbacks);
  frame->on_commit.resize(mark.commits);
  frame->on_unknown.resize(mark.unknowns);
  run_callbacks(undone, "after-rollback");
  run(*frame->connection, "RELEASE SAVEPOINT " + name_);
}

void Savepoint::release() {
  position("release");
  run(*frame_->connection, "RELEASE SAVEPOINT " + name_);
  frame_->savepoints.pop_back();
  frame_ = nullptr;
}

Savepoint Transaction::savepoint() {
  if (!active_) {
    throw std::logic_error("savepoint: transaction is finished");
  }
  return Savepoint(*frame_);
}

Savepoint ExternalTransaction::savepoint() {
  if (!frame_) {
    throw std::logic_error("ExternalTransaction: outcome already reported");
  }
  return Savepoint(*frame_);
}

Transaction::Transaction(sql::PooledConnection conn, ThreadLocalTxContext& context)
    : conn_(std::move(conn)),
      context_(&context),
      frame_(std::make_unique<ThreadLocalTxContext::Frame>()) {
  frame_->connection = &conn_.get();
  context_->bind(frame_.get());
  try {
    conn_->begin();
  } catch (...) {
    context_->unbind();
    throw;
  }
}

Transaction::Transaction(Transaction&& other) noexcept
    : conn_(std::move(other.conn_)),
      context_(other.context_),
      frame_(std::move(other.frame_)),
      active_(std::exchange(other.active_, false)) {}

Transaction::~Transaction() {
  if (active_) {
    try {
      if (conn_->is_broken()) {
        conn_.mark_broken();  // the server rolled back what the lost session held
      } else {
        conn_->rollback();
      }
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("rollback in ~Transaction failed: ") + e.what());
      conn_.mark_broken();
    }
    finish(ThreadLocalTxContext::Frame::Outcome::RolledBack);
  }
}

sql::Connection& Transaction::connection() const {
  if (!active_) {
    throw std::logic_error("transaction is finished");
  }
  return conn_.get();
}

void Transaction::commit() {
  if (!active_) {
    throw std::logic_error("commit: transaction is finished");
  }
  using Outcome = ThreadLocalTxContext::Frame::Outcome;
  try {
    conn_->commit();
  } catch (const CommitOutcomeUnknownError&) {
    // Neither outcome may be assumed: after-rollback would forget rows that may be committed,
    // after-commit would deliver rows that may not exist.
    conn_.mark_broken();
    finish(Outcome::Unknown);
    throw;
  } catch (...) {
    try {
      if (!conn_->is_broken() && conn_->in_transaction()) {
        conn_->rollback();
      }
    } catch (const std::exception& e) {
      log(LogLevel::Warning, std::string("rollback after failed commit failed: ") + e.what());
      conn_.mark_broken();
    }
    finish(Outcome::RolledBack);
    throw;
  }
  finish(Outcome::Committed);
}

void Transaction::rollback() {
  if (!active_) {
    throw std::logic_error("rollback: transaction is finished");
  }
  try {
    if (conn_->is_broken()) {
      conn_.mark_broken();  // the server rolled back what the lost session held
    } else {
      conn_->rollback();
    }
  } catch (...) {
    conn_.mark_broken();
    finish(ThreadLocalTxContext::Frame::Outcome::RolledBack);
    throw;
  }
  finish(ThreadLocalTxContext::Frame::Outcome::RolledBack);
}

void Transaction::finish(ThreadLocalTxContext::Frame::Outcome outcome) noexcept {
  active_ = false;
  context_->unbind();
  const auto frame = std::move(frame_);
  frame->end(outcome);
}

ExternalTransaction::ExternalTransaction(ThreadLocalTxContext& context, sql::Connection& connection)
    : context_(&context), frame_(std::make_unique<ThreadLocalTxContext::Frame>()) {
  frame_->connection = &connection;
  context_->bind(frame_.get());
}

ExternalTransaction::~ExternalTransaction() {
  if (frame_) {
    log(LogLevel::Warning,
        "ExternalTransaction ended without committed()/rolled_back(): assuming a rollback");
    finish(ThreadLocalTxContext::Frame::Outcome::RolledBack);
  }
}

sql::Connection& ExternalTransaction::connection() const {
  if (!frame_) {
    throw std::logic_error("ExternalTransaction: outcome already reported");
  }
  return *frame_->connection;
}

void ExternalTransaction::committed() {
  finish(ThreadLocalTxContext::Frame::Outcome::Committed);
}

void ExternalTransaction::rolled_back() {
  finish(ThreadLocalTxContext::Frame::Outcome::RolledBack);
}

void ExternalTransaction::outcome_unknown() {
  finish(ThreadLocalTxContext::Frame::Outcome::Unknown);
}

void ExternalTransaction::finish(ThreadLocalTxContext::Frame::Outcome outcome) {
  if (!frame_) {
    throw std::logic_error("ExternalTransaction: outcome already reported");
  }
  context_->unbind();
  const auto frame = std::move(frame_);
  frame->end(outcome);
}

TransactionManager::TransactionManager(std::shared_ptr<sql::ConnectionProvider> provider,
                                       std::shared_ptr<ThreadLocalTxContext> context)
    : provider_(std::move(provider)), context_(std::move(context)) {
  if (!provider_) {
    throw std::invalid_argument("TransactionManager: provider is required");
  }
  if (!context_) {
    throw std::invalid_argument("TransactionManager: context is required");
  }
}

Transaction TransactionManager::begin() {
  if (context_->is_transaction_active()) {
    throw std::logic_error("TransactionManager::begin: this thread already has a transaction");
  }
  return Transaction(provider_->acquire(), *context_);
}

}  // namespace outbox
