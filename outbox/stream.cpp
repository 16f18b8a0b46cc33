#include "outbox/stream.hpp"

#include <charconv>

#include "outbox/glob.hpp"
#include "outbox/json_codec.hpp"

namespace outbox {
namespace {

std::int64_t parse_number(std::string_view text, std::string_view whole) {
  std::int64_t n = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), n);
  if (ec != std::errc() || end != text.data() + text.size() || n < 0) {
    throw std::invalid_argument("stream position '" + std::string(whole) +
                                "' is not \"seq\" or \"xid:seq\" (non-negative integers)");
  }
  return n;
}

// "name" or "name=value" against the event's tags.
bool tag_matches(std::string_view condition, const Tags& tags) {
  const auto eq = condition.find('=');
  const auto name = condition.substr(0, eq);
  const auto it = tags.find(name);
  if (it == tags.end()) {
    return false;
  }
  return eq == std::string_view::npos || it->second == condition.substr(eq + 1);
}

bool any_glob(const std::vector<std::string>& patterns, std::string_view text) {
  if (patterns.empty()) {
    return true;
  }
  for (const auto& p : patterns) {
    if (glob_match(p, text)) {
      return true;
    }
  }
  return false;
}

constexpr const char* kEventTypes = "event_types";
constexpr const char* kAggregateTypes = "aggregate_types";
constexpr const char* kRequiredTags = "required_tags";
constexpr const char* kAnyOfTags = "any_of_tags";

}  // namespace

std::string StreamPosition::to_string() const {
  return xid == 0 ? std::to_string(seq) : std::to_string(xid) + ":" + std::to_string(seq);
}

StreamPosition StreamPosition::parse(std::string_view text) {
  const auto colon = text.find(':');
  if (colon == std::string_view::npos) {
    return {0, parse_number(text, text)};
  }
  return {parse_number(text.substr(0, colon), text), parse_number(text.substr(colon + 1), text)};
}

std::string_view to_string(SubscriptionStatus status) {
  switch (status) {
    case SubscriptionStatus::Active:
      return "ACTIVE";
    case SubscriptionStatus::Paused:
      return "PAUSED";
    case SubscriptionStatus::Failed:
      return "FAILED";
  }
  return "ACTIVE";
}

SubscriptionStatus parse_subscription_status(std::string_view text) {
  for (auto s :
       {SubscriptionStatus::Active, SubscriptionStatus::Paused, SubscriptionStatus::Failed}) {
    if (text == to_string(s)) {
      return s;
    }
  }
  throw std::invalid_argument("subscription status '" + std::string(text) +
                              "' is not ACTIVE, PAUSED or FAILED");
}

bool SubscriptionFilter::matches(const EventEnvelope& event) const {
  if (!any_glob(event_types, event.event_type()) ||
      !any_glob(aggregate_types, event.aggregate_type())) {
    return false;
  }
  for (const auto& t : required_tags) {
    if (!tag_matches(t, event.tags())) {
      return false;
    }
  }
  if (any_of_tags.empty()) {
    return true;
  }
  for (const auto& t : any_of_tags) {
    if (tag_matches(t, event.tags())) {
      return true;
    }
  }
  return false;
}

std::string SubscriptionFilter::to_json() const {
  return outbox::to_json(StringLists{{kEventTypes, event_types},
                                     {kAggregateTypes, aggregate_types},
                                     {kRequiredTags, required_tags},
                                     {kAnyOfTags, any_of_tags}});
}

SubscriptionFilter SubscriptionFilter::from_json(std::string_view json) {
  SubscriptionFilter f;
  for (auto& [key, items] : parse_string_lists(json)) {
    if (key == kEventTypes) {
      f.event_types = std::move(items);
    } else if (key == kAggregateTypes) {
      f.aggregate_types = std::move(items);
    } else if (key == kRequiredTags) {
      f.required_tags = std::move(items);
    } else if (key == kAnyOfTags) {
      f.any_of_tags = std::move(items);
    } else {
      throw std::invalid_argument("subscription filter: unknown key '" + key +
                                  "' (event_types, aggregate_types, required_tags, any_of_tags)");
    }
  }
  f.validate();
  return f;
}

void SubscriptionFilter::validate() const {
  for (const auto* list : {&event_types, &aggregate_types}) {
    for (const auto& p : *list) {
      if (p.empty()) {
        throw std::invalid_argument("subscription filter: an empty type pattern");
      }
    }
  }
  for (const auto* list : {&required_tags, &any_of_tags}) {
    for (const auto& t : *list) {
      if (t.empty() || t.front() == '=') {
        throw std::invalid_argument("subscription filter: tag condition '" + t +
                                    "' has no tag name (\"name\" or \"name=value\")");
      }
    }
  }
}

void validate_subscription_name(std::string_view name) {
  if (name.empty() || name.size() > 190) {
    throw std::invalid_argument("subscription name must be 1 to 190 characters");
  }
  for (const char c : name) {
    if (c <= ' ' || c > '~') {
      // Quoted printable only: the name may hold NUL or bytes that are not text.
      std::string shown;
      for (const char k : name.substr(0, 64)) {
        shown.push_back(k > ' ' && k <= '~' ? k : '?');
      }
      throw std::invalid_argument("subscription name '" + shown +
                                  "' must be printable ASCII without spaces");
    }
  }
}

int StreamStore::sequence(sql::Connection&, int) {
  return 0;
}

std::int64_t StreamStore::rebase(sql::Connection&) {
  throw std::logic_error("rebase applies to PostgreSQL streams only");
}

}  // namespace outbox
