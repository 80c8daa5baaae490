// The conformance corpus (tests/conformance) against the tool's reader: every case gets
// the verdict the corpus names from inspect_checkpoint (what `resume-harness inspect` runs: every
// check load makes without a model), the exit code and a message holding the expected substring and
// naming the case's directory. tests/test_rhckpt_conformance.py holds python/rhckpt to the same
// table, so the two readers cannot drift apart. One test per case, named by the case (a failing
// line is its reproduction: make_corpus.py OUT CASE; resume-harness inspect OUT/CASE). CTest runs
// the executable as one test (tests/CMakeLists.txt): a process per case, each starting LibTorch
// (and ASan in the sanitizer step), took 345 s at -j2 there; one process takes about 20 s.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
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

// The whole corpus, generated once per process into a temporary directory (about 0.5 s) and
// removed at exit, with its table (expected.tsv: name, exit code, rule, reason, tab-separated).
struct Corpus {
  fs::path dir;
  std::vector<Case> cases;
  std::string error;   // the generator's failure, reported by every test
  bool owned = true;
  Corpus() {
    // RH_CONFORMANCE_CORPUS: another corpus of the same form, e.g. the inputs and rhckpt's verdicts
    // that tests/test_rhckpt_fuzz.py --export wrote (a differential run of the two readers).
    if (const char* other = std::getenv("RH_CONFORMANCE_CORPUS")) {
      dir = other;
      owned = false;
      read_table();
      return;
    }
    dir = fs::temp_directory_path() / ("rh_conformance_" + std::to_string(::getpid()));
    fs::remove_all(dir);
    const std::string cmd = "/usr/bin/python3 " + kGenerator + " " + dir.string() + " 2>&1";
    std::string out;
    FILE* p = ::popen(cmd.c_str(), "r");
    if (p) {
      char buf[4096];
      for (size_t n; (n = std::fread(buf, 1, sizeof buf, p)) > 0;) out.append(buf, n);
    }
    if (!p || ::pclose(p) != 0) {
      error = "FAILED: " + cmd + "\n" + out;
      return;
    }
    read_table();
  }
  void read_table() {
    std::ifstream in(dir / "expected.tsv");
    for (std::string line; std::getline(in, line);) {
      Case c;
      std::istringstream f(line);
      std::string code;
      if (!std::getline(f, c.name, '\t') || !std::getline(f, code, '\t') || !std::getline(f, c.rule, '\t')) continue;
      std::getline(f, c.reason);
      c.code = std::stoi(code);
      cases.push_back(c);
    }
  }
  ~Corpus() {
    std::error_code ec;
    if (owned) fs::remove_all(dir, ec);
  }
};

const Corpus& corpus() {
  static const Corpus c;
  return c;
}

std::vector<Case> cases() {
  const auto& c = corpus().cases;
  return c.empty() ? std::vector<Case>{Case{"generator_failed", "", "", 0}} : c;
}

class Conformance : public ::testing::TestWithParam<Case> {};

TEST_P(Conformance, ToolReaderGivesTheCorpusVerdict) {
  ASSERT_TRUE(corpus().error.empty()) << corpus().error;
  const Case& c = GetParam();
  const fs::path dir = corpus().dir / c.name;
  std::ostringstream msg;
  const int code = rh::ckpt::inspect_checkpoint(dir.string(), msg);
  EXPECT_EQ(code, c.code) << c.name << " (" << c.rule << "): " << msg.str();
  EXPECT_NE(msg.str().find(c.reason), std::string::npos)
      << c.name << ": expected '" << c.reason << "' in: " << msg.str();
  if (c.code != 0) {
    EXPECT_NE(msg.str().find(dir.string()), std::string::npos) << "names no file: " << msg.str();
  }
}

// The corpus is every reader-disagreement input found so far and more: a smaller table means a
// generator that failed to list its cases.
TEST(ConformanceTable, HasEveryCase) {
  if (std::getenv("RH_CONFORMANCE_CORPUS")) GTEST_SKIP() << "another corpus";
  ASSERT_TRUE(corpus().error.empty()) << corpus().error;
  const auto& all = corpus().cases;
  EXPECT_GE(all.size(), 60u);
  int accepted = 0;
  for (const auto& c : all) accepted += c.code == 0;
  EXPECT_EQ(accepted, 4);   // plain, zstd, a root's pointer, a CUDA generator state in rank_states
}

INSTANTIATE_TEST_SUITE_P(Corpus, Conformance, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<Case>& i) { return i.param.name; });

}   // namespace
