#pragma once
// The database options every `outbox` command that reads or changes a table takes.

#include <CLI/CLI.hpp>
#include <string>

namespace outbox::cli {

struct DbOptions {
  std::string url;
  std::string table = "outbox_event";
};

/// Adds --db (required; env OUTBOX_DB_URL) and --table to `cmd`.
inline void add_db_options(CLI::App& cmd, DbOptions& db) {
  cmd.add_option("--db", db.url,
                 "database URL: sqlite:///path.db, postgresql://…, mysql://… (env OUTBOX_DB_URL)")
      ->envname("OUTBOX_DB_URL")
      ->required();
  cmd.add_option("--table", db.table, "outbox table name")->capture_default_str();
}

}  // namespace outbox::cli
