#pragma once
// A fresh outbox table with its stream, subscription and lease tables on one engine, for the
// stream-mode suites.

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "outbox/detect/detect.hpp"
#include "outbox/sql/lease_store.hpp"
#include "outbox/sql/pool.hpp"
#include "outbox/sql/stream_store.hpp"
#include "outbox/stream.hpp"
#include "tests/support/engines.hpp"
#include "tests/support/tables.hpp"
#include "tests/support/test_support.hpp"

namespace outbox::testing {

class StreamFixture : public ::testing::TestWithParam<Engine> {
 protected:
  void SetUp() override {
    const auto url = GetParam().url();
    OUTBOX_REQUIRE_SERVER(url, GetParam().name);
    url_ = GetParam().name == "sqlite" ? "sqlite://" + dir_.file("stream.db") : *url;
    table_ = unique_table("stream");
    pool_ = open_pool(url_, 8);
    auto conn = pool_->acquire();
    create_schema_for(*conn, table_);
    store_ = detect_store(*conn, table_);
    stream_ = detect_stream_store(*conn, table_);
    leases_ = detect_lease_store(*conn, table_);
  }
  void TearDown() override {
    if (pool_ && GetParam().name != "sqlite") {
      drop_outbox_tables(*pool_->acquire(), table_);
    }
  }
  bool engine_is(const char* name) const { return GetParam().name == name; }
  /// Numbers committed rows where the engine needs a sequencer.
  void sequence() {
    auto conn = pool_->acquire();
    while (stream_->sequence(*conn, 1000) > 0) {
    }
  }
  /// Everything readable after `from` (the sequencer run first), in pages of `page`. With
  /// `expected`, reads on (bounded) until that many came: on PostgreSQL an open transaction of
  /// another session (a test running beside this one) holds the readable end back meanwhile.
  std::vector<StreamEvent> read_all(StreamPosition& from, int page = 1000,
                                    std::size_t expected = 0) {
    std::vector<StreamEvent> out;
    wait_until([&] {
      sequence();
      auto conn = pool_->acquire();
      for (auto batch = stream_->read(*conn, from, page); !batch.empty();
           batch = stream_->read(*conn, from, page)) {
        from = batch.back().position;
        for (auto& e : batch) {
          out.push_back(std::move(e));
        }
      }
      return out.size() >= expected;
    });
    return out;
  }

  TempDir dir_;
  std::string url_;
  std::string table_;
  std::shared_ptr<sql::ConnectionPool> pool_;
  std::shared_ptr<OutboxStore> store_;
  std::shared_ptr<StreamStore> stream_;
  std::shared_ptr<LeaseStore> leases_;
};

}  // namespace outbox::testing
