#include "outbox/lease.hpp"

#include <stdexcept>

namespace outbox {

void validate_lease_name(std::string_view name) {
  if (name.empty() || name.size() > 200) {
    throw std::invalid_argument("lease name or owner must be 1 to 200 bytes");
  }
  for (const char c : name) {
    if (c < 0x21 || c > 0x7e) {
      // Spaces too: MariaDB compares keys with trailing spaces as equal to those without.
      throw std::invalid_argument("lease name or owner '" + std::string(name) +
                                  "' must be printable ASCII without spaces");
    }
  }
}

}  // namespace outbox
