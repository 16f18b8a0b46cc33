#include "outbox/relay/log_publisher.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>

#include "outbox/json_codec.hpp"

namespace outbox::relay {

LogPublisher::LogPublisher(const std::string& path)
    : out_(path.empty() ? stdout : std::fopen(path.c_str(), "a")), owned_(!path.empty()) {
  if (out_ == nullptr) {
    throw std::invalid_argument("log publisher: cannot open " + path + ": " + std::strerror(errno));
  }
}

LogPublisher::~LogPublisher() {
  if (owned_) {
    std::fclose(out_);
  }
}

std::vector<PublishResult> LogPublisher::publish(std::span<const PublishRequest> batch) {
  std::vector<PublishResult> results;
  results.reserve(batch.size());
  std::string lines;
  for (const auto& request : batch) {
    try {
      std::string line = "{\"target\":";
      append_json_string(line, request.target);
      line += ",\"event\":" + to_json_object(*request.event) + "}\n";
      lines += line;
      results.push_back(PublishResult::ok());
    } catch (const std::exception& e) {
      results.push_back(PublishResult::permanent(std::string("log: ") + e.what()));
    }
  }
  std::lock_guard lock(out_mutex_);
  if (std::fwrite(lines.data(), 1, lines.size(), out_) != lines.size() || std::fflush(out_) != 0) {
    const std::string reason = std::string("log: write failed: ") + std::strerror(errno);
    for (auto& r : results) {
      if (r.is_ok()) {
        r = PublishResult::retriable(reason);
      }
    }
  }
  return results;
}

}  // namespace outbox::relay
