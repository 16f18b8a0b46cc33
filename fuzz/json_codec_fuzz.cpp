// The JSON header and tag codecs read what any writer put in a row: anything parses or is refused
// with std::invalid_argument, and what parses comes back the same through its encoder.

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string_view>

#include "outbox/json_codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const auto& codec = outbox::JsonCodec::default_codec();
  try {
    const auto headers = codec.parse_object(text);
    bool empty_key = false;
    for (const auto& [key, value] : headers) {
      empty_key = empty_key || key.empty();
    }
    if (!empty_key) {  // to_json refuses an empty key (documented)
      const auto again = codec.to_json(headers);
      if (codec.parse_object(again.value_or("")) != headers) {
        std::abort();  // the round trip lost or changed a header
      }
    }
  } catch (const std::invalid_argument&) {
  }
  try {
    const auto lists = outbox::parse_string_lists(text);
    if (outbox::parse_string_lists(outbox::to_json(lists)) != lists) {
      std::abort();
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
