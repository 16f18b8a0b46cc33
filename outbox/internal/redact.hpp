#pragma once
// Keeps credentials out of messages and logs: database URLs and targets carry passwords.

#include <string>
#include <string_view>

namespace outbox::internal {

/// `url` with its password (user:PASSWORD@, password=… in a query or a key=value conninfo)
/// replaced by "***". Text that is not a URL comes back unchanged.
std::string redact_url(std::string_view url);

/// `message` with every appearance of `url`'s password (raw or percent-decoded) replaced by
/// "***": drivers echo the URL, or parts of it, in their errors.
std::string redact_secrets(std::string message, std::string_view url);

}  // namespace outbox::internal
