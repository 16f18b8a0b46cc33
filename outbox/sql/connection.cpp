#include "outbox/sql/connection.hpp"

#include <array>
#include <cctype>

namespace outbox::sql {
namespace {

// Words that start, end or partly undo a transaction in some engine's SQL. Matched as whole
// words anywhere in a statement (comments, several statements in one text and procedure calls
// included): a false match only costs a check after commit, a missed one could deliver an event
// whose row was undone.
constexpr std::array<std::string_view, 13> kControlWords = {
    "SAVEPOINT", "ROLLBACK", "COMMIT",  "RELEASE", "BEGIN", "START", "END",
    "ABORT",     "CHAIN",    "PREPARE", "EXECUTE", "CALL",  "XA"};

bool is_word_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) != 0 || c == '_';
}

bool is_control_word(std::string_view word) {
  if (word.size() < 2 || word.size() > 9) {
    return false;
  }
  char upper[9];
  for (std::size_t i = 0; i < word.size(); ++i) {
    upper[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(word[i])));
  }
  const std::string_view w(upper, word.size());
  for (const auto k : kControlWords) {
    if (w == k) {
      return true;
    }
  }
  return false;
}

}  // namespace

void Connection::track_statement(std::string_view sql) noexcept {
  if (suspect_) {
    return;
  }
  std::size_t i = 0;
  while (i < sql.size()) {
    if (!is_word_char(sql[i])) {
      ++i;
      continue;
    }
    const std::size_t start = i;
    while (i < sql.size() && is_word_char(sql[i])) {
      ++i;
    }
    // MariaDB runs /*!50000ROLLBACK*/ (a versioned comment): the version glues to the word.
    std::size_t word = start;
    while (word < i && std::isdigit(static_cast<unsigned char>(sql[word])) != 0) {
      ++word;
    }
    if (is_control_word(sql.substr(word, i - word))) {
      suspect_ = true;
      return;
    }
  }
}

}  // namespace outbox::sql
