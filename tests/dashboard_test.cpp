// The relay's dashboard in a real browser (headless Chromium over the DevTools protocol): a relay
// on a seeded SQLite file, the page asked for its token, the seeded numbers on screen, actions
// refused without the token, a dead-letter group replayed by clicking the page's own button (the
// rows change in the database), and screenshots kept as artifacts (build/artifacts).

#include <gtest/gtest.h>

#include <filesystem>

#include "outbox/detect/detect.hpp"
#include "outbox/failure_fingerprint.hpp"
#include "outbox/sql/connection.hpp"
#include "tests/support/chromium.hpp"
#include "tests/support/http_server.hpp"
#include "tests/support/relay_cli.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;
using testing::HeadlessChromium;
using testing::RelayProcess;

class Dashboard : public testing::MigratedSqlite {
 protected:
  void SetUp() override {
    MigratedSqlite::SetUp();
    endpoint_.respond([](const testing::ReceivedRequest&, httplib::Response& res) {
      res.status = 400;
      res.set_content("insufficient funds", "text/plain");
    });
    auto conn = pool->acquire();
    const auto now = std::chrono::system_clock::now();
    // Three DEAD events in two failure groups (as an earlier relay left them).
    for (int i = 1; i <= 3; ++i) {
      const bool order = i < 3;
      auto e = EventEnvelope::builder(EventType::of(order ? "OrderPlaced" : "Shipped"))
                   .event_id("dead-" + std::to_string(i))
                   .aggregate_type(AggregateType::of("Order"))
                   .aggregate_id("ord-1000" + std::to_string(i))
                   .payload_json("{\"order\":" + std::to_string(i) + "}")
                   .build();
      store->insert_new(*conn, e);
      store->mark_dead(*conn, e.event_id(), now,
                       order ? "HTTP 422: order ord-1000" + std::to_string(i) + " refused"
                             : "HTTP 400: no carrier");
    }
    // Pending for two hours, due tomorrow: the oldest pending age, past the alert.
    store->insert_new(*conn, EventEnvelope::builder(EventType::of("Reminder"))
                                 .event_id("late-1")
                                 .occurred_at(now - 2h)
                                 .deliver_after(26h)
                                 .payload_json("{}")
                                 .build());
    // A payment whose endpoint refuses it for good: its message group blocks.
    store->insert_new(*conn, EventEnvelope::builder(EventType::of("PaymentTaken"))
                                 .event_id("pay-1")
                                 .aggregate_type(AggregateType::of("Account"))
                                 .aggregate_id("acct-7")
                                 .message_group("acct-7")
                                 .payload_json("{\"amount\":12}")
                                 .build());
  }

  std::string config(const std::string& token) const {
    return "[database]\nurl = \"" + url + "\"\n[poller]\ninterval = \"100ms\"\n" +
           "[admin]\nport = 0\nalert_oldest_pending = \"30m\"\n" +
           (token.empty() ? "" : "token = \"" + token + "\"\n") +
           "[publishers.dev]\ntype = \"log\"\npath = \"" + dir.file("events.jsonl") +
           "\"\n[publishers.payments]\ntype = \"http\"\n" +
           "[[routes]]\nevent_type = \"Payment*\"\npublisher = \"payments\"\ntarget = \"" +
           endpoint_.url("/pay") + "\"\n[[routes]]\npublisher = \"dev\"\n" +
           "[[subscriptions]]\nname = \"audit\"\npublisher = \"dev\"\n";
  }

  static std::string artifact(const std::string& name) {
    std::filesystem::create_directories(OUTBOX_ARTIFACTS_DIR);
    return std::string(OUTBOX_ARTIFACTS_DIR) + "/" + name;
  }

  testing::HttpTestServer endpoint_;
};

TEST_F(Dashboard, ShowsTheSeededStateAndReplaysAGroupClickedThroughThePage) {
  RelayProcess relay(dir, config("dash-secret"));
  const auto base = "http://127.0.0.1:" + std::to_string(relay.admin_port());
  HeadlessChromium browser(dir);
  browser.open(base + "/");

  // Without the token the page shows nothing of the relay and asks for it.
  ASSERT_TRUE(browser.wait_for(
      "getComputedStyle(document.getElementById('token-form')).display == 'flex'"));
  EXPECT_EQ(browser.evaluate("document.getElementById('dead').textContent"), "–");
  // The API refuses reads and actions without it, and with a wrong one, from the page's origin.
  const auto fp = fingerprint_failure("OrderPlaced", "HTTP 422: order ord-10001 refused").id;
  EXPECT_EQ(browser.evaluate("fetch('/api/dead/groups/" + fp +
                             "/replay', {method: 'POST'}).then(r => r.status)"),
            401);
  EXPECT_EQ(browser.evaluate("fetch('/api/dead/groups/" + fp +
                             "/replay', {method: 'POST', headers: {Authorization: 'Bearer nope'}})"
                             ".then(r => r.status)"),
            401);
  EXPECT_EQ(browser.evaluate("fetch('/api/status').then(r => r.status)"), 401);

  // The token typed into the page's own form.
  browser.evaluate(
      "document.getElementById('token-input').value = 'dash-secret';"
      "document.querySelector('#token-form button').click(); true");
  ASSERT_TRUE(browser.wait_for("document.getElementById('dead').textContent == '3'"));
  ASSERT_TRUE(browser.wait_for("document.querySelector('tr[data-group=\"acct-7\"]')"));
  ASSERT_TRUE(browser.wait_for("document.querySelector('tr[data-subscription=\"audit\"]')"));
  ASSERT_TRUE(browser.wait_for("document.getElementById('rate').textContent != '–'"));
  const auto dom = browser.evaluate("document.documentElement.outerHTML").get<std::string>();
  std::ofstream(artifact("dashboard.html")) << dom;
  EXPECT_EQ(browser.evaluate("document.getElementById('oldest-pending').textContent"), "2h 0m");
  EXPECT_EQ(browser.evaluate("document.getElementById('oldest-card').classList.contains('alert')"),
            true);
  EXPECT_EQ(browser.evaluate("document.getElementById('pending').textContent"), "2");
  EXPECT_EQ(browser.evaluate("document.querySelector('tr[data-fingerprint=\"" + fp +
                             "\"] td').textContent"),
            "2");
  EXPECT_NE(dom.find("HTTP 422: order &lt;id&gt; refused"), std::string::npos);
  EXPECT_NE(dom.find("HTTP 400: no carrier"), std::string::npos);
  EXPECT_NE(dom.find("insufficient funds"), std::string::npos);  // the blocked head's error
  EXPECT_NE(dom.find("message-group partitions ×64"), std::string::npos);
  browser.screenshot(artifact("dashboard.png"));

  // A replay clicked on the page (its confirmation accepted) reaches the database: both events
  // of the group are delivered to the log publisher and DONE.
  browser.evaluate("window.confirm = () => true; document.querySelector('tr[data-fingerprint=\"" +
                   fp + "\"] button[data-action=\"replay\"]').click(); true");
  ASSERT_TRUE(testing::wait_until([&] {
    auto conn = pool->acquire();
    return store->find(*conn, "dead-1")->status == EventStatus::Done &&
           store->find(*conn, "dead-2")->status == EventStatus::Done;
  }));
  EXPECT_EQ(store->find(*pool->acquire(), "dead-3")->status, EventStatus::Dead);
  ASSERT_TRUE(browser.wait_for("document.getElementById('dead').textContent == '1'"));
  browser.screenshot(artifact("dashboard-after-replay.png"));
  EXPECT_EQ(relay.terminate(), 0);
}

// Without admin.token reads are open and every action is refused, on the page too.
TEST_F(Dashboard, WithoutATokenItShowsEverythingAndActionsAreRefused) {
  RelayProcess relay(dir, config(""));
  HeadlessChromium browser(dir);
  browser.open("http://127.0.0.1:" + std::to_string(relay.admin_port()) + "/");
  ASSERT_TRUE(browser.wait_for("document.getElementById('dead').textContent == '3'"));
  browser.evaluate(
      "window.confirm = () => true; "
      "document.querySelector('button[data-action=\"discard\"]').click(); true");
  ASSERT_TRUE(browser.wait_for(
      "document.getElementById('banner').textContent.includes('set admin.token')"));
  EXPECT_EQ(store->count_dead(*pool->acquire(), std::nullopt), 3);
  // The page's own headers: no framing (clickjacking), no outside scripts.
  const auto headers = browser.evaluate(
      "fetch('/').then(r => r.headers.get('content-security-policy') + ' | ' + "
      "r.headers.get('x-frame-options'))");
  EXPECT_NE(headers.get<std::string>().find("frame-ancestors 'none'"), std::string::npos);
  EXPECT_NE(headers.get<std::string>().find("DENY"), std::string::npos);
  EXPECT_EQ(relay.terminate(), 0);
}

}  // namespace
}  // namespace outbox
