#include "outbox/log.hpp"

#include <atomic>
#include <cstdio>
#include <memory>
#include <mutex>

namespace outbox {
namespace {

std::mutex sink_mutex;
std::shared_ptr<const LogSink> current_sink;  // guarded by sink_mutex; null = stderr
std::atomic<int> min_level{static_cast<int>(LogLevel::Info)};

const char* level_name(LogLevel level) {
  switch (level) {
    case LogLevel::Debug:
      return "DEBUG";
    case LogLevel::Info:
      return "INFO";
    case LogLevel::Warning:
      return "WARN";
    case LogLevel::Error:
      return "ERROR";
  }
  return "?";
}

}  // namespace

void set_log_sink(LogSink sink) {
  std::shared_ptr<const LogSink> next;
  if (sink) {
    next = std::make_shared<const LogSink>(std::move(sink));
  }
  std::lock_guard lock(sink_mutex);
  current_sink = std::move(next);
}

void set_log_level(LogLevel level) {
  min_level.store(static_cast<int>(level));
}

void log(LogLevel level, std::string_view message) noexcept {
  if (static_cast<int>(level) < min_level.load(std::memory_order_relaxed)) {
    return;
  }
  std::shared_ptr<const LogSink> sink;
  {
    std::lock_guard lock(sink_mutex);
    sink = current_sink;
  }
  try {
    if (sink) {
      (*sink)(level, message);
    } else {
      std::fprintf(stderr, "outbox %s: %.*s\n", level_name(level), static_cast<int>(message.size()),
                   message.data());
    }
  } catch (...) {
    // A failing sink must not take a worker thread down with it.
  }
}

}  // namespace outbox
