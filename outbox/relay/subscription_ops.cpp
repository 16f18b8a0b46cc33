#include "outbox/relay/subscription_ops.hpp"

#include <cstdio>
#include <ctime>
#include <stdexcept>

#include "outbox/json_codec.hpp"
#include "outbox/relay/internal/json_text.hpp"
#include "outbox/sql/connection.hpp"
#include "outbox/store.hpp"

namespace outbox::relay {
namespace {

using internal::append_optional;
using internal::append_text;

void append_list(std::string& out, const char* key, const std::vector<std::string>& items) {
  out += "\"";
  out += key;
  out += "\":[";
  for (std::size_t i = 0; i < items.size(); ++i) {
    out += i ? "," : "";
    append_text(out, items[i]);
  }
  out += "]";
}

double seconds_between(Timestamp from, Timestamp to) {
  return std::max(0.0, std::chrono::duration<double>(to - from).count());
}

std::string fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.3f", v);
  return buf;
}

int digits(std::string_view text, std::size_t at, std::size_t n) {
  if (at + n > text.size()) {
    throw std::invalid_argument("truncated");
  }
  int v = 0;
  for (std::size_t i = at; i < at + n; ++i) {
    if (text[i] < '0' || text[i] > '9') {
      throw std::invalid_argument("not a digit");
    }
    v = v * 10 + (text[i] - '0');
  }
  return v;
}

}  // namespace

Timestamp parse_rfc3339(std::string_view text) {
  try {
    if (text.size() < 20 || text[4] != '-' || text[7] != '-' ||
        (text[10] != 'T' && text[10] != 't' && text[10] != ' ') || text[13] != ':' ||
        text[16] != ':') {
      throw std::invalid_argument("layout");
    }
    std::tm tm{};
    const int year = digits(text, 0, 4);
    tm.tm_year = year - 1900;
    tm.tm_mon = digits(text, 5, 2) - 1;
    tm.tm_mday = digits(text, 8, 2);
    tm.tm_hour = digits(text, 11, 2);
    tm.tm_min = digits(text, 14, 2);
    tm.tm_sec = digits(text, 17, 2);
    // A leap second (:60) is the second after :59.
    const int leap = tm.tm_sec == 60 ? 1 : 0;
    tm.tm_sec -= leap;
    if (tm.tm_mon > 11 || tm.tm_mday < 1 || tm.tm_mday > 31 || tm.tm_hour > 23 || tm.tm_min > 59 ||
        tm.tm_sec > 60) {
      throw std::invalid_argument("range");
    }
    std::size_t pos = 19;
    std::int64_t micros = 0;
    if (pos < text.size() && text[pos] == '.') {
      std::size_t n = 0;
      for (++pos; pos < text.size() && text[pos] >= '0' && text[pos] <= '9'; ++pos, ++n) {
        if (n < 6) {
          micros = micros * 10 + (text[pos] - '0');
        }
      }
      if (n == 0) {
        throw std::invalid_argument("fraction");
      }
      for (; n < 6; ++n) {
        micros *= 10;
      }
    }
    std::int64_t offset = 0;
    if (pos < text.size() && (text[pos] == 'Z' || text[pos] == 'z') && pos + 1 == text.size()) {
      offset = 0;
    } else if (pos + 6 == text.size() && (text[pos] == '+' || text[pos] == '-') &&
               text[pos + 3] == ':') {
      const int hours = digits(text, pos + 1, 2), minutes = digits(text, pos + 4, 2);
      if (hours > 23 || minutes > 59) {
        throw std::invalid_argument("offset");
      }
      offset = (hours * 60 + minutes) * 60;
      offset = text[pos] == '-' ? -offset : offset;
    } else {
      throw std::invalid_argument("zone");
    }
    const std::tm asked = tm;
    const std::int64_t seconds = static_cast<std::int64_t>(timegm(&tm)) - offset + leap;
    // timegm normalizes (February 31st becomes March 3rd): a date it changed did not exist.
    if (tm.tm_mday != asked.tm_mday || tm.tm_mon != asked.tm_mon) {
      throw std::invalid_argument("no such date");
    }
    // Timestamps count nanoseconds in 64 bits: 1677-09-21 to 2262-04-11. Beyond, the nearest end
    // (a rewind "to 9999" means after everything, "to 1600" before everything).
    constexpr std::int64_t kMin = -9223372036LL + 1, kMax = 9223372036LL - 1;
    if (year < 1678 || seconds < kMin) {
      return from_micros(kMin * 1000000);
    }
    if (year > 2261 || seconds > kMax) {
      return from_micros(kMax * 1000000);
    }
    return from_micros(seconds * 1000000 + micros);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("'" + std::string(text.substr(0, 64)) +
                                "' is not an RFC 3339 time such as 2026-11-24T08:00:00Z");
  }
}

StreamReport read_stream(sql::Connection& conn, StreamStore& stream, LeaseStore* leases,
                         std::optional<std::string_view> name) {
  StreamReport report;
  report.head = stream.head(conn);
  report.holdback = stream.holdback(conn);
  std::vector<SubscriptionState> states;
  if (name) {
    if (auto one = stream.find(conn, *name)) {
      states.push_back(std::move(*one));
    }
  } else {
    states = stream.list(conn);
  }
  for (auto& st : states) {
    SubscriptionReport r;
    r.lag = stream.lag(conn, st.cursor);
    if (leases != nullptr) {
      try {
        r.lease = leases->find(conn, "sub:" + st.spec.name);
      } catch (const std::invalid_argument& e) {  // a row written with SQL under a bad name
        st.problem = std::string("name: ") + e.what();
      }
    }
    r.state = std::move(st);
    report.subscriptions.push_back(std::move(r));
  }
  return report;
}

std::string to_json(const SubscriptionReport& r, Timestamp now) {
  const auto& st = r.state;
  std::string out = "{\"name\":";
  append_text(out, st.spec.name);
  out += ",\"status\":\"" + std::string(to_string(st.status)) + "\",\"cursor\":\"" +
         st.cursor.to_string() + "\",\"publisher\":";
  append_text(out, st.spec.publisher);
  out += ",\"target\":";
  append_text(out, st.spec.target);
  out += ",\"filter\":{";
  append_list(out, "event_types", st.spec.filter.event_types);
  out += ",";
  append_list(out, "aggregate_types", st.spec.filter.aggregate_types);
  out += ",";
  append_list(out, "required_tags", st.spec.filter.required_tags);
  out += ",";
  append_list(out, "any_of_tags", st.spec.filter.any_of_tags);
  out += "},\"error_count\":" + std::to_string(st.error_count) + ",\"last_error\":";
  append_optional(out, st.last_error);
  out += ",\"delivered\":" + std::to_string(st.delivered) + ",\"last_delivered_at\":";
  append_optional(out, st.last_delivered_at ? std::optional(format_rfc3339(*st.last_delivered_at))
                                            : std::nullopt);
  out += ",\"problem\":";
  append_optional(out, st.problem);
  out += ",\"released_at\":";
  append_optional(out,
                  st.released_at ? std::optional(format_rfc3339(*st.released_at)) : std::nullopt);
  out += ",\"lag_events\":" + std::to_string(r.lag.events) + ",\"lag_seconds\":" +
         (r.lag.oldest_unread ? fixed(seconds_between(*r.lag.oldest_unread, now)) : "0") +
         ",\"holder\":";
  append_optional(out, r.lease && r.lease->live ? r.lease->owner : std::nullopt);
  out += ",\"waiting\":";
  append_text(out, r.waiting);
  out += std::string(",\"lagging\":") + (r.lagging ? "true" : "false") + "}";
  return out;
}

std::string to_json(const StreamReport& report) {
  const auto now = Clock::system()->now();
  std::string out = "{\"head\":\"" + report.head.to_string() + "\",\"holdback\":";
  if (report.holdback) {
    out += "{\"pid\":" + std::to_string(report.holdback->pid) + ",\"age_seconds\":" +
           fixed(std::chrono::duration<double>(report.holdback->age).count()) + ",\"state\":";
    append_text(out, report.holdback->state);
    out += "}";
  } else {
    out += "null";
  }
  out += ",\"subscriptions\":[";
  for (std::size_t i = 0; i < report.subscriptions.size(); ++i) {
    out += (i ? "," : "") + to_json(report.subscriptions[i], now);
  }
  return out + "]}";
}

std::string to_text(const StreamReport& report) {
  const auto now = Clock::system()->now();
  std::string out = "stream head: " + report.head.to_string() + "\n";
  if (report.holdback) {
    out += "held back by: pid " + std::to_string(report.holdback->pid) + ", transaction open " +
           fixed(std::chrono::duration<double>(report.holdback->age).count()) + " s (" +
           report.holdback->state + ")\n";
  }
  if (report.subscriptions.empty()) {
    return out + "no subscriptions\n";
  }
  char line[512];
  std::snprintf(line, sizeof line, "%-24s %-7s %-16s %10s %9s %10s  %s\n", "NAME", "STATUS",
                "CURSOR", "LAG", "LAG(s)", "DELIVERED", "HOLDER / LAST ERROR");
  out += line;
  for (const auto& r : report.subscriptions) {
    const auto& st = r.state;
    std::string note = r.lease && r.lease->live ? r.lease->owner.value_or("") : "-";
    if (st.problem) {
      note += " / not run: " + st.problem->substr(0, 120);
    } else if (st.last_error) {
      note += " / " + st.last_error->substr(0, 120);
    }
    std::snprintf(
        line, sizeof line, "%-24s %-7s %-16s %10lld %9s %10lld  %s\n", st.spec.name.c_str(),
        std::string(to_string(st.status)).c_str(), st.cursor.to_string().c_str(),
        static_cast<long long>(r.lag.events),
        r.lag.oldest_unread ? fixed(seconds_between(*r.lag.oldest_unread, now)).c_str() : "0",
        static_cast<long long>(st.delivered), note.c_str());
    out += line;
  }
  return out;
}

StreamPosition rewind_target(sql::Connection& conn, StreamStore& stream, std::string_view to) {
  if (to == "start" || to == "beginning") {
    return {};
  }
  if (to == "end") {
    return stream.head(conn);
  }
  if (to.size() >= 20 && to[4] == '-') {
    return stream.position_before(conn, parse_rfc3339(to));
  }
  const std::string form = stream.positions_have_xid() ? "\"xid:seq\"" : "\"seq\"";
  StreamPosition p;
  try {
    p = StreamPosition::parse(to);
  } catch (const std::invalid_argument&) {
    throw std::invalid_argument("rewind target '" + sanitize_utf8(to.substr(0, 64)) +
                                "' is not start, end, an RFC 3339 time or a position (" + form +
                                ")");
  }
  // A position the stream cannot have would stop the subscription for good (beyond the head) or
  // be read as another one (a seq alone on PostgreSQL, an xid elsewhere).
  if ((p.xid != 0) != stream.positions_have_xid() && p != StreamPosition{}) {
    throw std::invalid_argument("positions of this stream are " + form + ", not '" + p.to_string() +
                                "'");
  }
  const auto head = stream.head(conn);
  if (p > head) {
    throw std::invalid_argument("position " + p.to_string() + " is beyond the stream's head (" +
                                head.to_string() + ")");
  }
  return p;
}

std::optional<SubscriptionState> apply_subscription_action(sql::Connection& conn,
                                                           StreamStore& stream,
                                                           std::string_view name,
                                                           std::string_view action,
                                                           std::optional<std::string_view> to) {
  using S = SubscriptionStatus;
  if (action != "pause" && action != "resume" && action != "reset" && action != "rewind") {
    throw std::invalid_argument("unknown action '" + std::string(action.substr(0, 32)) +
                                "' (pause, resume, reset, rewind)");
  }
  const auto before = stream.find(conn, name);
  if (!before) {
    return std::nullopt;
  }
  auto refuse = [&](const char* allowed) {
    throw std::logic_error("subscription " + std::string(name) + " is " +
                           std::string(to_string(before->status)) + ": " + std::string(action) +
                           " applies to " + allowed + " subscriptions");
  };
  if (action == "pause") {
    if (before->status != S::Paused &&
        !stream.set_status(conn, name, S::Paused, {S::Active, S::Failed})) {
      refuse("ACTIVE or FAILED");
    }
  } else if (action == "resume") {
    if (before->status != S::Active && !stream.set_status(conn, name, S::Active, {S::Paused})) {
      refuse("PAUSED");
    }
  } else if (action == "reset") {
    if (!stream.set_status(conn, name, S::Active, {S::Failed})) {
      refuse("FAILED");
    }
  } else {
    stream.rewind(conn, name, rewind_target(conn, stream, to.value_or("start")));
  }
  return stream.find(conn, name);
}

}  // namespace outbox::relay
