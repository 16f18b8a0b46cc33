#pragma once
// The event as written and delivered: immutable, cheap to copy, payload shared.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "outbox/clock.hpp"
#include "outbox/event_type.hpp"
#include "outbox/json_codec.hpp"

namespace outbox {

struct OutboxEvent;

/// An immutable event. Copies share the payload and headers; thread-safe to read and copy.
class EventEnvelope {
 public:
  class Builder;

  /// Largest payload accepted, in bytes of its UTF-8 (JSON) or raw (bytes) form.
  static constexpr std::size_t kMaxPayloadBytes = 1024 * 1024;
  /// Longest event id and tenant id, in characters (the same on every engine).
  static constexpr std::size_t kMaxIdChars = 64;
  /// Longest event type and aggregate id, in characters.
  static constexpr std::size_t kMaxEventTypeChars = 128;
  static constexpr std::size_t kMaxAggregateIdChars = 128;
  /// Longest aggregate type, in characters.
  static constexpr std::size_t kMaxAggregateTypeChars = 64;
  /// Longest tag name and tag value, in characters; at most kMaxTags tags.
  static constexpr std::size_t kMaxTagNameChars = 64;
  static constexpr std::size_t kMaxTagValueChars = 256;
  static constexpr std::size_t kMaxTags = 32;
  /// Longest message group key, in characters.
  static constexpr std::size_t kMaxMessageGroupChars = 200;

  /// Starts a builder for `type`.
  static Builder builder(EventType type);
  /// An event with a JSON payload and every other field defaulted. Throws like Builder::build.
  static EventEnvelope of_json(EventType type, std::string payload_json);

  const std::string& event_id() const noexcept { return data_->event_id; }
  const std::string& event_type() const noexcept { return data_->event_type; }
  Timestamp occurred_at() const noexcept { return data_->occurred_at; }
  const std::string& aggregate_type() const noexcept { return data_->aggregate_type; }
  /// Empty optional when the event has no aggregate id.
  const std::optional<std::string>& aggregate_id() const noexcept { return data_->aggregate_id; }
  const std::optional<std::string>& tenant_id() const noexcept { return data_->tenant_id; }
  const Headers& headers() const noexcept { return *data_->headers; }
  /// Names and values a subscription's filter selects on (e.g. "wallet_id" → "w-7"); not sent to
  /// brokers as headers.
  const Tags& tags() const noexcept { return *data_->tags; }
  /// The key whose events are delivered one at a time in write order (see docs/groups.md);
  /// nullopt: unordered.
  const std::optional<std::string>& message_group() const noexcept { return data_->message_group; }
  /// When the event may first be delivered; nullopt means at once.
  const std::optional<Timestamp>& available_at() const noexcept { return data_->available_at; }
  /// True for a JSON payload, false for a bytes payload.
  bool has_json_payload() const noexcept { return data_->payload_is_json; }
  /// The JSON payload text (empty view for a bytes payload).
  std::string_view payload_json() const noexcept;
  /// The raw payload: the JSON text's bytes or the bytes payload.
  std::span<const std::uint8_t> payload_bytes() const noexcept;
  /// A copy with `headers` in place of this event's (every other field shared). Throws
  /// std::invalid_argument on an empty header name, or a name or value not UTF-8 without NUL
  /// among those this event does not already have.
  EventEnvelope with_headers(Headers headers) const;
  /// Shared handle to the payload storage (JSON text or raw bytes), for zero-copy consumers.
  const std::shared_ptr<const std::string>& payload_storage() const noexcept {
    return data_->payload;
  }

 private:
  struct Data {
    std::string event_id;
    std::string event_type;
    Timestamp occurred_at;
    std::string aggregate_type;
    std::optional<std::string> aggregate_id;
    std::optional<std::string> tenant_id;
    std::shared_ptr<const Headers> headers;
    std::shared_ptr<const Tags> tags;
    std::optional<std::string> message_group;
    std::shared_ptr<const std::string> payload;
    bool payload_is_json = true;
    std::optional<Timestamp> available_at;
  };
  explicit EventEnvelope(std::shared_ptr<const Data> data) : data_(std::move(data)) {}
  std::shared_ptr<const Data> data_;
};

/// Fluent builder for EventEnvelope. Not thread-safe; use once.
class EventEnvelope::Builder {
 public:
  explicit Builder(EventType type);
  /// Overrides the generated ULID. Throws std::invalid_argument (at build) if empty.
  Builder& event_id(std::string id);
  Builder& occurred_at(Timestamp t);
  Builder& aggregate_type(AggregateType type);
  Builder& aggregate_id(std::string id);
  Builder& tenant_id(std::string id);
  /// Adds one header. Throws std::invalid_argument if the key is empty.
  Builder& header(std::string key, std::string value);
  /// Adds every header of `headers`. Throws std::invalid_argument on an empty key.
  Builder& headers(const Headers& headers);
  /// Adds one tag (replacing one of the same name). At build: the name must be 1 to
  /// kMaxTagNameChars characters, the value at most kMaxTagValueChars, both UTF-8 without NUL.
  Builder& tag(std::string name, std::string value);
  /// Adds every tag of `tags`.
  Builder& tags(const Tags& tags);
  /// Puts the event in a message group: events of one key are delivered in order, one at a time.
  /// At build: 1 to kMaxMessageGroupChars characters of UTF-8 without NUL.
  Builder& message_group(std::string key);
  /// message_group("<aggregate type>:<aggregate id>"), resolved at build; build throws
  /// std::invalid_argument when the event has no aggregate id.
  Builder& message_group_by_aggregate();
  /// Sets a JSON payload (must be valid UTF-8; its text is not otherwise parsed).
  Builder& payload_json(std::string json);
  /// Sets a binary payload.
  Builder& payload_bytes(std::vector<std::uint8_t> bytes);
  /// Delays first delivery until `t` (the hot path is skipped; the poller delivers when due).
  Builder& available_at(Timestamp t);
  /// Delays first delivery by `delay` after occurred_at. Must be positive.
  Builder& deliver_after(std::chrono::microseconds delay);
  /// Validates and builds. Throws std::invalid_argument: empty type or id, no payload or both
  /// kinds, payload over kMaxPayloadBytes, invalid UTF-8 in a JSON payload, ids, types or
  /// headers that are not UTF-8, contain NUL or pass the kMax*Chars limits, both or bad
  /// delivery delays.
  EventEnvelope build();

 private:
  // Rows already stored (written by any client) are decoded without the text checks: they are
  // for what we write, and refusing a stored row would only turn it DEAD.
  friend EventEnvelope to_envelope(const OutboxEvent& row, const JsonCodec& codec);
  bool stored_ = false;
  EventType type_;
  std::optional<std::string> event_id_;
  std::optional<Timestamp> occurred_at_;
  AggregateType aggregate_type_ = AggregateType::global();
  std::optional<std::string> aggregate_id_;
  std::optional<std::string> tenant_id_;
  Headers headers_;
  Tags tags_;
  std::optional<std::string> message_group_;
  bool group_by_aggregate_ = false;
  std::optional<std::string> json_;
  std::optional<std::string> bytes_;
  std::optional<Timestamp> available_at_;
  std::optional<std::chrono::microseconds> deliver_after_;
};

/// Partitions message groups are spread over; fixed, since changing it would move groups between
/// partitions (and relays) with events in flight.
inline constexpr int kMessageGroupPartitions = 64;

/// The partition of a message group: CRC-32 (IEEE 802.3, as zlib's crc32, Go's
/// crc32.ChecksumIEEE and MariaDB's CRC32()) of the key's bytes, mod kMessageGroupPartitions.
int message_group_partition(std::string_view key);

/// Generates a monotonic ULID (26 Crockford base-32 characters). Thread-safe.
std::string new_ulid();

}  // namespace outbox
