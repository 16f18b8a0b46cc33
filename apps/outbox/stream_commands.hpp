#pragma once
// `outbox subscriptions …` and `outbox stream …`: stream mode from the command line.

#include <CLI/CLI.hpp>

#include <optional>
#include <string>
#include <vector>
#include "db_options.hpp"

namespace outbox::cli {

class StreamCommands {
 public:
  /// Registers the commands under `app`.
  explicit StreamCommands(CLI::App& app);
  /// Runs the command that was parsed: its exit code; nullopt when none of these was parsed.
  /// Throws like the library (std::invalid_argument for bad input, StoreError, StreamError).
  std::optional<int> run();

 private:
  DbOptions db_;
  bool json_ = false;
  std::string name_;
  std::string publisher_, target_, start_ = "beginning", to_;
  std::vector<std::string> event_types_, aggregate_types_, required_tags_, any_of_tags_;
  CLI::App* subscriptions_ = nullptr;
  CLI::App *list_ = nullptr, *lag_ = nullptr, *add_ = nullptr, *remove_ = nullptr;
  CLI::App *pause_ = nullptr, *resume_ = nullptr, *reset_ = nullptr, *rewind_ = nullptr;
  CLI::App* stream_ = nullptr;
  CLI::App *stream_status_ = nullptr, *rebase_ = nullptr;
};

}  // namespace outbox::cli
