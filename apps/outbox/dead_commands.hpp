#pragma once
// `outbox dead …`: DEAD events listed, grouped by failure fingerprint, replayed or discarded.

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>

#include "db_options.hpp"

namespace outbox::cli {

class DeadCommands {
 public:
  /// Registers the commands under `app`.
  explicit DeadCommands(CLI::App& app);
  /// Runs the command that was parsed: its exit code; nullopt when none of these was parsed.
  /// Throws like the library (std::invalid_argument for bad input, StoreError).
  std::optional<int> run();

 private:
  DbOptions db_;
  std::string type_, aggregate_, fingerprint_;
  std::vector<std::string> ids_;
  int limit_ = 100;
  int group_limit_ = 100000;
  int top_ = 1000;
  bool json_ = false;
  CLI::App* dead_ = nullptr;
  CLI::App *list_ = nullptr, *groups_ = nullptr, *replay_ = nullptr, *replay_all_ = nullptr,
           *discard_ = nullptr;
};

}  // namespace outbox::cli
