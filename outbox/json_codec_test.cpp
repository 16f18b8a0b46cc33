#include "outbox/json_codec.hpp"

#include <gtest/gtest.h>

namespace {

const outbox::JsonCodec& codec() {
  return outbox::JsonCodec::default_codec();
}

TEST(JsonCodec, EmptyMapIsNullopt) {
  EXPECT_FALSE(codec().to_json({}));
}

TEST(JsonCodec, EncodesAndEscapes) {
  outbox::Headers h{{"a", "x\"y\\z"}, {"b", "line\nbreak\ttab\x01"}};
  EXPECT_EQ(*codec().to_json(h), R"({"a":"x\"y\\z","b":"line\nbreak\ttab\u0001"})");
}

TEST(JsonCodec, RoundTripsArbitraryStrings) {
  outbox::Headers h{{"k\"ey", "v\\al\b\f\r"}, {"utf8", "h\xC3\xA9llo \xF0\x9F\x98\x80"}};
  EXPECT_EQ(codec().parse_object(*codec().to_json(h)), h);
}

TEST(JsonCodec, ParsesUnicodeEscapesAndSurrogatePairs) {
  auto h = codec().parse_object(R"({"e":"\u00e9","smile":"\ud83d\ude00","slash":"a\/b"})");
  EXPECT_EQ(h.at("e"), "\xC3\xA9");
  EXPECT_EQ(h.at("smile"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(h.at("slash"), "a/b");
}

TEST(JsonCodec, EmptyAndNullInputGiveEmptyMap) {
  EXPECT_TRUE(codec().parse_object("").empty());
  EXPECT_TRUE(codec().parse_object("  null ").empty());
  EXPECT_TRUE(codec().parse_object("{ }").empty());
}

TEST(JsonCodec, NullValuesAreAbsentHeaders) {
  // Other producers write absent headers as null; those events once went DEAD undecoded.
  const auto headers = codec().parse_object(R"({"a":null,"b":"x","c": null })");
  EXPECT_EQ(headers.size(), 1u);
  EXPECT_EQ(headers.at("b"), "x");
  EXPECT_THROW(codec().parse_object(R"({"a":nul})"), std::invalid_argument);
  EXPECT_THROW(codec().parse_object(R"({"a":nullx})"), std::invalid_argument);
}

TEST(JsonCodec, RejectsNonObjectsWithClearErrors) {
  for (const char* bad : {"[1]", "\"s\"", "42", "{\"a\":1}", "{\"a\":\"b\"", "{\"a\" \"b\"}",
                          "{\"a\":\"b\"} x", "{\"\\ud83d\":\"x\"}", "{\"a\":\"\\udc00\"}",
                          "{\"a\":\"\\q\"}", "{\"\":\"v\"}", "{\"a\":\"\\u12\"}", "{a:\"b\"}"}) {
    try {
      codec().parse_object(bad);
      ADD_FAILURE() << "accepted " << bad;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find("offset"), std::string::npos) << e.what();
    }
  }
}

TEST(JsonCodec, RejectsEmptyKeyOnEncode) {
  EXPECT_THROW(codec().to_json({{"", "v"}}), std::invalid_argument);
}

}  // namespace
