#include "outbox/sql/connection.hpp"

#include <cctype>

namespace outbox::sql {
namespace {

// True when `sql` starts (after blanks) with the words `prefix` (upper case), case-insensitively.
bool starts_with_words(std::string_view sql, std::string_view prefix) {
  std::size_t i = 0;
  while (i < sql.size() && std::isspace(static_cast<unsigned char>(sql[i])) != 0) {
    ++i;
  }
  std::size_t k = 0;
  for (; k < prefix.size(); ++i) {
    if (i >= sql.size()) {
      return false;
    }
    const auto c = static_cast<unsigned char>(sql[i]);
    if (prefix[k] == ' ') {
      if (std::isspace(c) == 0) {
        return false;
      }
      while (i + 1 < sql.size() && std::isspace(static_cast<unsigned char>(sql[i + 1])) != 0) {
        ++i;
      }
      ++k;
      continue;
    }
    if (std::toupper(c) != prefix[k]) {
      return false;
    }
    ++k;
  }
  return i >= sql.size() || std::isalnum(static_cast<unsigned char>(sql[i])) == 0;
}

// Savepoints named by outbox::Savepoint keep their callbacks in step themselves.
bool ours(std::string_view sql) {
  auto upper = std::string(sql.substr(0, 64));
  for (auto& c : upper) {
    c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  }
  return upper.find("OUTBOX_SP_") != std::string::npos;
}

}  // namespace

void Connection::track_savepoints(std::string_view sql) noexcept {
  if (starts_with_words(sql, "SAVEPOINT")) {
    if (!ours(sql)) {
      ++raw_savepoints_;
    }
  } else if (starts_with_words(sql, "RELEASE")) {
    if (!ours(sql) && raw_savepoints_ > 0) {
      --raw_savepoints_;
    }
  } else if (starts_with_words(sql, "COMMIT") || starts_with_words(sql, "ROLLBACK") ||
             starts_with_words(sql, "BEGIN") || starts_with_words(sql, "START TRANSACTION")) {
    // ROLLBACK TO keeps the savepoint open; a plain ROLLBACK ends them all.
    if (!starts_with_words(sql, "ROLLBACK TO")) {
      raw_savepoints_ = 0;
    }
  }
}

}  // namespace outbox::sql
