#include "outbox/publisher.hpp"

#include <gtest/gtest.h>

namespace outbox {
namespace {

TEST(Publisher, ValidatesJsonSyntax) {
  for (const char* ok : {"{}", "[]", "0", "-1.5e+3", "\"a\\u00e9\\n\"",
                         " {\"a\":[1,true,null,{}]} ", "\"\xc3\xa9\""}) {
    EXPECT_TRUE(is_valid_json(ok)) << ok;
  }
  for (const char* bad : {"", "{", "{\"a\"}", "[1,]", "01", "1.", "tru", "\"\\x\"", "{} {}",
                          "\"\x01\"", "{'a':1}", "[1 2]"}) {
    EXPECT_FALSE(is_valid_json(bad)) << bad;
  }
  EXPECT_FALSE(is_valid_json(std::string(600, '[') + std::string(600, ']')));
}

TEST(Publisher, EventAsJsonObject) {
  auto e = EventEnvelope::builder(EventType::of("T"))
               .event_id("e1")
               .occurred_at(from_micros(0))
               .aggregate_id("a\"1")
               .header("k", "v")
               .payload_json("{\"x\":1}")
               .build();
  EXPECT_EQ(to_json_object(e),
            "{\"event_id\":\"e1\",\"event_type\":\"T\",\"aggregate_type\":\"__GLOBAL__\","
            "\"aggregate_id\":\"a\\\"1\",\"tenant_id\":null,\"occurred_at\":"
            "\"1970-01-01T00:00:00.000000Z\",\"headers\":{\"k\":\"v\"},\"payload\":{\"x\":1}}");
  auto bytes = EventEnvelope::builder(EventType::of("B"))
                   .event_id("b1")
                   .occurred_at(from_micros(0))
                   .payload_bytes({0xff, 0x00, 'a', 'b'})
                   .build();
  EXPECT_NE(to_json_object(bytes).find("\"payload_base64\":\"/wBhYg==\""), std::string::npos);
  auto bad = EventEnvelope::of_json(EventType::of("X"), "not json");
  EXPECT_THROW(to_json_object(bad), std::invalid_argument);
}

}  // namespace
}  // namespace outbox
