// W3C Trace Context values: the specification's valid and invalid forms, and what stamping does
// to an event's headers (own values kept, provider's added, invalid ones removed, never a throw).

#include "outbox/trace_context.hpp"

#include <gtest/gtest.h>

#include <memory>
#include <thread>
#include <vector>

#include "outbox/envelope.hpp"

namespace outbox {
namespace {

const std::string kParent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

TEST(TraceContext, TraceparentAsTheSpecificationWritesIt) {
  EXPECT_TRUE(valid_traceparent(kParent));
  EXPECT_TRUE(valid_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"));
  // A later version may add fields after a '-'; version 00 may not.
  EXPECT_TRUE(valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-xyz"));
  EXPECT_FALSE(valid_traceparent(kParent + "-xyz"));
  EXPECT_FALSE(valid_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01xyz"));
  for (const std::string& bad : std::vector<std::string>{
           "",
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",      // no flags
           "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // forbidden version
           "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
           "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero parent id
           "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // uppercase
           "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",   // dashes misplaced
           "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0g",   // not hex
           "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // wrong separator
           " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // padded
           std::string("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0\0", 55),
       }) {
    EXPECT_FALSE(valid_traceparent(bad)) << bad;
  }
}

TEST(TraceContext, TracestateAsTheSpecificationWritesIt) {
  for (const std::string& good : std::vector<std::string>{
           "",
           "congo=t61rcWkgMzE",
           "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE",
           "rojo=00f067aa0ba902b7 , congo=t61rcWkgMzE",
           "tenant1@vendor=opaque value",
           "a=1,,b=2",  // empty members are allowed
           "k_-*/9=~!\"#$%&'()*+-./:;<>?@[\\]^_`{|}",
       }) {
    EXPECT_TRUE(valid_tracestate(good)) << good;
  }
  std::string many;
  for (int i = 0; i < 33; ++i) {
    many += (i ? "," : "") + std::string("k") + std::to_string(i) + "=v";
  }
  for (const std::string& bad : std::vector<std::string>{
           "Rojo=1",                      // uppercase key
           "1abc=1",                      // simple key starting with a digit
           "rojo",                        // no value
           "rojo=",                       // empty value
           "rojo=a,rojo=b",               // a key twice
           "rojo=a=b",                    // '=' in a value
           "rojo=caf\xc3\xa9",            // not ASCII
           "tenant@Vendor=1",             // uppercase system id
           "tenant@systemidtoolong15=1",  // system id over 14
           std::string("rojo=a\0b", 8),   // NUL
       }) {
    EXPECT_FALSE(valid_tracestate(bad)) << bad;
  }
  EXPECT_FALSE(valid_tracestate(many));                          // 33 members
  EXPECT_FALSE(valid_tracestate("k=" + std::string(511, 'v')));  // over 512 characters
}

EventEnvelope event(Headers headers = {}) {
  return EventEnvelope::builder(EventType::of("E")).headers(headers).payload_json("{}").build();
}

TEST(TraceContext, StampingAddsTheProvidersContextAndKeepsTheEventsOwn) {
  TraceStamp stamp;
  const TraceContextProvider provider = [] {
    return std::optional<TraceContext>(TraceContext{kParent, "rojo=1"});
  };
  auto stamped = stamp_trace_context(event({{"k", "v"}}), provider, stamp);
  EXPECT_EQ(stamp, TraceStamp::Stamped);
  EXPECT_EQ(stamped.headers(),
            (Headers{{"k", "v"}, {"traceparent", kParent}, {"tracestate", "rojo=1"}}));
  // The event's own valid traceparent wins over the provider's.
  const std::string own = "00-11111111111111111111111111111111-2222222222222222-01";
  stamped = stamp_trace_context(event({{"traceparent", own}}), provider, stamp);
  EXPECT_EQ(stamp, TraceStamp::Unchanged);
  EXPECT_EQ(stamped.headers(), (Headers{{"traceparent", own}}));
  // No provider, no headers: nothing changes.
  stamped = stamp_trace_context(event({{"k", "v"}}), {}, stamp);
  EXPECT_EQ(stamp, TraceStamp::Unchanged);
  EXPECT_EQ(stamped.headers(), (Headers{{"k", "v"}}));
  // A provider that has nothing, or throws, is no trace.
  stamped = stamp_trace_context(
      event(), [] { return std::optional<TraceContext>(); }, stamp);
  EXPECT_EQ(stamp, TraceStamp::Unchanged);
  EXPECT_TRUE(stamped.headers().empty());
  stamped = stamp_trace_context(
      event(), []() -> std::optional<TraceContext> { throw std::runtime_error("tracer down"); },
      stamp);
  EXPECT_EQ(stamp, TraceStamp::Unchanged);
  EXPECT_TRUE(stamped.headers().empty());
}

TEST(TraceContext, InvalidValuesAreRemovedNeverThrown) {
  TraceStamp stamp;
  // An invalid own traceparent takes its tracestate with it; the other headers stay.
  auto e = stamp_trace_context(
      event({{"traceparent", "garbage"}, {"tracestate", "rojo=1"}, {"k", "v"}}), {}, stamp);
  EXPECT_EQ(stamp, TraceStamp::Dropped);
  EXPECT_EQ(e.headers(), (Headers{{"k", "v"}}));
  // A valid traceparent with an invalid tracestate keeps the traceparent.
  e = stamp_trace_context(event({{"traceparent", kParent}, {"tracestate", "Bad=1"}}), {}, stamp);
  EXPECT_EQ(stamp, TraceStamp::Dropped);
  EXPECT_EQ(e.headers(), (Headers{{"traceparent", kParent}}));
  // A tracestate alone belongs to no trace.
  e = stamp_trace_context(event({{"tracestate", "rojo=1"}}), {}, stamp);
  EXPECT_EQ(stamp, TraceStamp::Dropped);
  EXPECT_TRUE(e.headers().empty());
  // The provider's invalid context is not written.
  e = stamp_trace_context(
      event(),
      [] {
        return std::optional<TraceContext>(TraceContext{"00-zz", ""});
      },
      stamp);
  EXPECT_EQ(stamp, TraceStamp::Dropped);
  EXPECT_TRUE(e.headers().empty());
}

TEST(TraceContext, HeaderNamesMatchAsHttpMatchesThem) {
  TraceStamp stamp;
  // Another spelling is the same header: normalized, not sent twice.
  auto e = stamp_trace_context(event({{"Traceparent", kParent}}), {}, stamp);
  EXPECT_EQ(stamp, TraceStamp::Unchanged);
  EXPECT_EQ(e.headers(), (Headers{{"traceparent", kParent}}));
  // Two spellings with two values: which one is the trace is unknown, so neither is kept.
  e = stamp_trace_context(
      event({{"traceparent", kParent},
             {"TRACEPARENT", "00-11111111111111111111111111111111-2222222222222222-01"}}),
      {}, stamp);
  EXPECT_EQ(stamp, TraceStamp::Dropped);
  EXPECT_TRUE(e.headers().empty());
}

// A later version's added fields travel as an HTTP header value: no controls, no NUL, no bytes
// beyond ASCII, a bounded size. Such a value, from the provider or the event, is dropped: the
// write never fails for it.
TEST(TraceContext, ALaterVersionsTailIsCheckedAndABadOneNeverFailsTheWrite) {
  const std::string head = "cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
  EXPECT_TRUE(valid_traceparent(head + "-what-comes-next"));
  for (const std::string& tail :
       std::vector<std::string>{std::string("-\0x", 3), "-\xff", "-a\r\nX-Evil: 1", "-a b",
                                "-" + std::string(600, 'a')}) {
    EXPECT_FALSE(valid_traceparent(head + tail)) << tail.size();
    TraceStamp stamp;
    const auto bad = head + tail;
    const auto e = stamp_trace_context(
        event({{"k", "v"}}),
        [&] {
          return std::optional<TraceContext>(TraceContext{bad, ""});
        },
        stamp);
    EXPECT_EQ(stamp, TraceStamp::Dropped);
    EXPECT_EQ(e.headers(), (Headers{{"k", "v"}}));
  }
}

TEST(TraceContext, BlanksAroundAValueAndAnEmptyTracestateAreCleanedUp) {
  TraceStamp stamp;
  auto e = stamp_trace_context(event({{"traceparent", " " + kParent + "\t"}, {"tracestate", ""}}),
                               {}, stamp);
  EXPECT_EQ(stamp, TraceStamp::Unchanged);
  EXPECT_EQ(e.headers(), (Headers{{"traceparent", kParent}}));
}

TEST(TraceContext, ScopesMayEndInAnyOrder) {
  const auto provider = thread_trace_context();
  auto outer = std::make_unique<ScopedTraceContext>(TraceContext{kParent, ""});
  auto inner = std::make_unique<ScopedTraceContext>(
      TraceContext{"00-11111111111111111111111111111111-2222222222222222-01", ""});
  outer.reset();  // the outer one ends first (an object holding it went away)
  EXPECT_EQ(provider()->traceparent, "00-11111111111111111111111111111111-2222222222222222-01");
  inner.reset();
  EXPECT_FALSE(provider());
}

TEST(TraceContext, ScopedContextIsThePerThreadCurrentOne) {
  const auto provider = thread_trace_context();
  EXPECT_FALSE(provider());
  {
    ScopedTraceContext outer({kParent, ""});
    EXPECT_EQ(provider()->traceparent, kParent);
    {
      ScopedTraceContext inner({"00-11111111111111111111111111111111-2222222222222222-01", "a=b"});
      EXPECT_EQ(provider()->tracestate, "a=b");
      std::optional<TraceContext> elsewhere;
      std::thread([&] { elsewhere = provider(); }).join();
      EXPECT_FALSE(elsewhere);  // another thread has its own (none)
    }
    EXPECT_EQ(provider()->traceparent, kParent);
  }
  EXPECT_FALSE(provider());
}

}  // namespace
}  // namespace outbox
