// The conformance corpus (tests/conformance, issue 32) against the tool's reader: every case gets
// the verdict the corpus names from inspect_checkpoint (what `resume-harness inspect` runs: every
// check load makes without a model), the exit code and a message holding the expected substring and
// naming the case's directory. tests/test_rhckpt_conformance.py holds python/rhckpt to the same
// table, so the two readers cannot drift apart. One test per case, named by the case (a failing
// line is its reproduction: make_corpus.py OUT CASE; resume-harness inspect OUT/CASE).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <sstream>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"

namespace fs = std::filesystem;

namespace {

const std::string kGenerator = std::string(RH_TESTS_DIR) + "/conformance/make_corpus.py";

struct Case {
  std::string name, rule, reason;
  int code = 0;
};

std::string run(const std::string& cmd) {
  std::string out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char buf[4096];
  for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
  if (::pclose(p) != 0) out = "FAILED: " + cmd + "\n" + out;
  return out;
}

// The corpus's table (make_corpus.py --list): name, exit code, rule, reason, tab-separated.
std::vector<Case> cases() {
  std::vector<Case> out;
  std::istringstream in(run("/usr/bin/python3 " + kGenerator + " --list"));
  for (std::string line; std::getline(in, line);) {
    Case c;
    std::istringstream f(line);
    std::string code;
    if (!std::getline(f, c.name, '\t') || !std::getline(f, code, '\t') || !std::getline(f, c.rule, '\t')) continue;
    std::getline(f, c.reason);
    c.code = std::stoi(code);
    out.push_back(c);
  }
  return out;
}

class Conformance : public ::testing::TestWithParam<Case> {};

TEST_P(Conformance, ToolReaderGivesTheCorpusVerdict) {
  const Case& c = GetParam();
  const fs::path out = fs::temp_directory_path() / ("rh_conf_" + std::to_string(::getpid()) + "_" + c.name);
  fs::remove_all(out);
  const std::string gen = run("/usr/bin/python3 " + kGenerator + " " + out.string() + " " + c.name + " 2>&1");
  ASSERT_EQ(gen.rfind("FAILED", 0), std::string::npos) << gen;
  std::ostringstream msg;
  const int code = rh::ckpt::inspect_checkpoint((out / c.name).string(), msg);
  fs::remove_all(out);
  EXPECT_EQ(code, c.code) << c.name << " (" << c.rule << "): " << msg.str();
  EXPECT_NE(msg.str().find(c.reason), std::string::npos) << c.name << ": expected '" << c.reason << "' in: " << msg.str();
  if (c.code != 0) {
    EXPECT_NE(msg.str().find((out / c.name).string()), std::string::npos) << "names no file: " << msg.str();
  }
}

// The corpus is all of issue 32's reader-disagreement inputs and more: a smaller table means a
// generator that failed to list its cases.
TEST(ConformanceTable, HasEveryCase) {
  const auto all = cases();
  EXPECT_GE(all.size(), 60u);
  int accepted = 0;
  for (const auto& c : all) accepted += c.code == 0;
  EXPECT_EQ(accepted, 3);
}

INSTANTIATE_TEST_SUITE_P(Corpus, Conformance, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}  // namespace
