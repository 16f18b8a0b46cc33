#include "outbox/internal/writes_first.hpp"

namespace outbox::internal {
namespace {

thread_local bool t_writes_first = false;  // inside a WritesFirst scope

}  // namespace

WritesFirst::WritesFirst() : outer_(t_writes_first) {
  t_writes_first = true;
}

WritesFirst::~WritesFirst() {
  t_writes_first = outer_;
}

bool WritesFirst::active() {
  return t_writes_first;
}

}  // namespace outbox::internal
