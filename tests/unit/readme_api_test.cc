#include <gtest/gtest.h>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>
#include <string>

namespace {

std::string readFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

std::string withoutComments(std::string text) {
  text = std::regex_replace(text, std::regex(R"(/\*[\s\S]*?\*/)"), "");
  return std::regex_replace(text, std::regex(R"(//[^\n]*)"), "");
}

std::set<std::string> matches(const std::string& text, const std::regex& pattern) {
  std::set<std::string> out;
  for (auto it = std::sregex_iterator(text.begin(), text.end(), pattern); it != std::sregex_iterator(); ++it)
    out.insert((*it)[1]);
  return out;
}

}  // namespace

// The README's "Entry points" must name exactly the functions eccl.h
// declares, so a new call cannot go unlisted and a removed one cannot stay.
TEST(Readme, EntryPointsAreExactlyTheHeaderDeclarations) {
  const std::string header = readFile(ECCL_SOURCE_DIR "/include/eccl.h");
  const std::string readme = readFile(ECCL_SOURCE_DIR "/README.md");
  ASSERT_FALSE(header.empty()) << "include/eccl.h is missing";
  const size_t begin = readme.find("### Entry points");
  ASSERT_NE(begin, std::string::npos) << "README.md has no \"### Entry points\" section";
  const size_t end = readme.find("\n#", begin + 1);
  const std::string section = readme.substr(begin, end == std::string::npos ? std::string::npos : end - begin);
  const std::set<std::string> declared = matches(withoutComments(header), std::regex(R"(\b(eccl[A-Z]\w*)\s*\()"));
  const std::set<std::string> listed = matches(section, std::regex(R"(`(eccl[A-Z]\w*)`)"));
  ASSERT_GT(declared.size(), 50u) << "the header's declarations were not found";
  for (const auto& name : declared) EXPECT_TRUE(listed.count(name)) << name << " is declared but not in the README";
  for (const auto& name : listed) EXPECT_TRUE(declared.count(name)) << name << " is in the README but not declared";
}
