// What a webhook receiver answers: any status, Retry-After and body give Ok, Retriable or
// Permanent; the reason is valid UTF-8 without control characters (it goes into the table's
// last_error); a Retry-After is honoured for at most an hour.

#include <chrono>
#include <cstdint>
#include <cstdlib>

#include "fuzz/fuzz_input.hpp"
#include "outbox/http/internal/response.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size < 2) {
    return 0;
  }
  const long status = 100 + (data[0] * 256 + data[1]) % 500;
  const auto f = outbox::fuzz::fields(data + 2, size - 2, 3);
  namespace h = outbox::http::internal;
  const auto retry_after = h::retry_after_header(f[0]);
  const h::BodyStart body{f[1], !f[2].empty()};
  const auto result = h::classify_status(status, body, retry_after.value_or(f[2]));
  if (!outbox::fuzz::valid_utf8(result.reason)) {
    std::abort();
  }
  for (char c : result.reason) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) {
      std::abort();
    }
  }
  if (result.retry_after && (*result.retry_after <= std::chrono::milliseconds(0) ||
                             *result.retry_after > std::chrono::hours(1))) {
    std::abort();
  }
  return 0;
}
