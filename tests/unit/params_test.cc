#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include "common/params.h"

// docs/env.md must list exactly the variables of the registry, each with its
// default, so the documentation cannot drift from the code.
TEST(Params, DocsListExactlyTheRegistry) {
  std::ifstream f(ECCL_SOURCE_DIR "/docs/env.md");
  ASSERT_TRUE(f) << "docs/env.md is missing";
  std::stringstream ss;
  ss << f.rdbuf();
  std::string doc = ss.str();
  std::set<std::string> documented;
  std::regex row(R"(\| `(ECCL_[A-Z_]+)` \| (\w+) \| `([^`]*)` \|)");
  for (auto it = std::sregex_iterator(doc.begin(), doc.end(), row); it != std::sregex_iterator(); ++it) {
    documented.insert((*it)[1]);
    bool found = false;
    for (const auto& p : eccl::params::all()) {
      if ((*it)[1] != p.name) continue;
      found = true;
      EXPECT_EQ((*it)[2], p.type) << p.name;
      EXPECT_EQ((*it)[3], p.defaultValue) << p.name;
    }
    EXPECT_TRUE(found) << (*it)[1] << " is documented but not in the registry";
  }
  for (const auto& p : eccl::params::all()) EXPECT_TRUE(documented.count(p.name)) << p.name << " is not in docs/env.md";
}

TEST(Params, MalformedIntegerIsAClearError) {
  setenv("ECCL_TIMEOUT_MS", "12x", 1);
  try {
    eccl::params::timeoutMs();
    FAIL() << "no error";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("ECCL_TIMEOUT_MS"), std::string::npos);
  }
  unsetenv("ECCL_TIMEOUT_MS");
  EXPECT_EQ(eccl::params::timeoutMs(), 30000);
}
