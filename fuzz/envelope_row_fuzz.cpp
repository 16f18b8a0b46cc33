// A row as the poller reads it from a table any client may write: every field from the input.
// Decoding gives an envelope or throws a std::exception (the row then goes DEAD with the reason);
// it never crashes or hangs, and a decoded envelope's payload is the row's.

#include <cstdint>
#include <cstdlib>
#include <exception>

#include "fuzz/fuzz_input.hpp"
#include "outbox/envelope.hpp"
#include "outbox/json_codec.hpp"
#include "outbox/store.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto f = outbox::fuzz::fields(data, size, 10);
  outbox::OutboxEvent row;
  row.event_id = f[0];
  row.event_type = f[1];
  row.aggregate_type = f[2];
  if (!f[3].empty())
    row.aggregate_id = f[3];
  if (!f[4].empty())
    row.tenant_id = f[4];
  row.payload = f[5];
  row.payload_is_json = f[6].empty() || f[6][0] % 2 == 0;
  if (!f[7].empty())
    row.headers_json = f[7];
  if (!f[8].empty())
    row.tags_json = f[8];
  if (!f[9].empty())
    row.message_group = f[9];
  try {
    const auto envelope = outbox::to_envelope(row, outbox::JsonCodec::default_codec());
    const auto bytes = envelope.payload_bytes();
    if (std::string(bytes.begin(), bytes.end()) != row.payload ||
        envelope.event_id() != row.event_id) {
      std::abort();
    }
  } catch (const std::exception&) {
  }
  return 0;
}
