#include "outbox/postgres/notifications.hpp"

#include <libpq-fe.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <optional>
#include <stdexcept>

#include "outbox/errors.hpp"
#include "outbox/internal/redact.hpp"
#include "outbox/log.hpp"
#include "outbox/postgres/internal/native_connect.hpp"
#include "outbox/sql/value.hpp"

namespace outbox::postgres {
namespace {

constexpr std::chrono::milliseconds kFirstRetry{100};
constexpr std::chrono::milliseconds kMaxNotifyRetry{5000};

// An outage is logged at its first failure and every tenth after, not once per attempt.
bool worth_logging(int failures) {
  return failures == 1 || failures % 10 == 0;
}

std::string quoted_identifier(std::string_view name) {
  std::string out = "\"";
  for (char c : name) {
    out += c;
    if (c == '"') {
      out += '"';
    }
  }
  return out + '"';
}

std::string trimmed(std::string message) {
  while (!message.empty() && (message.back() == '\n' || message.back() == ' ')) {
    message.pop_back();
  }
  return message;
}

}  // namespace

std::string notification_channel(std::string_view table) {
  // NAMEDATALEN - 1: pg_notify refuses longer channels, LISTEN would truncate them.
  if (table.empty() || table.size() > 63 || table.find('\0') != std::string_view::npos) {
    throw std::invalid_argument("notification channel: table name must be 1 to 63 bytes, got '" +
                                std::string(table) + "'");
  }
  std::string channel(table);
  std::transform(channel.begin(), channel.end(), channel.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return channel;
}

// ---- CommitNotifier ---------------------------------------------------------------------------

CommitNotifier::CommitNotifier(Options options) : options_(std::move(options)) {
  if (!options_.connection_provider) {
    throw std::invalid_argument("CommitNotifier: connection_provider is required");
  }
  if (options_.min_interval.count() <= 0) {
    throw std::invalid_argument("CommitNotifier: min_interval must be positive");
  }
  channel_ = notification_channel(options_.table);
}

CommitNotifier::~CommitNotifier() {
  close();
}

void CommitNotifier::after_commit(const std::vector<EventEnvelope>&) {
  {
    std::lock_guard lock(mutex_);
    if (closed_) {
      return;
    }
    owed_ = true;
    if (!thread_.joinable()) {
      thread_ = std::thread([this] { run(); });
    }
  }
  wake_.notify_all();
}

void CommitNotifier::close() {
  std::thread thread;
  {
    std::lock_guard lock(mutex_);
    closed_ = true;
    thread = std::move(thread_);
  }
  wake_.notify_all();
  if (thread.joinable()) {
    thread.join();
  }
}

std::uint64_t CommitNotifier::sent() const {
  std::lock_guard lock(mutex_);
  return sent_;
}

void CommitNotifier::run() {
  // pg_notify takes the channel as text, exactly as LISTEN takes it quoted.
  const sql::Value channel[] = {channel_, std::string()};
  std::unique_ptr<sql::Connection> own;
  bool has_dedicated = true;
  int failures = 0;
  std::unique_lock lock(mutex_);
  for (;;) {
    wake_.wait(lock, [&] { return owed_ || closed_; });
    if (!owed_) {
      return;
    }
    owed_ = false;
    const bool closing = closed_;
    lock.unlock();
    bool ok = true;
    try {
      if (!own && has_dedicated) {
        own = options_.connection_provider->open_dedicated();
        has_dedicated = own != nullptr;
        if (own) {
          // A NOTIFY's transaction has an xid, so its commit waits for a WAL flush; the hint
          // need not survive a crash, and the wait would add a disk flush to every wake-up.
          own->execute("SET synchronous_commit TO off", {});
        }
      }
      if (own) {
        own->query("SELECT pg_notify($1, $2)", channel);
      } else {
        auto conn = options_.connection_provider->acquire();
        try {
          conn->query("SELECT pg_notify($1, $2)", channel);
        } catch (const ConnectionLostError&) {
          conn.mark_broken();
          throw;
        }
      }
      if (failures > 0) {
        log(LogLevel::Info, "CommitNotifier: notifying '" + channel_ + "' again");
      }
      failures = 0;
    } catch (const std::exception& e) {
      ok = false;
      own.reset();
      if (worth_logging(++failures)) {
        log(LogLevel::Warning, "CommitNotifier: NOTIFY on '" + channel_ + "' failed (" +
                                   std::to_string(failures) +
                                   " in a row; pollers still poll on their interval): " + e.what());
      }
    }
    lock.lock();
    if (ok) {
      ++sent_;
    } else if (!closing) {
      owed_ = true;  // still owed: a later attempt may reach the server
    }
    // One NOTIFY per min_interval covers every commit in it; after failures, back off.
    auto pause = options_.min_interval;
    if (!ok) {
      pause =
          std::max(pause, std::min(kMaxNotifyRetry, kFirstRetry * (1 << std::min(failures, 6))));
    }
    wake_.wait_for(lock, pause, [&] { return closed_; });
    if (closing) {
      return;
    }
  }
}

// ---- NotificationWatcher ----------------------------------------------------------------------

// Everything the watcher's thread does on the network waits on the socket and on close()'s
// eventfd together, with a deadline: a server that stops answering (a frozen backend, a proxy
// that swallows traffic) neither hangs close() nor goes unnoticed.
struct NotificationWatcher::Impl {
  using Clock = std::chrono::steady_clock;
  enum class Wait { Stopped, Ready, TimedOut };
  using Conn = std::unique_ptr<PGconn, void (*)(PGconn*)>;

  Options options;
  std::string listen_sql;
  std::function<void(Signal)> signal;
  int stop_fd = -1;
  std::mutex mutex;  // guards started, closed
  bool started = false;
  bool closed = false;
  std::thread thread;

  ~Impl() {
    if (stop_fd >= 0) {
      ::close(stop_fd);
    }
  }

  // Waits for `events` on `socket` (none when negative) until `deadline` (none: for ever).
  Wait wait(int socket, short events, std::optional<Clock::time_point> deadline) {
    pollfd fds[2] = {{stop_fd, POLLIN, 0}, {socket, events, 0}};
    for (;;) {
      int timeout = -1;
      if (deadline) {
        const auto left = std::chrono::ceil<std::chrono::milliseconds>(*deadline - Clock::now());
        timeout = static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 60000));
      }
      const int r = ::poll(fds, socket >= 0 ? 2 : 1, timeout);
      if (r < 0 && errno == EINTR) {
        continue;
      }
      if (r > 0 && fds[0].revents != 0) {
        return Wait::Stopped;
      }
      if (r > 0) {
        return Wait::Ready;
      }
      if (r == 0 && deadline && Clock::now() >= *deadline) {
        return Wait::TimedOut;
      }
    }
  }

  std::string error_of(PGconn* conn) const {
    std::string message = outbox::internal::redact_secrets(
        trimmed(conn ? PQerrorMessage(conn) : "out of memory"), options.conninfo);
    std::replace(message.begin(), message.end(), '\n', ' ');  // one log line per failure
    return message;
  }

  // Connects within the connect timeout. nullptr with `error` set, or on close() (error empty).
  Conn connect(std::string& error) {
    Conn conn(internal::start_native(options.conninfo, options.timeouts, options.application_name),
              PQfinish);
    if (!conn || PQstatus(conn.get()) == CONNECTION_BAD) {
      error = "cannot connect: " + error_of(conn.get());
      return Conn(nullptr, PQfinish);
    }
    const auto deadline = Clock::now() + options.timeouts.connect;
    for (auto state = PGRES_POLLING_WRITING; state != PGRES_POLLING_OK;) {
      if (state == PGRES_POLLING_FAILED) {
        error = "cannot connect: " + error_of(conn.get());
        return Conn(nullptr, PQfinish);
      }
      const short events = state == PGRES_POLLING_READING ? POLLIN : POLLOUT;
      switch (wait(PQsocket(conn.get()), events, deadline)) {
        case Wait::Stopped:
          return Conn(nullptr, PQfinish);
        case Wait::TimedOut:
          error = "cannot connect: no answer within the connect timeout";
          return Conn(nullptr, PQfinish);
        case Wait::Ready:
          state = PQconnectPoll(conn.get());
      }
    }
    if (PQsetnonblocking(conn.get(), 1) != 0) {
      error = "cannot connect: " + error_of(conn.get());
      return Conn(nullptr, PQfinish);
    }
    return conn;
  }

  // Sends `sql` and reads its results within the io timeout; false with `error` set (or on
  // close(), error empty). Notifications read meanwhile stay queued for PQnotifies.
  bool run_query(PGconn* conn, const std::string& sql, std::string& error) {
    const auto deadline = Clock::now() + options.timeouts.io;
    if (PQsendQuery(conn, sql.c_str()) == 0) {
      error = sql + ": " + error_of(conn);
      return false;
    }
    for (;;) {
      const int flushed = PQflush(conn);
      if (flushed < 0) {
        error = sql + ": " + error_of(conn);
        return false;
      }
      if (flushed == 0 && PQisBusy(conn) == 0) {
        break;
      }
      switch (wait(PQsocket(conn), static_cast<short>(flushed > 0 ? POLLIN | POLLOUT : POLLIN),
                   deadline)) {
        case Wait::Stopped:
          return false;
        case Wait::TimedOut:
          error = sql + ": no answer within the io timeout";
          return false;
        case Wait::Ready:
          if (PQconsumeInput(conn) == 0) {
            error = sql + ": " + error_of(conn);
            return false;
          }
      }
    }
    bool ok = true;
    while (PGresult* res = PQgetResult(conn)) {
      const auto status = PQresultStatus(res);
      if (status != PGRES_COMMAND_OK && status != PGRES_TUPLES_OK) {
        ok = false;
        error = sql + ": " + error_of(conn);
      }
      PQclear(res);
    }
    return ok;
  }

  bool drain_notifications(PGconn* conn) {
    bool any = false;
    while (PGnotify* n = PQnotifies(conn)) {
      PQfreemem(n);
      any = true;  // any number of notifications: one poll
    }
    return any;
  }

  void run() {
    auto backoff = kFirstRetry;
    int failures = 0;
    auto fail = [&](const std::string& what) {
      if (worth_logging(++failures)) {
        log(LogLevel::Warning, "NotificationWatcher: " + what + " (" + std::to_string(failures) +
                                   " in a row; polling on the interval meanwhile)");
      }
    };
    for (;;) {
      std::string error;
      Conn conn = connect(error);
      if (conn && !run_query(conn.get(), listen_sql, error)) {
        conn.reset();
      }
      if (!conn) {
        if (error.empty()) {
          return;  // closed
        }
        fail(error);
        if (wait(-1, 0, Clock::now() + backoff) == Wait::Stopped) {
          return;
        }
        backoff = std::min(backoff * 2, options.reconnect_max);
        continue;
      }
      log(LogLevel::Info, std::string("NotificationWatcher: listening") +
                              (failures > 0 ? " again" : "") + " on channel " +
                              listen_sql.substr(7));
      failures = 0;
      backoff = kFirstRetry;
      drain_notifications(conn.get());  // what came with LISTEN's answer: the Connected poll
      signal(Signal::Connected);
      // Idle: notifications as they come; after keepalive_idle of silence a query proves the
      // session still answers (TCP keepalives cannot: a frozen backend's kernel still acks).
      for (;;) {
        const auto got =
            wait(PQsocket(conn.get()), POLLIN, Clock::now() + options.timeouts.keepalive_idle);
        if (got == Wait::Stopped) {
          return;
        }
        if (got == Wait::TimedOut) {
          if (!run_query(conn.get(), "SELECT 1", error)) {
            if (error.empty()) {
              return;
            }
            fail("the LISTEN session stopped answering: " + error);
            break;
          }
        } else if (PQconsumeInput(conn.get()) == 0 || PQstatus(conn.get()) != CONNECTION_OK) {
          fail("connection lost: " + error_of(conn.get()));
          break;
        }
        if (drain_notifications(conn.get())) {
          signal(Signal::Changed);
        }
      }
    }
  }
};

NotificationWatcher::NotificationWatcher(Options options) : impl_(std::make_unique<Impl>()) {
  if (options.conninfo.empty()) {
    throw std::invalid_argument("NotificationWatcher: conninfo is required");
  }
  if (options.reconnect_max < kFirstRetry) {
    throw std::invalid_argument("NotificationWatcher: reconnect_max must be at least 100 ms");
  }
  impl_->listen_sql = "LISTEN " + quoted_identifier(notification_channel(options.table));
  impl_->options = std::move(options);
  impl_->stop_fd = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (impl_->stop_fd < 0) {
    throw std::runtime_error(std::string("NotificationWatcher: eventfd: ") + std::strerror(errno));
  }
}

NotificationWatcher::~NotificationWatcher() {
  close();
}

void NotificationWatcher::start(std::function<void(Signal)> signal) {
  std::lock_guard lock(impl_->mutex);
  if (impl_->started || impl_->closed) {
    return;
  }
  impl_->started = true;
  impl_->signal = std::move(signal);
  impl_->thread = std::thread([impl = impl_.get()] { impl->run(); });
}

void NotificationWatcher::close() {
  std::thread thread;
  {
    std::lock_guard lock(impl_->mutex);
    if (impl_->closed) {
      return;
    }
    impl_->closed = true;
    thread = std::move(impl_->thread);
  }
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(impl_->stop_fd, &one, sizeof one);
  if (thread.joinable()) {
    thread.join();
  }
}

}  // namespace outbox::postgres
