#include "outbox/internal/done_flusher.hpp"

#include "outbox/errors.hpp"
#include "outbox/internal/writes_first.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox::internal {

DoneFlusher::DoneFlusher(Options options, OnBatch on_batch)
    : options_(std::move(options)), on_batch_(std::move(on_batch)) {
  thread_ = std::thread([this] { loop(); });
}

DoneFlusher::~DoneFlusher() {
  stop();
}

void DoneFlusher::add(std::string event_id) {
  bool wake;
  {
    std::lock_guard lock(mutex_);
    if (pending_.empty()) {
      first_at_ = std::chrono::steady_clock::now();
    }
    pending_.push_back(std::move(event_id));
    // Wake the flusher for the first id of a window (it then sleeps until the window ends) and
    // when the batch is full.
    wake = pending_.size() == 1 || pending_.size() >= options_.max;
  }
  if (wake) {
    ready_.notify_one();
  }
}

void DoneFlusher::stop() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  ready_.notify_all();
  if (thread_.joinable()) {
    thread_.join();  // it writes every mark still waiting before it stops
  }
}

void DoneFlusher::loop() {
  const outbox::internal::WritesFirst
      first;  // marks held back keep events in memory and delay delivery
  std::unique_lock lock(mutex_);
  for (;;) {
    ready_.wait(lock, [&] { return stop_ || !pending_.empty(); });
    if (pending_.empty()) {
      return;  // stopping with nothing left to write
    }
    // Gather for the rest of the window, unless the batch fills up or the dispatcher closes.
    ready_.wait_until(lock, first_at_ + options_.window, [&] {
      return stop_ ||
             (pending_.size() >= options_.max &&
              (!writer_expected_since_ ||
               std::chrono::steady_clock::now() - *writer_expected_since_ >= options_.window));
    });
    if (pending_.empty()) {
      continue;  // taken meanwhile by write_waiting()
    }
    std::vector<std::string> batch;
    if (pending_.size() <= options_.max) {
      batch.swap(pending_);
    } else {
      const auto end = pending_.begin() + static_cast<long>(options_.max);
      batch.assign(std::make_move_iterator(pending_.begin()), std::make_move_iterator(end));
      pending_.erase(pending_.begin(), end);
    }
    lock.unlock();
    on_batch_(batch, write(batch));
    lock.lock();
  }
}

void DoneFlusher::expect_writer(bool at_once) {
  {
    std::lock_guard lock(mutex_);
    if (at_once) {
      writer_expected_since_ = std::chrono::steady_clock::now();
    } else {
      writer_expected_since_.reset();
    }
  }
  if (!at_once) {
    ready_.notify_one();  // a full batch left to the writer is written now
  }
}

std::size_t DoneFlusher::write_waiting(sql::Connection& conn) {
  std::vector<std::string> batch;
  {
    std::lock_guard lock(mutex_);
    if (pending_.empty() || stop_) {
      return 0;  // stopping: the flusher writes the rest
    }
    batch.swap(pending_);
  }
  const bool written = write_on(conn, batch);
  on_batch_(batch, written);
  return written ? batch.size() : 0;
}

bool DoneFlusher::write(const std::vector<std::string>& batch) {
  try {
    auto conn = options_.provider->acquire();
    return write_on(*conn, batch);
  } catch (const std::exception& e) {  // no connection
    failed(batch, e.what());
    return false;
  }
}

bool DoneFlusher::write_on(sql::Connection& conn, const std::vector<std::string>& batch) {
  try {
    // A deadlock or serialization failure is transient: a batch not written means every event
    // in it is delivered again, so it is worth two more tries on a healthy connection.
    for (int attempt = 1;; ++attempt) {
      try {
        const int marked = options_.store->mark_done_batch(conn, batch, options_.clock->now(),
                                                           options_.claim_owner);
        if (!options_.claim_owner.empty() && marked < static_cast<int>(batch.size())) {
          // Rows another node claimed meanwhile (this node's lease ran out while it worked):
          // that node delivers them too.
          log(LogLevel::Warning,
              "OutboxDispatcher: " +
                  std::to_string(batch.size() - static_cast<std::size_t>(marked)) +
                  " delivered events were no longer pending under the claim of " +
                  options_.claim_owner + " when marked DONE");
        }
        return true;
      } catch (const StoreError& e) {
        const bool transient = e.sqlstate() == "40P01" || e.sqlstate() == "40001";
        if (attempt >= 3 || !transient || conn.is_broken()) {
          throw;
        }
      }
    }
  } catch (const std::exception& e) {
    failed(batch, e.what());
    return false;
  }
}

void DoneFlusher::failed(const std::vector<std::string>& batch, const std::string& error) {
  for (std::size_t i = 0; i < batch.size(); ++i) {
    options_.metrics->increment_status_update_failure();
  }
  log(LogLevel::Error, "OutboxDispatcher: could not mark " + std::to_string(batch.size()) +
                           " events DONE (the poller will deliver them again): " + error);
}

}  // namespace outbox::internal
