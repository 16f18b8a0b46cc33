#pragma once
// Process-wide logging seam: the core has no logging dependency and reports through a LogSink.

#include <functional>
#include <string_view>

namespace outbox {

enum class LogLevel { Debug, Info, Warning, Error };

/// Receives every log line of the library. Must be thread-safe; called from background threads.
using LogSink = std::function<void(LogLevel, std::string_view message)>;

/// Installs the process-wide sink (an empty function restores the stderr default). Thread-safe.
void set_log_sink(LogSink sink);

/// Sets the lowest level passed to the sink (default Info). Thread-safe.
void set_log_level(LogLevel level);

/// Sends one line to the current sink if `level` passes the threshold. Never throws.
void log(LogLevel level, std::string_view message) noexcept;

}  // namespace outbox
