// examples/rest_service.cpp as a user runs it: a separate process on an SQLite file, orders
// POSTed over HTTP from several threads. Each accepted order's event is published once; a refused
// order (bad body, or a CHECK the database enforces) leaves neither row nor event; SIGTERM stops
// it after the outbox drained.

#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>
#include <sstream>
#include <thread>

#include "outbox/detect/detect.hpp"
#include "tests/support/process.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using testing::wait_until;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(RestService, EachAcceptedOrderIsPublishedOnceAndARefusedOneLeavesNothing) {
  testing::TempDir dir;
  const auto db = dir.file("orders.db");
  const auto out = dir.file("service.out");
  const pid_t pid = testing::spawn(
      {"/bin/sh", "-c", "exec '" OUTBOX_REST_SERVICE_PATH "' '" + db + "' >'" + out + "' 2>&1"});
  std::smatch m;
  std::string text;
  static const std::regex kListening("listening on 127\\.0\\.0\\.1:([0-9]+)");
  ASSERT_TRUE(wait_until([&] {
    text = read_file(out);
    return std::regex_search(text, m, kListening);
  })) << text;
  const int port = std::stoi(m[1]);

  std::vector<std::jthread> clients;
  std::atomic<int> created{0};
  for (int c = 0; c < 4; ++c) {
    clients.emplace_back([&, c] {
      httplib::Client http("127.0.0.1", port);
      for (int n = 0; n < 5; ++n) {
        const auto res = http.Post(
            "/orders",
            nlohmann::json{{"customer", "c" + std::to_string(c)}, {"amount_cents", 100 + n}}.dump(),
            "application/json");
        created += res && res->status == 201 ? 1 : 0;
      }
    });
  }
  clients.clear();  // joined
  EXPECT_EQ(created.load(), 20);
  httplib::Client http("127.0.0.1", port);
  auto bad = http.Post("/orders", "{not json", "application/json");
  ASSERT_TRUE(bad);
  EXPECT_EQ(bad->status, 400);
  auto refused = http.Post("/orders", R"({"customer":"c","amount_cents":-5})", "application/json");
  ASSERT_TRUE(refused);
  EXPECT_EQ(refused->status, 422) << refused->body;
  auto one = http.Post("/orders", R"({"customer":"z","amount_cents":7})", "application/json");
  ASSERT_TRUE(one);
  ASSERT_EQ(one->status, 201);
  const auto order = nlohmann::json::parse(one->body)["order"].get<std::string>();
  auto got = http.Get("/orders/" + order);
  ASSERT_TRUE(got);
  EXPECT_EQ(nlohmann::json::parse(got->body)["amount_cents"], 7);

  ASSERT_TRUE(wait_until([&] {
    auto stats = http.Get("/stats");
    return stats && nlohmann::json::parse(stats->body)["published"] == 21;
  })) << read_file(out);
  auto pool = open_pool("sqlite://" + db, 1);
  auto conn = pool->acquire();
  EXPECT_EQ(conn->query("SELECT COUNT(*) FROM orders")[0].get_int(0), 21);
  auto store = detect_store(*conn);
  EXPECT_TRUE(wait_until([&] { return store->count_by_status(*conn)[1] == 21; }));
  EXPECT_EQ(store->count_by_status(*conn)[0] + store->count_by_status(*conn)[2], 0);

  kill(pid, SIGTERM);
  EXPECT_EQ(testing::wait_exit(pid, std::chrono::seconds(60)), 0);
  text = read_file(out);
  EXPECT_NE(text.find("stopped: 21 events published"), std::string::npos) << text;
  // Published once each: 21 lines, 21 distinct event ids.
  std::set<std::string> ids;
  static const std::regex kPublished("published ([0-9A-Z]+) ");
  for (auto it = std::sregex_iterator(text.begin(), text.end(), kPublished);
       it != std::sregex_iterator(); ++it) {
    EXPECT_TRUE(ids.insert((*it)[1]).second) << "published twice: " << (*it)[1];
  }
  EXPECT_EQ(ids.size(), 21U);
}

}  // namespace
}  // namespace outbox
