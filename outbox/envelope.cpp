#include "outbox/envelope.hpp"

#include <array>
#include <mutex>
#include <random>
#include <stdexcept>

namespace outbox {
namespace {

// Monotonic ULID state: within one millisecond the 80-bit random part is incremented, so ids
// generated in one process sort in generation order.
class UlidGenerator {
 public:
  std::string next() {
    std::uint64_t ms =
        static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::milliseconds>(
                                       std::chrono::system_clock::now().time_since_epoch())
                                       .count());
    std::array<std::uint8_t, 16> bytes{};
    {
      std::lock_guard lock(state_mutex_);
      if (ms > last_ms_) {
        last_ms_ = ms;
        for (auto& b : random_) {
          b = static_cast<std::uint8_t>(rng_());
        }
      } else {
        // Same (or earlier, after a clock step back) millisecond: keep last_ms_ and increment.
        for (int i = static_cast<int>(random_.size()) - 1; i >= 0; --i) {
          if (++random_[static_cast<std::size_t>(i)] != 0) {
            break;
          }
        }
      }
      for (int i = 0; i < 6; ++i) {
        bytes[static_cast<std::size_t>(i)] = static_cast<std::uint8_t>(last_ms_ >> (40 - 8 * i));
      }
      std::copy(random_.begin(), random_.end(), bytes.begin() + 6);
    }
    return encode(bytes);
  }

 private:
  static std::string encode(const std::array<std::uint8_t, 16>& b) {
    static constexpr char kAlphabet[] = "0123456789ABCDEFGHJKMNPQRSTVWXYZ";
    // 128 bits as 26 base-32 digits, read as a 130-bit number with two leading zero bits.
    std::string out(26, '0');
    for (int i = 0; i < 26; ++i) {
      unsigned digit = 0;
      for (int k = 0; k < 5; ++k) {
        const int bit = i * 5 + k - 2;  // index into the 128 bits, most significant first
        if (bit >= 0) {
          const unsigned byte = b[static_cast<std::size_t>(bit / 8)];
          digit = (digit << 1) | ((byte >> (7 - bit % 8)) & 1U);
        }
      }
      out[static_cast<std::size_t>(i)] = kAlphabet[digit];
    }
    return out;
  }

  std::mutex state_mutex_;  // guards last_ms_, random_, rng_
  std::uint64_t last_ms_ = 0;
  std::array<std::uint8_t, 10> random_{};
  std::mt19937_64 rng_{std::random_device{}()};
};

bool valid_utf8(std::string_view s) {
  std::size_t i = 0;
  const std::size_t n = s.size();
  while (i < n) {
    auto c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    std::size_t len;
    std::uint32_t cp;
    if ((c & 0xE0) == 0xC0) {
      len = 2;
      cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3;
      cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4;
      cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) {
      return false;
    }
    for (std::size_t k = 1; k < len; ++k) {
      auto cc = static_cast<unsigned char>(s[i + k]);
      if ((cc & 0xC0) != 0x80) {
        return false;
      }
      cp = (cp << 6) | (cc & 0x3F);
    }
    // Reject overlong forms, surrogates and values past U+10FFFF.
    if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000) ||
        (cp >= 0xD800 && cp <= 0xDFFF) || cp > 0x10FFFF) {
      return false;
    }
    i += len;
  }
  return true;
}

}  // namespace

std::string new_ulid() {
  static UlidGenerator generator;
  return generator.next();
}

std::string_view EventEnvelope::payload_json() const noexcept {
  return data_->payload_is_json ? std::string_view(*data_->payload) : std::string_view();
}

std::span<const std::uint8_t> EventEnvelope::payload_bytes() const noexcept {
  return {reinterpret_cast<const std::uint8_t*>(data_->payload->data()), data_->payload->size()};
}

EventEnvelope::Builder EventEnvelope::builder(EventType type) {
  return Builder(std::move(type));
}

EventEnvelope EventEnvelope::of_json(EventType type, std::string payload_json) {
  return builder(std::move(type)).payload_json(std::move(payload_json)).build();
}

EventEnvelope::Builder::Builder(EventType type) : type_(std::move(type)) {}

EventEnvelope::Builder& EventEnvelope::Builder::event_id(std::string id) {
  event_id_ = std::move(id);
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::occurred_at(Timestamp t) {
  occurred_at_ = t;
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::aggregate_type(AggregateType type) {
  aggregate_type_ = std::move(type);
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::aggregate_id(std::string id) {
  aggregate_id_ = std::move(id);
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::tenant_id(std::string id) {
  tenant_id_ = std::move(id);
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::header(std::string key, std::string value) {
  if (key.empty()) {
    throw std::invalid_argument("EventEnvelope: header keys must not be empty");
  }
  headers_.insert_or_assign(std::move(key), std::move(value));
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::headers(const Headers& headers) {
  for (const auto& [k, v] : headers) {
    header(k, v);
  }
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::tag(std::string name, std::string value) {
  tags_.insert_or_assign(std::move(name), std::move(value));
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::tags(const Tags& tags) {
  for (const auto& [k, v] : tags) {
    tag(k, v);
  }
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::message_group(std::string key) {
  message_group_ = std::move(key);
  group_by_aggregate_ = false;
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::message_group_by_aggregate() {
  message_group_.reset();
  group_by_aggregate_ = true;
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::payload_json(std::string json) {
  json_ = std::move(json);
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::payload_bytes(std::vector<std::uint8_t> bytes) {
  bytes_ = std::string(bytes.begin(), bytes.end());
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::available_at(Timestamp t) {
  available_at_ = t;
  return *this;
}
EventEnvelope::Builder& EventEnvelope::Builder::deliver_after(std::chrono::microseconds delay) {
  deliver_after_ = delay;
  return *this;
}

int message_group_partition(std::string_view key) {
  // Bitwise CRC-32: a key is short and this runs once per grouped write.
  std::uint32_t crc = 0xFFFFFFFFu;
  for (const char c : key) {
    crc ^= static_cast<unsigned char>(c);
    for (int k = 0; k < 8; ++k) {
      crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
    }
  }
  return static_cast<int>((crc ^ 0xFFFFFFFFu) % kMessageGroupPartitions);
}

namespace {

std::size_t code_points(std::string_view utf8) {
  std::size_t n = 0;
  for (const char c : utf8) {
    n += (static_cast<unsigned char>(c) & 0xC0) != 0x80 ? 1 : 0;
  }
  return n;
}

// The same limits on every engine: MariaDB's columns are VARCHAR(n) (where a longer value once
// failed every write, or was cut to a prefix and delivered under two ids) and PostgreSQL's text
// refuses NUL and invalid UTF-8 that SQLite would keep.
void check_text(const char* what, std::string_view value, std::size_t max_chars) {
  if (!valid_utf8(value)) {
    throw std::invalid_argument(std::string("EventEnvelope: ") + what + " is not valid UTF-8");
  }
  if (value.find('\0') != std::string_view::npos) {
    throw std::invalid_argument(std::string("EventEnvelope: ") + what +
                                " contains a NUL character");
  }
  if (max_chars > 0 && code_points(value) > max_chars) {
    throw std::invalid_argument(std::string("EventEnvelope: ") + what + " is longer than " +
                                std::to_string(max_chars) + " characters");
  }
}

}  // namespace

EventEnvelope EventEnvelope::Builder::build() {
  if (type_.name().empty()) {
    throw std::invalid_argument("EventEnvelope: event type must not be empty");
  }
  if (!stored_) {
    check_text("event type", type_.name(), kMaxEventTypeChars);
    if (event_id_) {
      check_text("event id", *event_id_, kMaxIdChars);
      // MariaDB compares keys ignoring trailing spaces: "a" and "a " would be one event there
      // and two elsewhere.
      if (!event_id_->empty() && event_id_->back() == ' ') {
        throw std::invalid_argument("EventEnvelope: event id must not end with a space");
      }
    }
    check_text("aggregate type", aggregate_type_.name(), kMaxAggregateTypeChars);
    if (aggregate_id_) {
      check_text("aggregate id", *aggregate_id_, kMaxAggregateIdChars);
    }
    if (tenant_id_) {
      check_text("tenant id", *tenant_id_, kMaxIdChars);
    }
    for (const auto& [key, value] : headers_) {
      check_text("header name", key, 0);
      check_text(("header " + key.substr(0, 64)).c_str(), value, 0);
    }
    if (tags_.size() > kMaxTags) {
      throw std::invalid_argument("EventEnvelope: more than " + std::to_string(kMaxTags) + " tags");
    }
    for (const auto& [name, value] : tags_) {
      if (name.empty()) {
        throw std::invalid_argument("EventEnvelope: tag names must not be empty");
      }
      check_text("tag name", name, kMaxTagNameChars);
      check_text(("tag " + name.substr(0, 64)).c_str(), value, kMaxTagValueChars);
    }
  }
  if (group_by_aggregate_) {
    if (!aggregate_id_) {
      throw std::invalid_argument(
          "EventEnvelope: message_group_by_aggregate needs an aggregate id");
    }
    message_group_ = aggregate_type_.name() + ":" + *aggregate_id_;
  }
  if (message_group_) {
    if (message_group_->empty()) {
      throw std::invalid_argument("EventEnvelope: message group must not be empty");
    }
    if (!stored_) {
      check_text("message group", *message_group_, kMaxMessageGroupChars);
    }
  }
  if (event_id_ && event_id_->empty()) {
    throw std::invalid_argument("EventEnvelope: event id must not be empty");
  }
  if (aggregate_type_.name().empty()) {
    throw std::invalid_argument("EventEnvelope: aggregate type must not be empty");
  }
  if (json_.has_value() == bytes_.has_value()) {
    throw std::invalid_argument(
        "EventEnvelope: exactly one of payload_json and payload_bytes must be set");
  }
  const std::string& payload = json_ ? *json_ : *bytes_;
  if (payload.size() > kMaxPayloadBytes) {
    throw std::invalid_argument("EventEnvelope: payload is " + std::to_string(payload.size()) +
                                " bytes, over the limit of " + std::to_string(kMaxPayloadBytes));
  }
  if (json_ && !valid_utf8(*json_)) {
    throw std::invalid_argument("EventEnvelope: payload_json is not valid UTF-8");
  }
  if (available_at_ && deliver_after_) {
    throw std::invalid_argument("EventEnvelope: set available_at or deliver_after, not both");
  }
  if (deliver_after_ && deliver_after_->count() <= 0) {
    throw std::invalid_argument("EventEnvelope: deliver_after must be positive");
  }
  // Beyond this, occurred_at + delay overflows the clock and the event would be due at once.
  constexpr std::chrono::hours kMaxDeliverAfter{24 * 365 * 100};
  if (deliver_after_ && *deliver_after_ > kMaxDeliverAfter) {
    throw std::invalid_argument("EventEnvelope: deliver_after must be at most 100 years");
  }
  auto data = std::make_shared<Data>();
  data->event_id = event_id_ ? std::move(*event_id_) : new_ulid();
  data->event_type = type_.name();
  // Stored timestamps have microsecond precision; truncate here so a delivered event equals the
  // written one whichever path it takes.
  data->occurred_at =
      from_micros(to_micros(occurred_at_.value_or(std::chrono::system_clock::now())));
  if (available_at_) {
    auto due = from_micros(to_micros(*available_at_));
    if (due < data->occurred_at) {
      throw std::invalid_argument("EventEnvelope: available_at is before occurred_at");
    }
    data->available_at = due;
  } else if (deliver_after_) {
    data->available_at = data->occurred_at + *deliver_after_;
  }
  data->aggregate_type = aggregate_type_.name();
  data->aggregate_id = std::move(aggregate_id_);
  data->tenant_id = std::move(tenant_id_);
  data->headers = std::make_shared<const Headers>(std::move(headers_));
  data->tags = std::make_shared<const Tags>(std::move(tags_));
  data->message_group = std::move(message_group_);
  data->payload_is_json = json_.has_value();
  data->payload =
      std::make_shared<const std::string>(json_ ? std::move(*json_) : std::move(*bytes_));
  return EventEnvelope(std::move(data));
}

EventEnvelope EventEnvelope::with_headers(Headers headers) const {
  const Headers& current = *data_->headers;
  for (const auto& [key, value] : headers) {
    // Carried over as it is: already this event's (a row read back is not re-checked either).
    if (const auto it = current.find(key); it != current.end() && it->second == value) {
      continue;
    }
    if (key.empty()) {
      throw std::invalid_argument("EventEnvelope: header keys must not be empty");
    }
    check_text("header name", key, 0);
    check_text(("header " + key.substr(0, 64)).c_str(), value, 0);
  }
  auto data = std::make_shared<Data>(*data_);
  data->headers = std::make_shared<const Headers>(std::move(headers));
  return EventEnvelope(std::move(data));
}

}  // namespace outbox
