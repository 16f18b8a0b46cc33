#pragma once
// librdkafka's in-process mock cluster and a consumer that reads back what was produced.

#include <librdkafka/rdkafka.h>
#include <librdkafka/rdkafka_mock.h>

#include <chrono>
#include <functional>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

namespace outbox::testing {

/// A mock Kafka cluster listening on loopback (reachable from other processes too).
class KafkaMockCluster {
 public:
  explicit KafkaMockCluster(int brokers = 3) : brokers_(brokers) {
    char err[256];
    rd_kafka_conf_t* conf = rd_kafka_conf_new();
    rd_kafka_conf_set(conf, "log_level", "3", err, sizeof err);
    handle_ = rd_kafka_new(RD_KAFKA_PRODUCER, conf, err, sizeof err);
    if (handle_ == nullptr) {
      throw std::runtime_error(err);
    }
    cluster_ = rd_kafka_mock_cluster_new(handle_, brokers);
    if (cluster_ == nullptr) {
      rd_kafka_destroy(handle_);
      throw std::runtime_error("rd_kafka_mock_cluster_new failed");
    }
  }
  ~KafkaMockCluster() {
    rd_kafka_mock_cluster_destroy(cluster_);
    rd_kafka_destroy(handle_);
  }
  KafkaMockCluster(const KafkaMockCluster&) = delete;
  KafkaMockCluster& operator=(const KafkaMockCluster&) = delete;

  std::string bootstraps() const { return rd_kafka_mock_cluster_bootstraps(cluster_); }
  void create_topic(const std::string& topic, int partitions) {
    if (rd_kafka_mock_topic_create(cluster_, topic.c_str(), partitions, 1) != 0) {
      throw std::runtime_error("rd_kafka_mock_topic_create failed for " + topic);
    }
  }
  /// Takes every broker down (connections closed and refused) or brings them back.
  void set_all_brokers_up(bool up) {
    for (int id = 1; id <= brokers_; ++id) {
      up ? rd_kafka_mock_broker_set_up(cluster_, id) : rd_kafka_mock_broker_set_down(cluster_, id);
    }
  }
  /// Delays every broker's responses by `rtt` (a broker across a network, not on loopback).
  void set_all_brokers_rtt(std::chrono::milliseconds rtt) {
    for (int id = 1; id <= brokers_; ++id) {
      rd_kafka_mock_broker_set_rtt(cluster_, id, static_cast<int>(rtt.count()));
    }
  }

 private:
  int brokers_;
  rd_kafka_t* handle_ = nullptr;
  rd_kafka_mock_cluster_t* cluster_ = nullptr;
};

/// One consumed message.
struct ConsumedMessage {
  std::string topic;
  int partition = -1;
  std::int64_t offset = -1;
  std::string key;
  bool has_key = false;
  std::string value;
  std::map<std::string, std::string> headers;  ///< last value per name
};

/// Reads `topics` from the beginning until `done` says what arrived is enough, or `timeout`
/// passed.
inline std::vector<ConsumedMessage> consume_until(
    const std::string& bootstraps, const std::vector<std::string>& topics,
    const std::function<bool(const std::vector<ConsumedMessage>&)>& done,
    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  char err[256];
  rd_kafka_conf_t* conf = rd_kafka_conf_new();
  auto set = [&](const char* k, const std::string& v) {
    if (rd_kafka_conf_set(conf, k, v.c_str(), err, sizeof err) != RD_KAFKA_CONF_OK) {
      throw std::runtime_error(err);
    }
  };
  set("bootstrap.servers", bootstraps);
  set("group.id", "outbox-test-reader");
  set("auto.offset.reset", "earliest");
  set("enable.auto.commit", "false");
  set("log_level", "3");
  rd_kafka_t* consumer = rd_kafka_new(RD_KAFKA_CONSUMER, conf, err, sizeof err);
  if (consumer == nullptr) {
    throw std::runtime_error(err);
  }
  rd_kafka_poll_set_consumer(consumer);
  rd_kafka_topic_partition_list_t* list = rd_kafka_topic_partition_list_new(1);
  for (const auto& t : topics) {
    rd_kafka_topic_partition_list_add(list, t.c_str(), RD_KAFKA_PARTITION_UA);
  }
  rd_kafka_subscribe(consumer, list);
  rd_kafka_topic_partition_list_destroy(list);
  std::vector<ConsumedMessage> out;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (!done(out) && std::chrono::steady_clock::now() < deadline) {
    rd_kafka_message_t* m = rd_kafka_consumer_poll(consumer, 100);
    if (m == nullptr) {
      continue;
    }
    if (m->err == RD_KAFKA_RESP_ERR_NO_ERROR) {
      ConsumedMessage c;
      c.topic = rd_kafka_topic_name(m->rkt);
      c.partition = m->partition;
      c.offset = m->offset;
      c.has_key = m->key != nullptr;
      if (m->key) {
        c.key.assign(static_cast<const char*>(m->key), m->key_len);
      }
      c.value.assign(static_cast<const char*>(m->payload), m->len);
      rd_kafka_headers_t* hdrs = nullptr;
      if (rd_kafka_message_headers(m, &hdrs) == RD_KAFKA_RESP_ERR_NO_ERROR) {
        const char* name;
        const void* value;
        size_t size;
        for (size_t i = 0;
             rd_kafka_header_get_all(hdrs, i, &name, &value, &size) == RD_KAFKA_RESP_ERR_NO_ERROR;
             ++i) {
          c.headers[name] = std::string(static_cast<const char*>(value), size);
        }
      }
      out.push_back(std::move(c));
    }
    rd_kafka_message_destroy(m);
  }
  rd_kafka_consumer_close(consumer);
  rd_kafka_destroy(consumer);
  return out;
}

/// Reads `topics` from the beginning until `count` messages arrived or `timeout` passed.
inline std::vector<ConsumedMessage> consume(
    const std::string& bootstraps, const std::vector<std::string>& topics, std::size_t count,
    std::chrono::milliseconds timeout = std::chrono::seconds(30)) {
  return consume_until(
      bootstraps, topics, [count](const auto& got) { return got.size() >= count; }, timeout);
}

}  // namespace outbox::testing
