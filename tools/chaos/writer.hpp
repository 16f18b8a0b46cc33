#pragma once
// A chaos writer process: business transactions that each insert ledger rows and their events,
// sometimes rolled back on purpose (whole or through a savepoint), until SIGTERM.

#include <string>

namespace outbox::chaos {

/// The business table (`<table>_ledger`) every writer inserts into in the same transaction as the
/// events: what it holds after a run is exactly what committed.
std::string ledger_table(const std::string& table);

struct WriterOptions {
  std::string db;               ///< database URL
  std::string table;            ///< outbox table
  std::string dir;              ///< where the rolled-back ledger goes
  std::string mode;             ///< groups | concurrent | ordered | subscription
  int index = 0;                ///< this writer's number; its keys are w<index>-k<n>
  int keys = 16;                ///< keys of this writer
  int rate = 50;                ///< transactions per second
  unsigned long long seed = 1;  ///< its choices
};

/// The file of ids writer `index` rolled back on purpose, one per line.
std::string rolled_back_file(const std::string& dir, int index);

/// Runs until SIGTERM; database errors (server gone, disk full, connection killed) are counted and
/// retried, never fatal. Returns the process exit code.
int run_writer(const WriterOptions& options);

}  // namespace outbox::chaos
