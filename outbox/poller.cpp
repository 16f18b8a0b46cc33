#include "outbox/poller.hpp"

#include <algorithm>
#include <stdexcept>

#include "outbox/change_watcher.hpp"
#include "outbox/clock.hpp"
#include "outbox/dispatcher.hpp"
#include "outbox/internal/hand_over_stage.hpp"
#include "outbox/internal/periodic_worker.hpp"
#include "outbox/internal/writes_first.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/log.hpp"
#include "outbox/metrics.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox {
namespace {

constexpr std::chrono::milliseconds kNoCapacityRetryMax{100};
// Rows decoded before they are handed over together.
constexpr std::size_t kHandOverChunk = 64;

}  // namespace

bool DispatcherPollerHandler::handle(const EventEnvelope& event, int attempts) {
  return handle_grouped(event, attempts, -1);
}

bool DispatcherPollerHandler::handle_grouped(const EventEnvelope& event, int attempts,
                                             int partition) {
  std::vector<ClaimedEvent> one;
  one.push_back({event, attempts, partition});
  PollCycle now{.started = std::chrono::steady_clock::now()};
  return handle_all(std::move(one), now) == 1;
}

std::size_t OutboxPollerHandler::handle_all(std::vector<ClaimedEvent> events, PollCycle&) {
  std::size_t taken = 0;
  for (const auto& e : events) {
    const bool ok = e.partition < 0 ? handle(e.envelope, e.attempts)
                                    : handle_grouped(e.envelope, e.attempts, e.partition);
    if (!ok) {
      break;
    }
    ++taken;
  }
  return taken;
}

std::size_t DispatcherPollerHandler::handle_all(std::vector<ClaimedEvent> events,
                                                PollCycle& cycle) {
  std::vector<QueuedEvent> queued;
  queued.reserve(events.size());
  for (auto& e : events) {
    queued.push_back(QueuedEvent{std::move(e.envelope), QueuedEvent::Source::Cold, e.attempts,
                                 cycle.started, cycle.scan_token});
    if (e.partition >= 0) {
      queued.back().partition = e.partition;
      queued.back().lease_epoch = e.lease_epoch;
    }
  }
  const auto r = dispatcher_.enqueue_cold_all(std::move(queued));
  cycle.queued = cycle.queued.value_or(0) + static_cast<int>(r.queued);
  return r.taken;
}

int DispatcherPollerHandler::available_capacity() const {
  return dispatcher_.cold_queue_remaining_capacity();
}

int DispatcherPollerHandler::in_flight() const {
  return dispatcher_.in_memory();
}

void DispatcherPollerHandler::begin_cycle(PollCycle& cycle) {
  cycle.scan_token = dispatcher_.begin_scan();
  cycle.queued = 0;
}

void DispatcherPollerHandler::end_cycle(PollCycle& cycle) {
  if (cycle.scan_token) {
    dispatcher_.end_scan(*cycle.scan_token);
  }
}

void DispatcherPollerHandler::before_query(sql::Connection& conn) {
  // With one writer at a time the flusher would wait for the claim's lock and the claim for the
  // marks': written here they need no hand-off of it (SQLite drain of 300,000 rows: 0.64–0.78 →
  // 0.81–0.91 of the floor, with the staged hand-over). Where writers run side by side
  // (PostgreSQL, MariaDB) the flusher's own thread is faster (−25 % here).
  writes_marks_.store(conn.single_writer());
  if (conn.single_writer()) {
    dispatcher_.write_done_marks(conn);
  }
}

void DispatcherPollerHandler::after_cycle(bool next_at_once) {
  dispatcher_.expect_done_writer(next_at_once && writes_marks_.load());
}

OutboxPoller::OutboxPoller(Options options) : options_(std::move(options)) {
  if (!options_.connection_provider) {
    throw std::invalid_argument("OutboxPoller: connection_provider is required");
  }
  if (!options_.store) {
    throw std::invalid_argument("OutboxPoller: store is required");
  }
  if (!options_.handler) {
    throw std::invalid_argument("OutboxPoller: handler is required");
  }
  if (options_.skip_recent.count() < 0) {
    throw std::invalid_argument("OutboxPoller: skip_recent must not be negative");
  }
  if (options_.batch_size < 1) {
    throw std::invalid_argument("OutboxPoller: batch_size must be >= 1");
  }
  if (options_.interval.count() <= 0 || options_.interval > kMaxDuration) {
    throw std::invalid_argument("OutboxPoller: interval must be positive and at most 3650 days");
  }
  if (options_.adaptive_floor.count() < 0 || options_.adaptive_floor > options_.interval) {
    throw std::invalid_argument("OutboxPoller: adaptive_floor must be between 0 and interval");
  }
  if (options_.head_rescan_interval.count() < 0 || options_.head_rescan_interval > kMaxDuration) {
    throw std::invalid_argument(
        "OutboxPoller: head_rescan_interval must be between 0 and 3650 days");
  }
  if (options_.skip_recent > kMaxDuration) {
    throw std::invalid_argument("OutboxPoller: skip_recent must be at most 3650 days");
  }
  if (options_.claim_locking) {
    const auto lock_timeout = options_.claim_locking->lock_timeout;
    if (lock_timeout.count() <= 0 || lock_timeout > kMaxDuration) {
      throw std::invalid_argument(
          "OutboxPoller: claim_locking.lock_timeout must be positive and at most 3650 days");
    }
    owner_ = options_.claim_locking->owner.empty() ? "poller-" + new_ulid()
                                                   : options_.claim_locking->owner;
    // locked_by is VARCHAR(128) on MariaDB: a longer owner failed every claim there.
    if (owner_.size() > ClaimLocking::kMaxOwnerBytes ||
        owner_.find_first_of(std::string_view("\0", 1)) != std::string::npos) {
      throw std::invalid_argument("OutboxPoller: claim_locking.owner must be at most " +
                                  std::to_string(ClaimLocking::kMaxOwnerBytes) +
                                  " bytes without NUL");
    }
  }
  if (!options_.metrics) {
    options_.metrics = MetricsExporter::noop();
  }
  if (!options_.json_codec) {
    options_.json_codec = &JsonCodec::default_codec();
  }
  if (!options_.clock) {
    options_.clock = Clock::system();
  }
  // Waiting is the poller's behaviour; close() wakes it at once. A full batch means a backlog:
  // the next cycle runs without waiting.
  if (options_.claim_locking && !options_.claim_groups) {
    stage_ = std::make_unique<internal::HandOverStage>();
  }
  worker_ = std::make_unique<internal::PeriodicWorker>(
      "OutboxPoller", [this] { run_cycle(true); }, [this] { return next_wait(); });
}

OutboxPoller::~OutboxPoller() {
  close();
}

void OutboxPoller::start() {
  if (worker_->closed()) {
    worker_->start();  // throws std::logic_error: start() after close()
  }
  std::call_once(watcher_started_, [this] {
    if (options_.change_watcher) {
      options_.change_watcher->start([this, first = true](ChangeWatcher::Signal signal) mutable {
        if (signal == ChangeWatcher::Signal::Changed) {
          options_.metrics->increment_wakeup();
          hinted_.store(true);
        } else if (!std::exchange(first, false)) {
          options_.metrics->increment_wakeup_reconnect();
        }
        worker_->wake();
      });
    }
  });
  worker_->start();
}

void OutboxPoller::close() {
  if (options_.change_watcher) {
    options_.change_watcher->close();  // before the worker: its hints wake the worker
  }
  worker_->close();
  if (stage_) {
    stage_->close();  // after the worker: nothing is submitted any more
  }
}

std::chrono::milliseconds OutboxPoller::next_wait() const {
  const int failures = consecutive_failures_.load();
  if (failures == 0) {
    switch (last_cycle_.load()) {
      case CycleResult::FullBatch:
        return std::chrono::milliseconds(0);
      case CycleResult::NoCapacity:
        // The cold queue is full: look again soon rather than a whole interval later (nothing
        // wakes the poller when room frees up, and with wake-ups the interval may be an hour).
        return std::clamp(options_.interval / 10, std::chrono::milliseconds(1),
                          std::min(options_.interval, kNoCapacityRetryMax));
      case CycleResult::Partial:
        if (options_.adaptive_floor.count() > 0) {
          auto wait = options_.adaptive_floor;  // below the interval, so doubling cannot overflow
          for (int i = idle_cycles_.load(); i > 0 && wait < options_.interval; --i) {
            wait *= 2;
          }
          return std::min(wait, options_.interval);
        }
        return options_.interval;
    }
  }
  const auto backoff = options_.interval * (1 << std::min(failures, 4));
  return std::max(options_.interval,
                  std::min<std::chrono::milliseconds>(backoff, std::chrono::seconds(30)));
}

void OutboxPoller::wake() {
  worker_->wake();
}

int OutboxPoller::poll() {
  return run_cycle(false);
}

OutboxPoller::HandOver OutboxPoller::hand_over(const std::vector<OutboxEvent>& rows,
                                               PollCycle& cycle, sql::Connection* conn,
                                               Timestamp now) {
  auto& handler = *options_.handler;
  HandOver out;
  const OutboxEvent* seen = nullptr;  // the last row decoded or settled
  // Decoded rows go over in chunks: one lock hold and a few wake-ups per chunk instead of per
  // row, while the workers already run the chunks before.
  std::vector<ClaimedEvent> chunk;
  std::vector<const OutboxEvent*> before;  // per chunk row: the row read just before it
  const auto flush = [&] {
    const std::size_t n = chunk.size();
    const std::size_t taken = n == 0 ? 0 : handler.handle_all(std::move(chunk), cycle);
    out.handed += static_cast<int>(taken);
    if (taken < n) {
      // Queue full: the rows from the refused one on stay pending (claimed rows until lock
      // expiry).
      out.refused = true;
      out.passed = before[taken];
    } else {
      out.passed = seen;
    }
    chunk.clear();
    before.clear();
  };
  std::optional<sql::PooledConnection> own;  // a staged hand-over settles on one of its own
  for (const auto& row : rows) {
    std::optional<EventEnvelope> envelope;
    try {
      envelope.emplace(to_envelope(row, *options_.json_codec));
    } catch (const std::exception& e) {
      // What was decoded before it goes over first: a DEAD mark that fails must not hold it
      // back (claimed rows would wait for their lock to expire).
      flush();
      if (out.refused) {
        break;
      }
      const std::string error = std::string("decode failure: ") + e.what();
      log(LogLevel::Error,
          "OutboxPoller: event " + row.event_id + " cannot be decoded, marking DEAD: " + e.what());
      try {
        if (conn == nullptr) {
          own.emplace(options_.connection_provider->acquire());
          conn = &**own;
        }
        options_.store->mark_dead(*conn, row.event_id, now, error, false, owner_);
        options_.metrics->increment_dispatch_dead();
      } catch (const std::exception& failed) {
        // The row stays pending (claimed until its lock expires) and is looked at again; the
        // rows after it must not wait for it (a DEAD mark that keeps failing held them forever).
        log(LogLevel::Error, "OutboxPoller: could not mark event " + row.event_id +
                                 " DEAD (it is read again later): " + failed.what());
        options_.metrics->increment_status_update_failure();
      }
      seen = &row;
      continue;
    }
    before.push_back(seen);
    chunk.push_back(ClaimedEvent{std::move(*envelope), row.attempts, -1});
    seen = &row;
    if (chunk.size() >= kHandOverChunk) {
      flush();
      if (out.refused) {
        break;
      }
    }
  }
  if (!out.refused) {
    flush();
  }
  return out;
}

int OutboxPoller::run_cycle(bool background) {
  const outbox::internal::WritesFirst first;  // its claims and DONE marks
  const int handed = cycle_once(background);
  // Only a next cycle that follows at once may be left the DONE marks waiting (it writes them
  // before its claim on SQLite); after a short page, a failure or close nobody comes back soon.
  options_.handler->after_cycle(!worker_->closed() && consecutive_failures_.load() == 0 &&
                                last_cycle_.load() == CycleResult::FullBatch &&
                                claimed_last_.load());
  return handed;
}

int OutboxPoller::cycle_once(bool background) {
  // After close() nothing is handed over: the handler (a closed dispatcher) may be gone.
  if (worker_->closed()) {
    return 0;
  }
  if (options_.active && !options_.active()) {
    last_cycle_ = CycleResult::Partial;  // inactive: wait the interval, not at once
    return 0;
  }
  std::lock_guard cycle_lock(cycle_mutex_);
  if (!background && stage_) {
    // The background loop cannot submit while this cycle holds the lock: once the stage is idle,
    // this cycle's rows go over after every page claimed before them.
    stage_->wait_idle();
  }
  // A hint that comes during the cycle wakes the next one: the rows may not be in this one's read.
  const bool hinted = hinted_.exchange(false);
  auto& handler = *options_.handler;
  // Rows of the cycle before still being handed over will take room too. Read before the room:
  // rows the stage moves into the queue in between are then counted twice (room left unused
  // for a cycle), never not at all (rows claimed that the queue refuses).
  const int staged_rows = staged_rows_.load();
  const int capacity = handler.available_capacity() - staged_rows;
  if (capacity <= 0) {
    last_cycle_ = CycleResult::NoCapacity;
    completed_cycles_.fetch_add(1);
    return 0;
  }
  const int limit = std::min(capacity, options_.batch_size);
  int handed = 0;
  // In a background loop with claim locking, the cycle's rows are handed over by the stage while
  // this thread runs the next cycle's statements: each claimed row is this node's alone, so the
  // next claim needs nothing from the hand-over (and grouped claims, which do, are not staged).
  const bool staged = background && stage_ && options_.claim_locking && !options_.claim_groups;
  // No later than the cycle's claims: taken before its query (a claim's age is judged from it).
  auto cycle = std::make_shared<PollCycle>(PollCycle{.started = std::chrono::steady_clock::now()});
  handler.begin_cycle(*cycle);
  try {
    std::optional<sql::PooledConnection> held(options_.connection_provider->acquire());
    sql::Connection* conn = &**held;
    if (options_.claim_locking && claimed_last_.load()) {
      // Only a claim that takes rows is sure to take the write lock. A poll without claims is a
      // read: making it wait for the lock behind the writers of the same pool starved it (SQLite,
      // 4 writers in the poller's process: it delivered ~1,000 of 9,000 events a second while they
      // wrote). So is a claim with nothing to claim on SQLite, and a relay draining only message
      // groups then leaves its DONE marks to the flusher's thread, beside its reads.
      handler.before_query(*conn);
    }
    const auto now = options_.clock->now();
    const auto steady_now = std::chrono::steady_clock::now();
    const bool from_head = !cursor_created_at_ || options_.head_rescan_interval.count() == 0 ||
                           steady_now - last_head_scan_ >= options_.head_rescan_interval;
    PendingKey cursor;
    if (!from_head) {
      cursor = {*cursor_created_at_, cursor_event_id_};
    }
    const PendingKey* after = from_head ? nullptr : &cursor;
    if (from_head) {
      last_head_scan_ = steady_now;
    }
    std::vector<OutboxEvent> rows;
    int requested = limit;
    if (options_.claim_locking) {
      rows = options_.store->claim_pending(*conn, owner_, now, options_.claim_locking->lock_timeout,
                                           options_.skip_recent, limit, after);
      claimed_last_.store(!rows.empty());
    } else {
      // From the head, rows queued or in flight here are still pending in the table and come
      // first: read past them so a busy queue does not hide the rows behind it.
      if (from_head) {
        requested += std::min(handler.in_flight(), 20 * options_.batch_size);
      }
      rows = options_.store->poll_pending(*conn, now, options_.skip_recent, requested, after);
    }
    std::int64_t lag_ms = 0;
    if (!rows.empty()) {
      auto oldest = std::min_element(rows.begin(), rows.end(), [](const auto& a, const auto& b) {
        return a.created_at < b.created_at;
      });
      lag_ms = std::max<std::int64_t>(
          0,
          std::chrono::duration_cast<std::chrono::milliseconds>(now - oldest->created_at).count());
    }
    if (from_head) {  // a keyset page does not start at the oldest row
      options_.metrics->record_oldest_lag_ms(lag_ms);
    }
    const bool full_page = static_cast<int>(rows.size()) >= requested;
    if (staged && !rows.empty()) {  // an empty page is done here
      // Claimed rows are locked by this node, so the next claim passes them whatever becomes of
      // them: the next page starts after the last one claimed.
      if (full_page) {
        cursor_created_at_ = rows.back().created_at;
        cursor_event_id_ = rows.back().event_id;
      } else {
        cursor_created_at_.reset();
      }
      const int claimed = static_cast<int>(rows.size());
      consecutive_failures_.store(0);
      last_cycle_ = claimed >= limit ? CycleResult::FullBatch : CycleResult::Partial;
      idle_cycles_.store(0);
      held.reset();  // the stage may need one to settle a row it cannot decode
      staged_rows_.fetch_add(claimed);
      auto page = std::make_shared<std::vector<OutboxEvent>>(std::move(rows));
      stage_->submit(
          [this, page, cycle, claimed, now] {
            try {
              hand_over(*page, *cycle, nullptr, now);
            } catch (const std::exception& e) {
              // The rows after the one that failed stay claimed until their lock expires.
              log(LogLevel::Error,
                  std::string("OutboxPoller: handing over a page failed: ") + e.what());
            }
            staged_rows_.fetch_sub(claimed);
            options_.handler->end_cycle(*cycle);
            completed_cycles_.fetch_add(1);
          },
          [this, cycle, claimed] {
            // Closed: the rows stay claimed until released (Outbox::close) or expired.
            staged_rows_.fetch_sub(claimed);
            options_.handler->end_cycle(*cycle);
          });
      return claimed;
    }
    const auto result = hand_over(rows, *cycle, conn, now);
    handed = result.handed;
    bool refused = result.refused;
    // Resume after the last row passed while pages are full or the queue refused; a short page
    // means the end was reached, so the next cycle starts from the head.
    if ((refused || full_page) && result.passed != nullptr) {
      cursor_created_at_ = result.passed->created_at;
      cursor_event_id_ = result.passed->event_id;
    } else if (!refused) {
      cursor_created_at_.reset();
    }
    bool groups_left = false;
    if (options_.claim_groups && !refused) {
      const int room = std::min(handler.available_capacity(), options_.batch_size);
      if (room > 0) {
        auto grouped = options_.claim_groups(*conn, room);
        groups_left = grouped.more;
        const std::size_t n = grouped.events.size();
        const std::size_t taken =
            n == 0 ? 0 : handler.handle_all(std::move(grouped.events), *cycle);
        handed += static_cast<int>(taken);
        // Refused: the rest stay claimed until their group is claimed again.
        refused = taken < n;
      }
    }
    consecutive_failures_.store(0);
    // Rows already queued or in flight here come back in every poll: only a full batch of new
    // work is a reason not to wait.
    const int fresh = cycle->queued.value_or(handed);
    last_cycle_ =
        fresh >= limit || (groups_left && !refused) ? CycleResult::FullBatch : CycleResult::Partial;
    if (fresh > 0) {
      idle_cycles_.store(0);
    } else {
      idle_cycles_.store(std::min(idle_cycles_.load() + 1, 64));
      if (hinted) {
        options_.metrics->increment_wakeup_empty();
      }
    }
  } catch (const std::exception& e) {
    cursor_created_at_.reset();
    const int failures = consecutive_failures_.fetch_add(1) + 1;
    // Log the first failure and then every tenth, so an outage does not flood the log.
    if (failures == 1 || failures % 10 == 0) {
      log(LogLevel::Error, "OutboxPoller: poll cycle failed (" + std::to_string(failures) +
                               " in a row, backing off): " + e.what());
    }
  }
  handler.end_cycle(*cycle);
  completed_cycles_.fetch_add(1);
  return handed;
}

}  // namespace outbox
