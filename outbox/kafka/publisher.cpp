#include "outbox/kafka/publisher.hpp"

#include <librdkafka/rdkafka.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>

#include "outbox/clock.hpp"
#include "outbox/log.hpp"

namespace outbox::kafka {
namespace {

// One publish() call waiting for its delivery reports.
struct PendingBatch {
  std::mutex mutex;  // guards remaining and results
  std::condition_variable done;
  std::size_t remaining = 0;
  std::vector<PublishResult> results;
};

struct Slot {
  PendingBatch* batch;
  std::size_t index;
};

std::string describe(rd_kafka_resp_err_t err) {
  return std::string("kafka: ") + rd_kafka_err2str(err) + " (" + rd_kafka_err2name(err) + ")";
}

// Errors about the message itself: sending it again cannot succeed.
bool is_permanent(rd_kafka_resp_err_t err) {
  switch (err) {
    case RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_INVALID_MSG:
    case RD_KAFKA_RESP_ERR_INVALID_RECORD:
    case RD_KAFKA_RESP_ERR_RECORD_LIST_TOO_LARGE:
    case RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED:
    case RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION:
    case RD_KAFKA_RESP_ERR__INVALID_ARG:
      return true;
    default:
      return false;
  }
}

PublishResult classify(rd_kafka_resp_err_t err) {
  if (err == RD_KAFKA_RESP_ERR_NO_ERROR) {
    return PublishResult::ok();
  }
  return is_permanent(err) ? PublishResult::permanent(describe(err))
                           : PublishResult::retriable(describe(err));
}

void on_delivery(rd_kafka_t*, const rd_kafka_message_t* message, void*) {
  auto* slot = static_cast<Slot*>(message->_private);
  if (slot == nullptr) {
    return;
  }
  auto* batch = slot->batch;
  std::lock_guard lock(batch->mutex);
  batch->results[slot->index] = classify(message->err);
  if (--batch->remaining == 0) {
    batch->done.notify_all();
  }
}

// Names starting with "outbox-" (any case) are the publisher's: an envelope header under one
// would sit next to the real outbox-event-id etc., and a consumer reading the first or the last
// value of a name (or matching names case-insensitively) could take it for the real one.
bool is_reserved_header(std::string_view name) {
  constexpr std::string_view kPrefix = "outbox-";
  if (name.size() < kPrefix.size()) {
    return false;
  }
  for (std::size_t i = 0; i < kPrefix.size(); ++i) {
    const char c = name[i];
    if ((c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c) != kPrefix[i]) {
      return false;
    }
  }
  return true;
}

void on_error(rd_kafka_t*, int err, const char* reason, void* opaque);

void on_log(const rd_kafka_t*, int level, const char* facility, const char* message) {
  const LogLevel mapped = level <= 3   ? LogLevel::Error
                          : level <= 4 ? LogLevel::Warning
                          : level <= 6 ? LogLevel::Info
                                       : LogLevel::Debug;
  log(mapped, std::string("kafka ") + facility + ": " + message);
}

}  // namespace

struct KafkaPublisher::Impl {
  rd_kafka_t* producer = nullptr;
  std::chrono::milliseconds delivery_timeout;
  std::atomic<bool> stopping{false};
  std::atomic<bool> cancelled{false};
  // Set by librdkafka's error event, cleared by a probe; its own allocation, as the callback's
  // opaque.
  std::unique_ptr<std::atomic<bool>> all_brokers_down = std::make_unique<std::atomic<bool>>(false);
  std::thread poller;  // serves delivery reports and logs

  ~Impl() {
    if (producer == nullptr) {
      return;
    }
    if (rd_kafka_flush(producer, static_cast<int>(delivery_timeout.count())) != 0) {
      log(LogLevel::Warning, "kafka: messages still unacknowledged at shutdown fail as retriable");
      rd_kafka_purge(producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
      rd_kafka_flush(producer, 1000);
    }
    stopping = true;
    poller.join();
    rd_kafka_destroy(producer);
  }
};

KafkaPublisher::KafkaPublisher(Options options) : impl_(std::make_unique<Impl>()) {
  if (options.brokers.empty()) {
    throw std::invalid_argument("KafkaPublisher: brokers is required");
  }
  if (options.delivery_timeout.count() <= 0) {
    throw std::invalid_argument("KafkaPublisher: delivery_timeout must be > 0");
  }
  impl_->delivery_timeout = options.delivery_timeout;
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  char err[512];
  auto set = [&](const std::string& key, const std::string& value) {
    if (rd_kafka_conf_set(conf, key.c_str(), value.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      rd_kafka_conf_destroy(conf);
      throw std::invalid_argument("KafkaPublisher: " + key + ": " + err);
    }
  };
  set("bootstrap.servers", options.brokers);
  set("enable.idempotence", "true");
  set("acks", "all");
  set("linger.ms", "5");
  set("client.id", "outbox-relay");
  set("message.timeout.ms", std::to_string(options.delivery_timeout.count()));
  for (const auto& [key, value] : options.properties) {
    set(key, value);
  }
  // 0 means "wait forever" to librdkafka: a publish (and the relay's drain) would never end.
  char timeout[32];
  std::size_t timeout_size = sizeof timeout;
  if (rd_kafka_conf_get(conf, "message.timeout.ms", timeout, &timeout_size) == RD_KAFKA_CONF_OK &&
      std::string_view(timeout) == "0") {
    rd_kafka_conf_destroy(conf);
    throw std::invalid_argument(
        "KafkaPublisher: message.timeout.ms = 0 (never time out) is refused: every publish needs "
        "a deadline");
  }
  rd_kafka_conf_set_dr_msg_cb(conf, on_delivery);
  rd_kafka_conf_set_log_cb(conf, on_log);
  rd_kafka_conf_set_error_cb(conf, on_error);
  rd_kafka_conf_set_opaque(conf, impl_->all_brokers_down.get());
  impl_->producer = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
  if (impl_->producer == nullptr) {
    rd_kafka_conf_destroy(conf);
    throw std::invalid_argument(std::string("KafkaPublisher: ") + err);
  }
  Impl* impl = impl_.get();
  impl_->poller = std::thread([impl] {
    while (!impl->stopping) {
      rd_kafka_poll(impl->producer, 100);
    }
  });
}

namespace {

void on_error(rd_kafka_t*, int err, const char* reason, void* opaque) {
  if (err == RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN) {
    *static_cast<std::atomic<bool>*>(opaque) = true;
  }
  log(LogLevel::Warning, std::string("kafka: ") +
                             rd_kafka_err2str(static_cast<rd_kafka_resp_err_t>(err)) + ": " +
                             reason);
}

}  // namespace

KafkaPublisher::~KafkaPublisher() = default;

bool KafkaPublisher::is_healthy() noexcept {
  if (!*impl_->all_brokers_down) {
    return true;
  }
  // Nothing tells librdkafka's callers that a broker is back: ask one for metadata.
  const struct rd_kafka_metadata* metadata = nullptr;
  if (rd_kafka_metadata(impl_->producer, 0, nullptr, &metadata, 1000) !=
      RD_KAFKA_RESP_ERR_NO_ERROR) {
    return false;
  }
  rd_kafka_metadata_destroy(metadata);
  *impl_->all_brokers_down = false;
  return true;
}

void KafkaPublisher::cancel() noexcept {
  impl_->cancelled = true;
  // Every message still queued or in flight gets its delivery report now (as purged), so the
  // publish calls waiting for them return; their events are retried (a broker may still have
  // stored some: at-least-once).
  rd_kafka_purge(impl_->producer, RD_KAFKA_PURGE_F_QUEUE | RD_KAFKA_PURGE_F_INFLIGHT);
}

std::vector<PublishResult> KafkaPublisher::publish(std::span<const PublishRequest> batch) {
  PendingBatch pending;
  pending.results.resize(batch.size());
  std::vector<Slot> slots(batch.size());
  // A message group's events after one refused here are not produced. (A broker's refusal comes
  // later, per partition: the idempotent producer then fails the partition's later messages.)
  GroupStops stops;
  for (std::size_t i = 0; i < batch.size(); ++i) {
    const EventEnvelope& event = *batch[i].event;
    if (impl_->cancelled) {
      pending.results[i] = Publisher::cancelled("kafka");
      continue;
    }
    if (stops.stopped(event)) {
      pending.results[i] = GroupStops::not_sent(event, "kafka");
      continue;
    }
    if (batch[i].target.empty()) {
      pending.results[i] = PublishResult::permanent("kafka: no topic for event");
      stops.fail(event);
      continue;
    }
    const auto reserved = std::find_if(event.headers().begin(), event.headers().end(),
                                       [](const auto& h) { return is_reserved_header(h.first); });
    if (reserved != event.headers().end()) {
      pending.results[i] = PublishResult::permanent(
          "kafka: envelope header '" + reserved->first +
          "' refused: outbox-* names are reserved for the publisher's metadata");
      stops.fail(event);
      continue;
    }
    rd_kafka_headers_t* headers = rd_kafka_headers_new(8 + event.headers().size());
    auto add = [&](const char* name, std::string_view value) {
      rd_kafka_header_add(headers, name, -1, value.data(), static_cast<ssize_t>(value.size()));
    };
    add(kHeaderEventId, event.event_id());
    add(kHeaderEventType, event.event_type());
    add(kHeaderAggregateType, event.aggregate_type());
    if (event.aggregate_id()) {
      add(kHeaderAggregateId, *event.aggregate_id());
    }
    if (event.tenant_id()) {
      add(kHeaderTenantId, *event.tenant_id());
    }
    add(kHeaderOccurredAt, format_rfc3339(event.occurred_at()));
    if (event.message_group()) {
      add(kHeaderMessageGroup, *event.message_group());
    }
    for (const auto& [name, value] : event.headers()) {
      add(name.c_str(), value);
    }
    const auto payload = event.payload_bytes();
    // A message group is the key: its events land in one partition, in the order sent.
    const std::string* key = event.message_group()  ? &*event.message_group()
                             : event.aggregate_id() ? &*event.aggregate_id()
                                                    : nullptr;
    slots[i] = Slot{&pending, i};
    const auto deadline = std::chrono::steady_clock::now() + impl_->delivery_timeout;
    rd_kafka_resp_err_t err;
    {
      std::lock_guard lock(pending.mutex);  // counted before producing: the report may come first
      ++pending.remaining;
    }
    for (;;) {
      err = rd_kafka_producev(
          impl_->producer, RD_KAFKA_V_TOPIC(batch[i].target.c_str()),
          RD_KAFKA_V_KEY(key ? key->data() : nullptr, key ? key->size() : 0),
          RD_KAFKA_V_VALUE(const_cast<std::uint8_t*>(payload.data()), payload.size()),
          RD_KAFKA_V_MSGFLAGS(RD_KAFKA_MSG_F_COPY), RD_KAFKA_V_HEADERS(headers),
          RD_KAFKA_V_OPAQUE(&slots[i]), RD_KAFKA_V_END);
      // A full local queue drains as reports arrive; wait for it up to the delivery timeout.
      if (err != RD_KAFKA_RESP_ERR__QUEUE_FULL || std::chrono::steady_clock::now() > deadline) {
        break;
      }
      rd_kafka_poll(impl_->producer, 10);
    }
    if (err != RD_KAFKA_RESP_ERR_NO_ERROR) {
      rd_kafka_headers_destroy(headers);  // ownership passes to librdkafka only on success
      std::lock_guard lock(pending.mutex);
      --pending.remaining;
      pending.results[i] = classify(err);
      stops.fail(event);
      continue;
    }
  }
  std::unique_lock lock(pending.mutex);
  // Every produced message gets exactly one delivery report (success, error, timeout or purge)
  // within message.timeout.ms, or at once after cancel().
  pending.done.wait(lock, [&] { return pending.remaining == 0; });
  if (impl_->cancelled) {
    for (auto& r : pending.results) {
      if (!r.is_ok()) {
        r = Publisher::cancelled("kafka");
      }
    }
  }
  return std::move(pending.results);
}

}  // namespace outbox::kafka
