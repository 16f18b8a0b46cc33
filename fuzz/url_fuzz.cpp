// Database URLs: each engine says whether a text is its URL without crashing; MariaDB's parser
// reads it or refuses it with std::invalid_argument; the password never survives redaction.

#include <cstdint>
#include <cstdlib>
#include <stdexcept>
#include <string>

#include "outbox/detect/detect.hpp"
#include "outbox/internal/redact.hpp"
#include "outbox/mysql/driver.hpp"
#include "outbox/sql/engine.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string url(reinterpret_cast<const char*>(data), size);
  for (const char* dialect : {"sqlite", "postgres", "mysql"}) {
    outbox::engine_for(dialect).accepts(url);
  }
  const std::string redacted = outbox::internal::redact_url(url);
  try {
    const auto options = outbox::mysql::parse_url(url, "OUTBOX_FUZZ_UNSET_PASSWORD");
    // A password that appears once in the URL, long enough not to appear by chance and without
    // the mask itself ('*': the mask next to the user name could spell it again), must be gone.
    const auto& secret = options.password;
    const bool checkable = secret.size() >= 8 && secret.find('*') == std::string::npos &&
                           url.find(secret) == url.rfind(secret);
    if (checkable && redacted.find(secret) != std::string::npos) {
      std::abort();
    }
    if (checkable &&
        outbox::internal::redact_secrets("cannot connect to " + url, url).find(secret) !=
            std::string::npos) {
      std::abort();
    }
  } catch (const std::invalid_argument&) {
  }
  return 0;
}
