#pragma once
// Glob patterns on names (event types, aggregate types): routes and subscription filters.

#include <string_view>

namespace outbox {

/// True when `text` matches `pattern`, where * matches any run of characters and ? any one.
bool glob_match(std::string_view pattern, std::string_view text) noexcept;

}  // namespace outbox
