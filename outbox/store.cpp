#include "outbox/store.hpp"

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

std::string truncate_error(std::string_view error) {
  if (error.size() <= kMaxErrorLength) {
    return std::string(error);
  }
  std::size_t cut = kMaxErrorLength;
  // Step back over continuation bytes so a multi-byte character is not split.
  while (cut > 0 && (static_cast<unsigned char>(error[cut]) & 0xC0) == 0x80) {
    --cut;
  }
  return std::string(error.substr(0, cut));
}

EventEnvelope to_envelope(const OutboxEvent& row, const JsonCodec& codec) {
  auto builder = EventEnvelope::builder(EventType::of(row.event_type));
  builder.event_id(row.event_id)
      .occurred_at(row.created_at)
      .aggregate_type(AggregateType::of(row.aggregate_type));
  if (row.aggregate_id) {
    builder.aggregate_id(*row.aggregate_id);
  }
  if (row.tenant_id) {
    builder.tenant_id(*row.tenant_id);
  }
  if (row.headers_json) {
    builder.headers(codec.parse_object(*row.headers_json));
  }
  if (row.payload_is_json) {
    builder.payload_json(row.payload);
  } else {
    builder.payload_bytes(std::vector<std::uint8_t>(row.payload.begin(), row.payload.end()));
  }
  return builder.build();
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
