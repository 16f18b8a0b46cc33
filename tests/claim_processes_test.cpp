// Two operating-system processes claiming from one SQLite file never claim the same row.

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include "outbox/sqlite/driver.hpp"
#include "outbox/sqlite/store.hpp"
#include "tests/support/test_support.hpp"

namespace outbox {
namespace {

using namespace std::chrono_literals;

// Child body: claim batches (and mark them done, as a relay would) until nothing is left to
// claim; write every claimed id to `out`. Returns the exit status.
int claim_until_empty(const std::string& db, const std::string& owner, const std::string& out,
                      int start_fd) {
  try {
    auto conn = sqlite::open(db);
    sqlite::SqliteOutboxStore store;
    std::ofstream file(out);
    char go;
    if (read(start_fd, &go, 1) != 1) {
      return 3;
    }
    for (;;) {
      const auto now = std::chrono::system_clock::now();
      auto rows = store.claim_pending(*conn, owner, now, 1h, 0us, 5);
      if (rows.empty()) {
        break;
      }
      std::vector<std::string> ids;
      for (const auto& r : rows) {
        if (r.locked_by != owner) {
          return 4;
        }
        file << r.event_id << '\n';
        ids.push_back(r.event_id);
      }
      store.mark_done_batch(*conn, ids, now);
    }
    return file.good() ? 0 : 5;
  } catch (const std::exception&) {
    return 2;
  }
}

TEST(ClaimAcrossProcesses, NoRowIsClaimedTwice) {
  testing::TempDir dir;
  const auto db = dir.file("shared.db");
  constexpr int kRows = 20000;
  {
    auto conn = sqlite::open(db);
    sqlite::create_schema(*conn);
    sqlite::SqliteOutboxStore store;
    std::vector<EventEnvelope> events;
    for (int i = 0; i < kRows; ++i) {
      events.push_back(EventEnvelope::of_json(EventType::of("E"), "{}"));
    }
    conn->begin();
    store.insert_batch(*conn, events);
    conn->commit();
  }
  int start[2];
  ASSERT_EQ(pipe(start), 0);
  std::vector<pid_t> children;
  for (int c = 0; c < 2; ++c) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(start[1]);
      _exit(claim_until_empty(db, "proc-" + std::to_string(c),
                              dir.file("claimed-" + std::to_string(c)), start[0]));
    }
    children.push_back(pid);
  }
  close(start[0]);
  // Release both children at once so their claims interleave.
  ASSERT_EQ(write(start[1], "gg", 2), 2);
  close(start[1]);
  for (pid_t pid : children) {
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    EXPECT_EQ(WEXITSTATUS(status), 0);
  }
  std::set<std::string> all;
  std::size_t total = 0;
  std::vector<std::size_t> per_process;
  for (int c = 0; c < 2; ++c) {
    std::ifstream in(dir.file("claimed-" + std::to_string(c)));
    std::string id;
    std::size_t n = 0;
    while (std::getline(in, id)) {
      all.insert(id);
      ++n;
    }
    per_process.push_back(n);
    total += n;
  }
  EXPECT_EQ(total, static_cast<std::size_t>(kRows));
  EXPECT_EQ(all.size(), static_cast<std::size_t>(kRows)) << "a row was claimed twice";
  std::cout << "claims per process: " << per_process[0] << " / " << per_process[1] << '\n';
}

}  // namespace
}  // namespace outbox
