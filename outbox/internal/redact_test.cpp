#include "outbox/internal/redact.hpp"

#include <gtest/gtest.h>

namespace outbox::internal {
namespace {

TEST(Redact, UrlsLoseTheirPasswordsAndNothingElse) {
  EXPECT_EQ(redact_url("mysql://app:s3cret@db:3306/shop"), "mysql://app:***@db:3306/shop");
  EXPECT_EQ(redact_url("postgresql://app:p%40ss@h/db?sslmode=require&password=two"),
            "postgresql://app:***@h/db?sslmode=require&password=***");
  EXPECT_EQ(redact_url("host=h user=app password='a b\\'c' dbname=x"),
            "host=h user=app password=*** dbname=x");
  EXPECT_EQ(redact_url("mysql://app@db/shop"), "mysql://app@db/shop");
  EXPECT_EQ(redact_url("sqlite:///var/lib/x.db"), "sqlite:///var/lib/x.db");
  EXPECT_EQ(redact_url("mysql://u:pw@with@at@h:1/d"), "mysql://u:***@h:1/d");
  // Found breaking the fix: an unencoded '/' in the password hid the '@'.
  EXPECT_EQ(redact_url("mysql://u:S3CRET/x@127.0.0.1:1/db"), "mysql://u:***@127.0.0.1:1/db");
  EXPECT_EQ(redact_url("mysql://root:Hunt?er2@127.0.0.1:bad/db"),
            "mysql://root:***@127.0.0.1:bad/db");
  EXPECT_EQ(redact_url("postgresql://u:Hunt#er2@[::1/db"), "postgresql://u:***@[::1/db");
  // Overlapping secrets: more is hidden, nothing is shown.
  const auto both = redact_url("postgresql://u:first@h/d?password=sec@ond");
  EXPECT_EQ(both.find("first"), std::string::npos) << both;
  EXPECT_EQ(both.find("sec"), std::string::npos) << both;
}

TEST(Redact, MessagesLoseEveryCopyOfThePassword) {
  const std::string url = "postgresql://app:hunter%402@[::1/db";
  EXPECT_EQ(redact_secrets("invalid URI \"" + url + "\"", url),
            "invalid URI \"postgresql://app:***@[::1/db\"");
  EXPECT_EQ(redact_secrets("password hunter@2 rejected; hunter%402", url),
            "password *** rejected; ***");
  EXPECT_EQ(redact_secrets("no secret here", "mysql://u@h/d"), "no secret here");
  // libpq splits such a URL at the '/' and quotes the first piece as a port.
  EXPECT_EQ(redact_secrets("invalid integer value \"S3CRET\" for connection option \"port\"",
                           "postgresql://u:S3CRET/pw@127.0.0.1:1/db"),
            "invalid integer value \"***\" for connection option \"port\"");
}

}  // namespace
}  // namespace outbox::internal
