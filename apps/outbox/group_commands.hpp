#pragma once
// `outbox groups …`: message groups an operator may have to act on, and the actions.

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include "db_options.hpp"

namespace outbox::cli {

class GroupCommands {
 public:
  /// Registers the commands under `app`.
  explicit GroupCommands(CLI::App& app);
  /// Runs the command that was parsed: its exit code; nullopt when none of these was parsed.
  /// Throws like the library (std::invalid_argument for bad input, StoreError).
  std::optional<int> run();

 private:
  DbOptions db_;
  bool json_ = false;
  int limit_ = 100;
  std::string key_;
  CLI::App* groups_ = nullptr;
  CLI::App *list_ = nullptr, *show_ = nullptr;
  CLI::App *retry_ = nullptr, *skip_head_ = nullptr, *dead_letter_ = nullptr;
};

}  // namespace outbox::cli
