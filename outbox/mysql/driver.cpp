#include "outbox/mysql/driver.hpp"

#include <errmsg.h>
#include <mysql.h>
#include <mysqld_error.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <stdexcept>
#include <unordered_map>
#include <utility>

#include "outbox/errors.hpp"
#include "outbox/internal/redact.hpp"

namespace outbox::mysql {
namespace {

using StmtPtr = std::unique_ptr<MYSQL_STMT, decltype(&mysql_stmt_close)>;

bool is_integer(enum_field_types t) {
  return t == MYSQL_TYPE_TINY || t == MYSQL_TYPE_SHORT || t == MYSQL_TYPE_LONG ||
         t == MYSQL_TYPE_LONGLONG || t == MYSQL_TYPE_INT24 || t == MYSQL_TYPE_YEAR;
}

// The session is over: the client lost the server, or the server ended the session (KILL).
bool is_lost_link(unsigned err) {
  return err == CR_SERVER_GONE_ERROR || err == CR_SERVER_LOST || err == CR_SERVER_LOST_EXTENDED ||
         err == ER_CONNECTION_KILLED;
}

class MyConnection final : public sql::Connection {
 public:
  MyConnection(MYSQL* conn, bool owned) : conn_(conn), owned_(owned) {}
  ~MyConnection() override {
    statements_.clear();
    if (owned_) {
      mysql_close(conn_);
    }
  }
  MyConnection(const MyConnection&) = delete;
  MyConnection& operator=(const MyConnection&) = delete;

  using sql::Connection::execute;
  using sql::Connection::query;

  std::int64_t execute(std::string_view sql, std::span<const sql::Value> params) override {
    track_statement(sql);
    if (params.empty()) {
      simple(sql);
      const auto n = mysql_affected_rows(conn_);
      return n == static_cast<my_ulonglong>(-1) ? 0 : static_cast<std::int64_t>(n);
    }
    MYSQL_STMT* st = run(sql, params);
    const auto n = static_cast<std::int64_t>(mysql_stmt_affected_rows(st));
    mysql_stmt_free_result(st);
    return n;
  }

  std::vector<sql::Row> query(std::string_view sql, std::span<const sql::Value> params) override {
    track_statement(sql);
    MYSQL_STMT* st = run(sql, params);
    std::vector<sql::Row> rows;
    MYSQL_RES* meta = mysql_stmt_result_metadata(st);
    if (meta == nullptr) {
      mysql_stmt_free_result(st);
      return rows;
    }
    const unsigned n = mysql_num_fields(meta);
    MYSQL_FIELD* fields = mysql_fetch_fields(meta);
    std::vector<MYSQL_BIND> binds(n);
    std::vector<unsigned long> lengths(n, 0);
    std::vector<my_bool> nulls(n, 0);
    std::vector<long long> ints(n, 0);
    for (unsigned i = 0; i < n; ++i) {
      std::memset(&binds[i], 0, sizeof(MYSQL_BIND));
      binds[i].length = &lengths[i];
      binds[i].is_null = &nulls[i];
      if (is_integer(fields[i].type)) {
        binds[i].buffer_type = MYSQL_TYPE_LONGLONG;
        binds[i].buffer = &ints[i];
      } else {
        // Zero-length buffer: the fetch reports the length, fetch_column then reads the value.
        binds[i].buffer_type = MYSQL_TYPE_BLOB;
      }
    }
    if (mysql_stmt_bind_result(st, binds.data()) != 0) {
      mysql_free_result(meta);
      fail_stmt(st, sql);
    }
    for (;;) {
      const int rc = mysql_stmt_fetch(st);
      if (rc == MYSQL_NO_DATA) {
        break;
      }
      if (rc == 1) {
        mysql_free_result(meta);
        fail_stmt(st, sql);
      }
      std::vector<sql::Value> values;
      values.reserve(n);
      for (unsigned i = 0; i < n; ++i) {
        if (nulls[i]) {
          values.emplace_back(std::monostate{});
        } else if (is_integer(fields[i].type)) {
          values.emplace_back(static_cast<std::int64_t>(ints[i]));
        } else {
          std::string data(lengths[i], '\0');
          if (lengths[i] > 0) {
            MYSQL_BIND b;
            std::memset(&b, 0, sizeof b);
            b.buffer_type = MYSQL_TYPE_BLOB;
            b.buffer = data.data();
            b.buffer_length = lengths[i];
            if (mysql_stmt_fetch_column(st, &b, i, 0) != 0) {
              mysql_free_result(meta);
              fail_stmt(st, sql);
            }
          }
          // charset 63 is "binary": BLOB/VARBINARY columns come back as bytes.
          if (fields[i].charsetnr == 63 && fields[i].type != MYSQL_TYPE_NEWDECIMAL) {
            values.emplace_back(sql::Blob{std::vector<std::uint8_t>(data.begin(), data.end())});
          } else {
            values.emplace_back(std::move(data));
          }
        }
      }
      rows.emplace_back(std::move(values));
    }
    mysql_free_result(meta);
    mysql_stmt_free_result(st);
    return rows;
  }

  void begin() override {
    reset_suspect();
    simple("START TRANSACTION");
    begun_ = true;
    ended_by_error_ = false;
  }
  void commit() override {
    const bool begun = std::exchange(begun_, false);
    if (broken_) {
      fail(CR_SERVER_GONE_ERROR, "08S01", "connection was lost earlier; nothing was committed",
           "COMMIT");
    }
    if (begun && ended_by_error_) {
      throw StoreError(
          "mysql: COMMIT refused: the server rolled the transaction back after an earlier error "
          "(deadlock or lock wait timeout); nothing was committed [SQLSTATE 40001]",
          "40001");
    }
    if (begun && !in_transaction()) {
      throw StoreError(
          "mysql: COMMIT refused: the transaction had already ended (a statement such as DDL "
          "committed it implicitly); statements after it were autocommitted [SQLSTATE 25000]",
          "25000");
    }
    try {
      simple("COMMIT");
    } catch (const ConnectionLostError& e) {
      throw CommitOutcomeUnknownError(
          std::string("mysql: the connection was lost during COMMIT: the transaction may or may "
                      "not have committed; ") +
              e.what(),
          e.sqlstate());
    }
  }
  void rollback() override {
    const bool begun = std::exchange(begun_, false);
    if (broken_) {
      fail(CR_SERVER_GONE_ERROR, "08S01",
           "connection was lost earlier; the server rolled the transaction back", "ROLLBACK");
    }
    if (begun && ended_by_error_) {
      return;  // the server rolled it back already
    }
    if (begun && !in_transaction()) {
      throw StoreError(
          "mysql: ROLLBACK impossible: the transaction had already been committed implicitly "
          "(e.g. by DDL); what it wrote before that is committed [SQLSTATE 25000]",
          "25000");
    }
    simple("ROLLBACK");
  }
  bool in_transaction() const override {
    if (ended_by_error_ || broken_) {
      return false;
    }
    unsigned int status = 0;
    if (mariadb_get_infov(conn_, MARIADB_CONNECTION_SERVER_STATUS, &status) != 0) {
      return false;
    }
    return (status & SERVER_STATUS_IN_TRANS) != 0;
  }
  std::string_view dialect() const override { return "mysql"; }
  bool session_reusable() const override {
    unsigned int status = 0;
    if (mariadb_get_infov(conn_, MARIADB_CONNECTION_SERVER_STATUS, &status) != 0) {
      return false;
    }
    return (status & SERVER_STATUS_AUTOCOMMIT) != 0;
  }
  bool is_broken() const override { return broken_; }
  bool alive(std::chrono::milliseconds idle_for) noexcept override {
    if (broken_) {
      return false;
    }
    // A server that restarted or killed the session closed the socket: a non-blocking peek
    // sees EOF (or its error packet) without a round trip.
    const int fd = static_cast<int>(mysql_get_socket(conn_));
    char byte;
    const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK) || n > 0) {
      return false;  // an idle session has nothing to read unless the server is saying goodbye
    }
    // Long idle: ask (a host that vanished sends nothing at all).
    return idle_for < std::chrono::seconds(10) || mysql_ping(conn_) == 0;
  }

 private:
  [[noreturn]] void fail(unsigned err, const char* sqlstate, const char* message,
                         std::string_view sql) {
    const bool lost = is_lost_link(err);
    bool usable = false;  // an error on a lost link, or outside any transaction
    if (lost) {
      broken_ = true;
    } else if (begun_) {
      if (!ended_by_error_) {
        // Error packets carry no status flags: ask whether this error (a deadlock, a lock wait
        // timeout with innodb_rollback_on_timeout, …) ended the transaction.
        ended_by_error_ = !server_in_transaction();
      }
      usable = !ended_by_error_;
    } else if (!owned_) {
      usable = server_in_transaction();  // the caller's own transaction, begun on its handle
    }
    std::string state = sqlstate != nullptr ? sqlstate : "";
    if (state == "00000") {
      state.clear();
    }
    if (lost && (state.empty() || state == "HY000")) {
      state = "08S01";  // communication link failure: the client errors carry no state of their own
    }
    const std::string text = "mysql error " + std::to_string(err) + ": " + message +
                             (state.empty() ? "" : " [SQLSTATE " + state + "]") + " [" +
                             std::string(sql.substr(0, 200)) + "]";
    if (lost) {
      throw ConnectionLostError(text, state);
    }
    if (err == ER_DUP_ENTRY) {
      throw UniqueViolationError(text, state, usable);
    }
    throw StoreError(text, state, usable);
  }
  [[noreturn]] void fail_conn(std::string_view sql) {
    fail(mysql_errno(conn_), mysql_sqlstate(conn_), mysql_error(conn_), sql);
  }
  [[noreturn]] void fail_stmt(MYSQL_STMT* st, std::string_view sql) {
    const unsigned err = mysql_stmt_errno(st);
    std::string state = mysql_stmt_sqlstate(st);
    std::string message = mysql_stmt_error(st);
    mysql_stmt_reset(st);
    if (is_lost_link(err)) {
      statements_.clear();  // statements die with the link
    }
    fail(err, state.c_str(), message.c_str(), sql);
  }

  void simple(std::string_view sql) {
    if (broken_) {
      fail(CR_SERVER_GONE_ERROR, "08S01", "connection was lost earlier", sql);
    }
    if (begun_) {
      check_open(sql);
    }
    if (mysql_real_query(conn_, sql.data(), static_cast<unsigned long>(sql.size())) != 0) {
      fail_conn(sql);
    }
    // Drain any result set a parameterless statement produced.
    do {
      if (MYSQL_RES* res = mysql_store_result(conn_)) {
        mysql_free_result(res);
      }
    } while (mysql_next_result(conn_) == 0);
  }

  MYSQL_STMT* prepare(std::string_view sql) {
    auto it = statements_.find(sql);
    if (it != statements_.end()) {
      return it->second.get();
    }
    StmtPtr st(mysql_stmt_init(conn_), &mysql_stmt_close);
    if (!st) {
      fail_conn(sql);
    }
    if (mysql_stmt_prepare(st.get(), sql.data(), static_cast<unsigned long>(sql.size())) != 0) {
      const unsigned err = mysql_stmt_errno(st.get());
      std::string state = mysql_stmt_sqlstate(st.get());
      std::string message = mysql_stmt_error(st.get());
      fail(err, state.c_str(), message.c_str(), sql);
    }
    if (statements_.size() >= 128) {
      statements_.clear();
    }
    auto* raw = st.get();
    statements_.emplace(std::string(sql), std::move(st));
    return raw;
  }

  // Refuses statements once the transaction begun here has ended behind our back: run now they
  // would autocommit, and an outbox row could outlive the rollback of the business rows.
  void check_open(std::string_view sql) const {
    if (begun_ && !in_transaction()) {
      throw StoreError(std::string("mysql: the transaction begun on this connection has already "
                                   "ended (") +
                           (ended_by_error_ ? "rolled back by the server after an error"
                                            : "committed implicitly, e.g. by DDL") +
                           "); roll back and begin again [" + std::string(sql.substr(0, 200)) + "]",
                       ended_by_error_ ? "40001" : "25000");
    }
  }

  bool server_in_transaction() {
    static constexpr std::string_view kQuery = "SELECT @@in_transaction";
    if (mysql_real_query(conn_, kQuery.data(), kQuery.size()) != 0) {
      return false;
    }
    bool in = false;
    if (MYSQL_RES* res = mysql_store_result(conn_)) {
      if (MYSQL_ROW row = mysql_fetch_row(res); row != nullptr && row[0] != nullptr) {
        in = std::string_view(row[0]) == "1";
      }
      mysql_free_result(res);
    }
    return in;
  }

  MYSQL_STMT* run(std::string_view sql, std::span<const sql::Value> params) {
    if (broken_) {
      fail(CR_SERVER_GONE_ERROR, "08S01", "connection was lost earlier", sql);
    }
    check_open(sql);
    MYSQL_STMT* st = prepare(sql);
    if (mysql_stmt_param_count(st) != params.size()) {
      throw StoreError("mysql: statement expects " + std::to_string(mysql_stmt_param_count(st)) +
                       " parameters, got " + std::to_string(params.size()) + ": " +
                       std::string(sql));
    }
    std::vector<MYSQL_BIND> binds(params.size());
    std::vector<long long> ints(params.size());
    std::vector<double> doubles(params.size());
    std::vector<unsigned long> lengths(params.size());
    static char kEmpty = 0;
    for (std::size_t i = 0; i < params.size(); ++i) {
      MYSQL_BIND& b = binds[i];
      std::memset(&b, 0, sizeof b);
      std::visit(
          [&](const auto& x) {
            using T = std::decay_t<decltype(x)>;
            auto text = [&](const char* p, std::size_t n, enum_field_types type) {
              b.buffer_type = type;
              b.buffer = n == 0 ? &kEmpty : const_cast<char*>(p);
              lengths[i] = static_cast<unsigned long>(n);
              b.buffer_length = lengths[i];
              b.length = &lengths[i];
            };
            if constexpr (std::is_same_v<T, std::monostate>) {
              b.buffer_type = MYSQL_TYPE_NULL;
            } else if constexpr (std::is_same_v<T, std::int64_t>) {
              ints[i] = x;
              b.buffer_type = MYSQL_TYPE_LONGLONG;
              b.buffer = &ints[i];
            } else if constexpr (std::is_same_v<T, double>) {
              doubles[i] = x;
              b.buffer_type = MYSQL_TYPE_DOUBLE;
              b.buffer = &doubles[i];
            } else if constexpr (std::is_same_v<T, std::string>) {
              text(x.data(), x.size(), MYSQL_TYPE_STRING);
            } else if constexpr (std::is_same_v<T, sql::TextRef>) {
              text(x.text.data(), x.text.size(), MYSQL_TYPE_STRING);
            } else {
              text(reinterpret_cast<const char*>(x.bytes.data()), x.bytes.size(), MYSQL_TYPE_BLOB);
            }
          },
          params[i]);
    }
    if (!params.empty() && mysql_stmt_bind_param(st, binds.data()) != 0) {
      fail_stmt(st, sql);
    }
    if (mysql_stmt_execute(st) != 0) {
      fail_stmt(st, sql);
    }
    return st;
  }

  struct SqlHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };

  MYSQL* conn_;
  bool owned_;
  bool broken_ = false;
  bool begun_ = false;           // between begin() and commit()/rollback()
  bool ended_by_error_ = false;  // the server rolled back the transaction begun here
  std::unordered_map<std::string, StmtPtr, SqlHash, std::equal_to<>> statements_;
};

void library_init() {
  static std::once_flag once;
  std::call_once(once, [] { mysql_library_init(0, nullptr, nullptr); });
}

}  // namespace

ConnectOptions parse_url(const std::string& url, const char* password_env) {
  ConnectOptions o;
  std::string rest;
  for (const char* scheme : {"mysql://", "mariadb://"}) {
    if (url.rfind(scheme, 0) == 0) {
      rest = url.substr(std::strlen(scheme));
    }
  }
  if (rest.empty()) {
    throw std::invalid_argument("not a mysql:// or mariadb:// URL: " + internal::redact_url(url));
  }
  const auto slash = rest.find('/');
  if (slash == std::string::npos || slash + 1 == rest.size()) {
    throw std::invalid_argument("the URL names no database: " + internal::redact_url(url));
  }
  o.database = rest.substr(slash + 1);
  std::string authority = rest.substr(0, slash);
  const auto at = authority.rfind('@');
  if (at != std::string::npos) {
    std::string userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const auto colon = userinfo.find(':');
    o.user = userinfo.substr(0, colon);
    if (colon != std::string::npos) {
      o.password = userinfo.substr(colon + 1);
    }
  }
  const auto colon = authority.rfind(':');
  o.host = authority.substr(0, colon);
  if (colon != std::string::npos) {
    const std::string port = authority.substr(colon + 1);
    char* end = nullptr;
    const long p = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || p <= 0 || p > 65535) {
      throw std::invalid_argument("bad port in URL: " + internal::redact_url(url));
    }
    o.port = static_cast<unsigned>(p);
  }
  if (o.host.empty()) {
    throw std::invalid_argument("the URL names no host: " + internal::redact_url(url));
  }
  if (o.password.empty() && password_env != nullptr) {
    if (const char* p = std::getenv(password_env)) {
      o.password = p;
    }
  }
  return o;
}

std::unique_ptr<sql::Connection> connect(const ConnectOptions& o) {
  library_init();
  MYSQL* conn = mysql_init(nullptr);
  if (conn == nullptr) {
    throw StoreError("mysql: out of memory creating a connection");
  }
  auto seconds = [](std::chrono::milliseconds d) {
    return static_cast<unsigned>(std::max<std::int64_t>(1, (d.count() + 999) / 1000));
  };
  const unsigned connect_s = seconds(o.timeouts.connect), io_s = seconds(o.timeouts.io);
  mysql_options(conn, MYSQL_OPT_CONNECT_TIMEOUT, &connect_s);
  // Without these a read from a server that vanished waits forever (and so does a relay's stop).
  mysql_options(conn, MYSQL_OPT_READ_TIMEOUT, &io_s);
  mysql_options(conn, MYSQL_OPT_WRITE_TIMEOUT, &io_s);
  mysql_options(conn, MYSQL_SET_CHARSET_NAME, "utf8mb4");
  if (mysql_real_connect(conn, o.host.c_str(), o.user.c_str(), o.password.c_str(),
                         o.database.c_str(), o.port, nullptr, CLIENT_FOUND_ROWS) == nullptr) {
    std::string msg = mysql_error(conn);
    std::string state = mysql_sqlstate(conn);
    mysql_close(conn);
    throw ConnectionLostError(
        "mysql: cannot connect to " + o.host + ":" + std::to_string(o.port) + ": " + msg,
        state == "00000" ? "08001" : state);
  }
  auto wrapped = std::make_unique<MyConnection>(conn, true);
  // UTC so DATETIME values mean the same on every node; READ COMMITTED so claims take no gap
  // locks that would stall concurrent inserts.
  wrapped->execute("SET SESSION time_zone = '+00:00'");
  wrapped->execute("SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED");
  // Strict, whatever the server's default: a value too long for its column is an error, never
  // silently cut (a cut event id once delivered one event under two ids).
  wrapped->execute(
      "SET SESSION sql_mode = CONCAT(@@SESSION.sql_mode, IF(@@SESSION.sql_mode = '', '', ','), "
      "'STRICT_ALL_TABLES')");
  return wrapped;
}

std::unique_ptr<sql::Connection> connect(const std::string& url) {
  return connect(parse_url(url));
}

std::unique_ptr<sql::Connection> wrap(st_mysql* conn) {
  if (conn == nullptr) {
    throw std::invalid_argument("mysql::wrap: null handle");
  }
  return std::make_unique<MyConnection>(conn, false);
}

std::shared_ptr<sql::ConnectionPool> make_pool(const std::string& url, std::size_t max_size,
                                               const sql::NetworkTimeouts& timeouts) {
  auto options = parse_url(url);
  options.timeouts = timeouts;
  return std::make_shared<sql::ConnectionPool>(sql::ConnectionPool::Options{
      .factory = [options] { return connect(options); },
      .max_size = max_size,
  });
}

}  // namespace outbox::mysql
