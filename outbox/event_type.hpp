#pragma once
// Type-safe event and aggregate type names. Any enum E with an ADL-visible
// `std::string_view outbox_name(E)` converts implicitly to EventType and AggregateType.

#include <concepts>
#include <string>
#include <string_view>
#include <utility>

namespace outbox {

/// Satisfied by enums (or other types) that name themselves through ADL `outbox_name(value)`.
template <typename T>
concept NamedByOutbox = requires(const T& v) {
  { outbox_name(v) } -> std::convertible_to<std::string_view>;
};

/// The name of an event type. A value type; thread-safe to copy.
class EventType {
 public:
  /// Any enum with ADL `outbox_name`.
  template <NamedByOutbox E>
  EventType(const E& e) : name_(outbox_name(e)) {}  // NOLINT(google-explicit-constructor)
  /// A dynamic name. Emptiness is checked where the type is used (EventEnvelope::build).
  static EventType of(std::string name) { return EventType(std::move(name), 0); }
  const std::string& name() const noexcept { return name_; }
  friend bool operator==(const EventType&, const EventType&) = default;

 private:
  EventType(std::string name, int) : name_(std::move(name)) {}
  std::string name_;
};

/// The name of an aggregate type; `global()` ("__GLOBAL__") is the default. Thread-safe to copy.
class AggregateType {
 public:
  template <NamedByOutbox E>
  AggregateType(const E& e) : name_(outbox_name(e)) {}  // NOLINT(google-explicit-constructor)
  static AggregateType of(std::string name) { return AggregateType(std::move(name), 0); }
  /// The aggregate type used when none is set.
  static AggregateType global() { return of(std::string(kGlobalName)); }
  const std::string& name() const noexcept { return name_; }
  friend bool operator==(const AggregateType&, const AggregateType&) = default;

  static constexpr std::string_view kGlobalName = "__GLOBAL__";

 private:
  AggregateType(std::string name, int) : name_(std::move(name)) {}
  std::string name_;
};

}  // namespace outbox
