#pragma once
// W3C Trace Context (https://www.w3.org/TR/trace-context/) carried with events: the writer stamps
// each event with the caller's current trace, the row keeps it in its headers, and the Kafka and
// HTTP publishers forward it as the `traceparent` and `tracestate` headers.

#include <functional>
#include <optional>
#include <string>
#include <string_view>

namespace outbox {

class EventEnvelope;

/// The header names under which an event carries its trace context.
inline constexpr std::string_view kTraceparentHeader = "traceparent";
inline constexpr std::string_view kTracestateHeader = "tracestate";

/// One trace context: the `traceparent` value and the optional `tracestate` (empty: none).
struct TraceContext {
  std::string traceparent;
  std::string tracestate;
};

/// The caller's current trace context, asked on the writing thread inside write(); nullopt when
/// there is none. An exception counts as none.
using TraceContextProvider = std::function<std::optional<TraceContext>()>;

/// True for a valid `traceparent`: version 00 exactly as the specification writes it (55
/// characters, lowercase hex, trace id and parent id not all zeros), or a later version (not ff)
/// whose first 55 characters read so, followed by nothing or "-" and visible ASCII, at most 512
/// characters in all.
bool valid_traceparent(std::string_view value) noexcept;
/// True for a valid `tracestate`: at most 512 characters, at most 32 comma-separated `key=value`
/// members (keys as the specification defines them, each once; values 1–256 printable ASCII
/// characters without ',' or '=' and not ending with a space); empty members are allowed.
bool valid_tracestate(std::string_view value) noexcept;

/// What stamping did to an event's trace headers.
enum class TraceStamp {
  Unchanged,  ///< nothing to stamp, or the event's own valid headers kept
  Stamped,    ///< the provider's context added
  Dropped,    ///< an invalid value was removed (a tracestate alone counts as invalid)
};

/// The event with its trace context: its own `traceparent` header when it has one, otherwise the
/// provider's (when given). An invalid traceparent removes both headers; an invalid tracestate
/// only itself. Never throws for a bad value: the business transaction must not fail for it.
EventEnvelope stamp_trace_context(const EventEnvelope& event, const TraceContextProvider& provider,
                                  TraceStamp& outcome);

/// A span a relay starts around publishing an event (a tracing library behind it): the consumer
/// then sees the relay's span as its parent. Implementations must be thread-safe (workers publish
/// in parallel).
class PublishSpanHook {
 public:
  virtual ~PublishSpanHook() = default;
  /// Before `event` is published; `parent` is its valid trace context, if it has one. Returns the
  /// context to forward instead (the child span's), or nullopt to forward the event's own. A
  /// throw counts as nullopt; an invalid traceparent returned is not forwarded (the event's own
  /// is), an invalid tracestate is left out.
  virtual std::optional<TraceContext> start(const EventEnvelope& event,
                                            const std::optional<TraceContext>& parent) = 0;
  /// After the publish of an event start() was called for: its outcome (`error` empty when
  /// delivered). A throw is ignored.
  virtual void end(const EventEnvelope& /*event*/, bool /*delivered*/, std::string_view /*error*/) {
  }
};

/// The event as `hook` wants it forwarded: with the child context start() returned in place of
/// its own trace headers, or nullopt to forward it as it is (see PublishSpanHook::start).
std::optional<EventEnvelope> start_publish_span(PublishSpanHook& hook, const EventEnvelope& event);

/// Sets the calling thread's current trace context until destroyed (the one set before it comes
/// back; scopes may end in any order): for applications that track their trace themselves. Not
/// copyable or movable; destroyed on the thread that made it.
class ScopedTraceContext {
 public:
  explicit ScopedTraceContext(TraceContext context);
  ~ScopedTraceContext();
  ScopedTraceContext(const ScopedTraceContext&) = delete;
  ScopedTraceContext& operator=(const ScopedTraceContext&) = delete;

 private:
  TraceContext context_;
};

/// The provider that reads the calling thread's innermost ScopedTraceContext.
TraceContextProvider thread_trace_context();

}  // namespace outbox
