#include "outbox/sql/engine.hpp"

namespace outbox::sql {

void finish_transaction(Connection& conn, bool commit) {
  if (commit) {
    conn.commit();
  } else {
    conn.rollback();
  }
}

}  // namespace outbox::sql
