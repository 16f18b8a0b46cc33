#pragma once
// The SQLite entry of the engine registry (outbox/detect).

#include "outbox/sql/engine.hpp"

namespace outbox::sqlite {

/// URLs, driver, dialect, store, purger, schema and migration lock of this engine.
const sql::Engine& engine();

}  // namespace outbox::sqlite
