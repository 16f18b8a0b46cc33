#include "outbox/purge.hpp"

#include <stdexcept>

#include "outbox/clock.hpp"
#include "outbox/internal/periodic_worker.hpp"
#include "outbox/log.hpp"
#include "outbox/sql/connection.hpp"

namespace outbox {

OutboxPurgeScheduler::OutboxPurgeScheduler(Options options) : options_(std::move(options)) {
  if (!options_.connection_provider) {
    throw std::invalid_argument("OutboxPurgeScheduler: connection_provider is required");
  }
  if (!options_.purger) {
    throw std::invalid_argument("OutboxPurgeScheduler: purger is required");
  }
  // Compared in seconds: converting a huge retention to milliseconds would overflow and pass.
  if (options_.retention.count() < 0 ||
      options_.retention > std::chrono::duration_cast<std::chrono::seconds>(kMaxDuration)) {
    throw std::invalid_argument("OutboxPurgeScheduler: retention must be between 0 and 3650 days");
  }
  if (options_.batch_size < 1) {
    throw std::invalid_argument("OutboxPurgeScheduler: batch_size must be >= 1");
  }
  if (options_.interval.count() <= 0 || options_.interval > kMaxDuration) {
    throw std::invalid_argument(
        "OutboxPurgeScheduler: interval must be positive and at most 3650 days");
  }
  if (!options_.clock) {
    options_.clock = Clock::system();
  }
  worker_ = std::make_unique<internal::PeriodicWorker>(
      "OutboxPurgeScheduler", [this] { run_once(); }, [this] { return options_.interval; });
}

OutboxPurgeScheduler::~OutboxPurgeScheduler() {
  close();
}

void OutboxPurgeScheduler::start() {
  worker_->start();
}

void OutboxPurgeScheduler::close() {
  worker_->close();
}

int OutboxPurgeScheduler::run_once() {
  // The time is taken once: every batch of the run shares its cutoff.
  const auto now = options_.clock->now();
  int total = 0;
  try {
    for (;;) {
      auto conn = options_.connection_provider->acquire();
      const int deleted =
          options_.purger->purge_older_than(*conn, options_.retention, now, options_.batch_size);
      total += deleted;
      if (deleted < options_.batch_size) {
        break;
      }
      if (worker_->closed()) {
        break;  // close() stops a long purge between batches
      }
    }
  } catch (const std::exception& e) {
    log(LogLevel::Error, std::string("OutboxPurgeScheduler: purge failed: ") + e.what());
  }
  if (total > 0) {
    log(LogLevel::Info, "OutboxPurgeScheduler: purged " + std::to_string(total) + " events");
  }
  return total;
}

}  // namespace outbox
