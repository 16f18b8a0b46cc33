#pragma once
// Kafka publisher (librdkafka): idempotent producer, key = aggregate id, outbox headers.

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "outbox/publisher.hpp"

namespace outbox::kafka {

/// Header names the publisher sets on every message. The envelope's own headers follow as is,
/// except that an envelope header named outbox-* (any case) fails the event as Permanent: it could
/// pass for one of these.
inline constexpr const char* kHeaderEventId = "outbox-event-id";
inline constexpr const char* kHeaderEventType = "outbox-event-type";
inline constexpr const char* kHeaderAggregateType = "outbox-aggregate-type";
inline constexpr const char* kHeaderAggregateId = "outbox-aggregate-id";
inline constexpr const char* kHeaderTenantId = "outbox-tenant-id";
inline constexpr const char* kHeaderOccurredAt = "outbox-occurred-at";  ///< RFC 3339, UTC
/// Set when the event has a message group, which is then also the message key (else the aggregate
/// id is).
inline constexpr const char* kHeaderMessageGroup = "outbox-message-group";

/// Produces each request to its target topic and reports Ok only after the broker acknowledged it
/// (delivery report). Thread-safe: concurrent publish() calls share one producer, whose batching
/// (linger.ms) groups them.
class KafkaPublisher final : public Publisher {
 public:
  struct Options {
    std::string brokers;  ///< bootstrap.servers; required
    /// Extra librdkafka settings, applied after the defaults (enable.idempotence=true, acks=all,
    /// linger.ms=5, client.id=outbox-relay) and so able to override them.
    std::map<std::string, std::string> properties;
    std::chrono::milliseconds delivery_timeout{30000};  ///< message.timeout.ms; > 0
  };

  /// Creates the producer. Throws std::invalid_argument for a missing broker list, a setting
  /// librdkafka rejects (its message names the setting) or message.timeout.ms = 0.
  explicit KafkaPublisher(Options options);
  /// Flushes for up to delivery_timeout; messages still unacknowledged then fail as retriable.
  ~KafkaPublisher() override;
  KafkaPublisher(const KafkaPublisher&) = delete;
  KafkaPublisher& operator=(const KafkaPublisher&) = delete;

  /// Key = aggregate id (none for events without one), value = payload, headers as above.
  /// Broker rejections of the message itself (too large, invalid, not authorised) are Permanent;
  /// timeouts and transport errors Retriable.
  std::vector<PublishResult> publish(std::span<const PublishRequest> batch) override;
  /// Purges queued and in-flight messages (their publish calls return at once) and refuses new
  /// ones.
  void cancel() noexcept override;
  /// False after librdkafka reported every broker down, until a broker answers a metadata request
  /// (sent by this call, at most 1 s).
  bool is_healthy() noexcept override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::kafka
