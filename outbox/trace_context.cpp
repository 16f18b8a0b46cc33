#include "outbox/trace_context.hpp"

#include <algorithm>
#include <set>
#include <vector>

#include "outbox/envelope.hpp"
#include "outbox/internal/ascii.hpp"

namespace outbox {
namespace {

bool lower_hex(std::string_view s) {
  for (char c : s) {
    if (!((c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'))) {
      return false;
    }
  }
  return true;
}

bool all_zeros(std::string_view s) {
  return s.find_first_not_of('0') == std::string_view::npos;
}

bool lcalpha(char c) {
  return c >= 'a' && c <= 'z';
}
bool digit(char c) {
  return c >= '0' && c <= '9';
}
bool key_char(char c) {
  return lcalpha(c) || digit(c) || c == '_' || c == '-' || c == '*' || c == '/';
}

// simple-key = lcalpha 0*255(key_char); multi-tenant key = tenant-id "@" system-id, tenant-id
// (lcalpha / DIGIT) 0*240(key_char), system-id lcalpha 0*13(key_char).
bool valid_key(std::string_view key) {
  const auto at = key.find('@');
  const auto chars_ok = [](std::string_view s, std::size_t from) {
    for (std::size_t i = from; i < s.size(); ++i) {
      if (!key_char(s[i])) {
        return false;
      }
    }
    return true;
  };
  if (at == std::string_view::npos) {
    return !key.empty() && key.size() <= 256 && lcalpha(key[0]) && chars_ok(key, 1);
  }
  const auto tenant = key.substr(0, at);
  const auto system = key.substr(at + 1);
  return !tenant.empty() && tenant.size() <= 241 && (lcalpha(tenant[0]) || digit(tenant[0])) &&
         chars_ok(tenant, 1) && !system.empty() && system.size() <= 14 && lcalpha(system[0]) &&
         chars_ok(system, 1);
}

// value = 0*255(chr) nblk-chr; chr = %x20 / nblk-chr; nblk-chr = %x21-2B / %x2D-3C / %x3E-7E.
bool valid_value(std::string_view value) {
  if (value.empty() || value.size() > 256 || value.back() == ' ') {
    return false;
  }
  for (char c : value) {
    if (c < 0x20 || c > 0x7e || c == ',' || c == '=') {
      return false;
    }
  }
  return true;
}

// The calling thread's scopes, innermost last.
thread_local std::vector<const TraceContext*> scopes;

}  // namespace

bool valid_traceparent(std::string_view value) noexcept {
  if (value.size() < 55 || value[2] != '-' || value[35] != '-' || value[52] != '-') {
    return false;
  }
  const auto version = value.substr(0, 2);
  const auto trace_id = value.substr(3, 32);
  const auto parent_id = value.substr(36, 16);
  const auto flags = value.substr(53, 2);
  if (!lower_hex(version) || version == "ff" || !lower_hex(trace_id) || all_zeros(trace_id) ||
      !lower_hex(parent_id) || all_zeros(parent_id) || !lower_hex(flags)) {
    return false;
  }
  if (version == "00") {
    return value.size() == 55;
  }
  if (value.size() == 55) {
    return true;
  }
  // A later version's added fields are opaque, but they travel as an HTTP header value.
  if (value[55] != '-' || value.size() > 512) {
    return false;
  }
  for (std::size_t i = 56; i < value.size(); ++i) {
    if (value[i] < 0x21 || value[i] > 0x7e) {
      return false;
    }
  }
  return true;
}

bool valid_tracestate(std::string_view value) noexcept {
  if (value.size() > 512) {
    return false;
  }
  try {
    std::set<std::string_view> keys;
    std::size_t members = 0;
    while (true) {
      const auto comma = value.find(',');
      const auto member = internal::trim_blanks(value.substr(0, comma));
      if (!member.empty()) {
        const auto eq = member.find('=');
        if (eq == std::string_view::npos || !valid_key(member.substr(0, eq)) ||
            !valid_value(member.substr(eq + 1)) || !keys.insert(member.substr(0, eq)).second ||
            ++members > 32) {
          return false;
        }
      }
      if (comma == std::string_view::npos) {
        return true;
      }
      value.remove_prefix(comma + 1);
    }
  } catch (...) {
    return false;  // out of memory for the key set
  }
}

EventEnvelope stamp_trace_context(const EventEnvelope& event, const TraceContextProvider& provider,
                                  TraceStamp& outcome) {
  outcome = TraceStamp::Unchanged;
  const auto& headers = event.headers();
  // Header names are matched as HTTP matches them (case-insensitively): "Traceparent" next to a
  // stamped "traceparent" would reach a receiver as two values.
  std::optional<std::string> own_parent, own_state;
  int seen = 0;
  bool respelled = false;
  for (const auto& [name, value] : headers) {
    if (internal::iequals(name, kTraceparentHeader)) {
      own_parent = value;
      respelled = respelled || name != kTraceparentHeader;
      ++seen;
    } else if (internal::iequals(name, kTracestateHeader)) {
      own_state = value;
      respelled = respelled || name != kTracestateHeader;
      ++seen;
    }
  }
  std::optional<TraceContext> context;
  bool from_provider = false;
  if (own_parent) {
    context = TraceContext{*own_parent, own_state.value_or(std::string())};
  } else if (provider) {
    try {
      context = provider();
    } catch (...) {
      context.reset();  // a failing provider is no trace, never a failed write
    }
    from_provider = context.has_value();
  }
  if (seen == 0 && !context) {
    return event;
  }
  bool trimmed = false;  // blanks around a value (allowed around an HTTP header's value)
  if (context) {
    for (auto* value : {&context->traceparent, &context->tracestate}) {
      std::string clean(internal::trim_blanks(*value));
      trimmed = trimmed || clean != *value;
      *value = std::move(clean);
    }
  }
  Headers out;
  for (const auto& [name, value] : headers) {
    if (!internal::iequals(name, kTraceparentHeader) &&
        !internal::iequals(name, kTracestateHeader)) {
      out.emplace(name, value);
    }
  }
  // A tracestate alone belongs to no trace; two spellings of one header are two values.
  const bool ambiguous = seen > (own_parent ? 1 : 0) + (own_state ? 1 : 0);
  // Only the event's own other headers: with_headers has nothing new to check, cannot throw.
  const auto without_trace = [&] { return event.with_headers(out); };
  if (!context || ambiguous || !valid_traceparent(context->traceparent)) {
    outcome = TraceStamp::Dropped;
    return without_trace();
  }
  const bool state_ok = context->tracestate.empty() || valid_tracestate(context->tracestate);
  const bool empty_state = own_state && context->tracestate.empty();  // "" is no tracestate
  if (!from_provider && state_ok && !respelled && !trimmed && !empty_state) {
    return event;  // the event's own valid headers, as they are
  }
  Headers stamped = out;
  stamped.emplace(std::string(kTraceparentHeader), context->traceparent);
  if (state_ok && !context->tracestate.empty()) {
    stamped.emplace(std::string(kTracestateHeader), context->tracestate);
  }
  try {
    auto result = event.with_headers(std::move(stamped));
    outcome = !state_ok       ? TraceStamp::Dropped
              : from_provider ? TraceStamp::Stamped
                              : TraceStamp::Unchanged;
    return result;
  } catch (const std::exception&) {
    outcome = TraceStamp::Dropped;  // a value no header may hold: never a failed write
    return without_trace();
  }
}

std::optional<EventEnvelope> start_publish_span(PublishSpanHook& hook, const EventEnvelope& event) {
  const auto& headers = event.headers();
  std::optional<std::string> own_parent, own_state;
  for (const auto& [name, value] : headers) {
    if (internal::iequals(name, kTraceparentHeader)) {
      own_parent = value;
    } else if (internal::iequals(name, kTracestateHeader)) {
      own_state = value;
    }
  }
  std::optional<TraceContext> parent;
  if (own_parent && valid_traceparent(*own_parent)) {
    parent = TraceContext{*own_parent, own_state.value_or(std::string())};
  }
  std::optional<TraceContext> child;
  try {
    child = hook.start(event, parent);
  } catch (...) {
    return std::nullopt;  // a failing tracer never stops a publish
  }
  if (!child || !valid_traceparent(child->traceparent)) {
    return std::nullopt;
  }
  Headers out;
  for (const auto& [name, value] : headers) {
    if (!internal::iequals(name, kTraceparentHeader) &&
        !internal::iequals(name, kTracestateHeader)) {
      out.emplace(name, value);
    }
  }
  out.emplace(std::string(kTraceparentHeader), child->traceparent);
  if (!child->tracestate.empty() && valid_tracestate(child->tracestate)) {
    out.emplace(std::string(kTracestateHeader), child->tracestate);
  }
  try {
    return event.with_headers(std::move(out));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

ScopedTraceContext::ScopedTraceContext(TraceContext context) : context_(std::move(context)) {
  scopes.push_back(&context_);
}

ScopedTraceContext::~ScopedTraceContext() {
  // Not necessarily the innermost: an object holding one may outlive a later one.
  const auto it = std::find(scopes.rbegin(), scopes.rend(), &context_);
  if (it != scopes.rend()) {
    scopes.erase(std::next(it).base());
  }
}

TraceContextProvider thread_trace_context() {
  return []() -> std::optional<TraceContext> {
    if (scopes.empty()) {
      return std::nullopt;
    }
    return *scopes.back();
  };
}

}  // namespace outbox
