#pragma once
// The MariaDB/MySQL entry of the engine registry (outbox/detect).

#include "outbox/sql/engine.hpp"

namespace outbox::mysql {

/// URLs, driver, dialect, store, purger, schema and migration lock of this engine.
const sql::Engine& engine();

}  // namespace outbox::mysql
