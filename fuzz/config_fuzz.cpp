// The relay's TOML configuration: any text is a configuration or a ConfigError naming the place;
// no other exception, crash or hang.

#include <cstdint>
#include <string_view>

#include "outbox/relay/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  try {
    outbox::relay::parse_config(std::string_view(reinterpret_cast<const char*>(data), size),
                                "fuzz.toml");
  } catch (const outbox::relay::ConfigError&) {
  }
  return 0;
}
