#pragma once
// Development publisher: one JSON line per event on standard output or a file.

#include <cstdio>
#include <mutex>
#include <string>

#include "outbox/publisher.hpp"

namespace outbox::relay {

/// Writes {"target": …, "event": <to_json_object>} lines, flushed per batch. Thread-safe.
class LogPublisher final : public Publisher {
 public:
  /// Appends to `path`, or writes to standard output when empty. Throws std::invalid_argument
  /// when the file cannot be opened.
  explicit LogPublisher(const std::string& path = {});
  ~LogPublisher() override;
  LogPublisher(const LogPublisher&) = delete;
  LogPublisher& operator=(const LogPublisher&) = delete;

  /// A payload that is not valid JSON is Permanent; a failed write Retriable.
  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override;

 private:
  std::mutex out_mutex_;  // guards out_ (whole lines)
  std::FILE* out_;
  bool owned_;
};

}  // namespace outbox::relay
