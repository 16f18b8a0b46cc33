#pragma once
// The thread that writes DONE marks in batches: one UPDATE per window (or as soon as a batch is
// full), so a workload pays one status commit per window instead of one per event.

#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "outbox/clock.hpp"

namespace outbox {
class OutboxStore;
class MetricsExporter;
namespace sql {
class Connection;
class ConnectionProvider;
}  // namespace sql
}  // namespace outbox

namespace outbox::internal {

class DoneFlusher {
 public:
  struct Options {
    std::shared_ptr<sql::ConnectionProvider> provider;
    std::shared_ptr<OutboxStore> store;
    std::shared_ptr<Clock> clock;
    std::shared_ptr<MetricsExporter> metrics;
    std::string claim_owner;  ///< marks only rows this owner still holds (empty: any)
    std::chrono::microseconds window{10000};
    std::size_t max = 256;
  };
  /// Called on the flusher thread after each batch with its ids and whether they were written.
  using OnBatch = std::function<void(const std::vector<std::string>& ids, bool written)>;

  /// Starts the thread.
  DoneFlusher(Options options, OnBatch on_batch);
  /// Calls stop().
  ~DoneFlusher();
  DoneFlusher(const DoneFlusher&) = delete;
  DoneFlusher& operator=(const DoneFlusher&) = delete;

  /// Queues a DONE mark.
  void add(std::string event_id);
  /// Writes the marks waiting now on `conn`, on the calling thread: a poller about to claim takes
  /// the database's write lock anyway (SQLite has one), so the marks need no hand-off of it.
  /// Returns how many were written (0 if none waited or the write failed).
  std::size_t write_waiting(sql::Connection& conn);
  /// `at_once`: a write_waiting() call follows at once (a poller draining a backlog), so full
  /// batches are left to it for up to a window; false: full batches are written here at once.
  void expect_writer(bool at_once);
  /// Writes every mark still waiting and stops the thread. Idempotent.
  void stop();

 private:
  void loop();
  bool write(const std::vector<std::string>& batch);
  bool write_on(sql::Connection& conn, const std::vector<std::string>& batch);
  void failed(const std::vector<std::string>& batch, const std::string& error);

  Options options_;
  OnBatch on_batch_;
  std::mutex mutex_;  // guards pending_, first_at_, writer_expected_since_, stop_
  std::condition_variable ready_;
  std::vector<std::string> pending_;
  std::chrono::steady_clock::time_point first_at_;
  // Since when a write_waiting() call is expected at once (expect_writer(true)), if one is.
  std::optional<std::chrono::steady_clock::time_point> writer_expected_since_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace outbox::internal
