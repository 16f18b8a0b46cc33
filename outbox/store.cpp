#include "outbox/store.hpp"

#include <cstdint>
#include <cstdio>
#include <stdexcept>

namespace outbox {

std::string_view to_string(EventStatus status) {
  switch (status) {
    case EventStatus::New:
      return "NEW";
    case EventStatus::Done:
      return "DONE";
    case EventStatus::Retry:
      return "RETRY";
    case EventStatus::Dead:
      return "DEAD";
  }
  return "UNKNOWN";
}

std::string sanitize_utf8(std::string_view text) {
  static constexpr std::string_view kReplacement = "\xEF\xBF\xBD";  // U+FFFD
  std::string out;
  out.reserve(text.size());
  std::size_t i = 0;
  while (i < text.size()) {
    const auto c = static_cast<unsigned char>(text[i]);
    std::size_t len = 0;
    std::uint32_t min = 0;
    std::uint32_t cp = 0;
    if (c == 0) {
      // PostgreSQL refuses NUL in text; it would make the status write fail.
      out += kReplacement;
      ++i;
      continue;
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
      ++i;
      continue;
    }
    if ((c & 0xE0) == 0xC0) {
      len = 2, min = 0x80, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, min = 0x800, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, min = 0x10000, cp = c & 0x07;
    }
    bool ok = len != 0 && i + len <= text.size();
    for (std::size_t k = 1; ok && k < len; ++k) {
      const auto cc = static_cast<unsigned char>(text[i + k]);
      ok = (cc & 0xC0) == 0x80;
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Overlong forms, surrogates and values past U+10FFFF are invalid too.
    ok = ok && cp >= min && cp <= 0x10FFFF && (cp < 0xD800 || cp > 0xDFFF);
    if (ok) {
      out.append(text.substr(i, len));
      i += len;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  return out;
}

std::string truncate_error(std::string_view error) {
  std::string clean = sanitize_utf8(error);
  if (clean.size() <= kMaxErrorLength) {
    return clean;
  }
  std::size_t cut = kMaxErrorLength;
  // Step back over continuation bytes so a multi-byte character is not split.
  while (cut > 0 && (static_cast<unsigned char>(clean[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  clean.resize(cut);
  return clean;
}

EventEnvelope to_envelope(const OutboxEvent& row, const JsonCodec& codec) {
  if (row.unreadable) {
    throw std::invalid_argument("column " + *row.unreadable);
  }
  auto builder = EventEnvelope::builder(EventType::of(row.event_type));
  builder.stored_ = true;
  builder.event_id(row.event_id)
      .occurred_at(row.created_at)
      .aggregate_type(AggregateType::of(row.aggregate_type));
  // The row's due time travels with the event (a due time before created_at, which clients with
  // skewed clocks can write, means "at once" and is left out).
  if (row.available_at > row.created_at) {
    builder.available_at(row.available_at);
  }
  if (row.aggregate_id) {
    builder.aggregate_id(*row.aggregate_id);
  }
  if (row.tenant_id) {
    builder.tenant_id(*row.tenant_id);
  }
  if (row.headers_json) {
    try {
      builder.headers(codec.parse_object(*row.headers_json));
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("headers column: ") + e.what());
    }
  }
  if (row.tags_json) {
    Tags tags;
    try {
      tags = codec.parse_object(*row.tags_json);
    } catch (const std::invalid_argument& e) {
      throw std::invalid_argument(std::string("tags column: ") + e.what());
    }
    // Filters compare tags and publishers write them into JSON: text only, whoever wrote the row.
    for (const auto& [name, value] : tags) {
      if (sanitize_utf8(name) != name || sanitize_utf8(value) != value) {
        throw std::invalid_argument("tags column: tag '" + sanitize_utf8(name.substr(0, 64)) +
                                    "' is not UTF-8 text without NUL");
      }
    }
    builder.tags(tags);
  }
  if (row.message_group) {
    if (sanitize_utf8(*row.message_group) != *row.message_group) {
      throw std::invalid_argument("message_group column is not UTF-8 text without NUL");
    }
    builder.message_group(*row.message_group);
  }
  if (row.payload_is_json) {
    builder.payload_json(row.payload);
  } else {
    builder.payload_bytes(std::vector<std::uint8_t>(row.payload.begin(), row.payload.end()));
  }
  return builder.build();
}

std::string derived_name(std::string_view table, std::string_view suffix) {
  constexpr std::size_t kLimit = 63;
  if (table.size() + suffix.size() <= kLimit) {
    return std::string(table) + std::string(suffix);
  }
  // 64-bit FNV-1a, stable across builds and platforms (32 bits were brute-forced in seconds,
  // and PostgreSQL index names are per schema: a collision left a table without indexes). Of the
  // name in lower case: PostgreSQL and SQLite take `Orders_…` and `orders_…` for one table, which
  // must get one lease table, not two.
  std::uint64_t hash = 14695981039346656037ULL;
  for (const char c : table) {
    const char folded = (c >= 'A' && c <= 'Z') ? static_cast<char>(c - 'A' + 'a') : c;
    hash = (hash ^ static_cast<unsigned char>(folded)) * 1099511628211ULL;
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(hash));
  return std::string(table.substr(0, kLimit - suffix.size() - 17)) + "_" + hex +
         std::string(suffix);
}

}  // namespace outbox

namespace outbox {

void validate_table_name(std::string_view name) {
  auto is_alpha = [](char c) {
    return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || c == '_';
  };
  bool ok = !name.empty() && name.size() <= 63 && is_alpha(name.front());
  for (std::size_t i = 1; ok && i < name.size(); ++i) {
    ok = is_alpha(name[i]) || (name[i] >= '0' && name[i] <= '9');
  }
  if (!ok) {
    throw std::invalid_argument("invalid table name '" + std::string(name) +
                                "': must match ^[A-Za-z_][A-Za-z0-9_]{0,62}$");
  }
}

}  // namespace outbox
