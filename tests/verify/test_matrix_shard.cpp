// matrix --shard I/N and report --merge (harness/verify/shard.h, merge.h): the split keeps
// baseline groups together and balances them, and the merged run directory of the shards is what
// one unsharded run writes (every summary field but the seconds, every cell's compare files),
// through the real tool. Refusals: missing, duplicated or foreign shards exit 2.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "harness/process/process.h"
#include "harness/verify/baseline.h"
#include "harness/verify/scenario.h"
#include "harness/verify/shard.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

// Three baseline groups of different sizes (one of three cells, one of two, one of one) and a
// cell that fails (a fault declared exact).
const char* kShardTinyToml = R"(
[defaults]
save_at = 3
[defaults.model]
vocab_size = 32
seq_len = 16
d_model = 32
n_layers = 1
n_heads = 2
ffn_hidden = 32
[defaults.train]
iterations = 6
global_batch = 4
micro_batch = 2
lr_decay_iters = 6

[[scenario]]
name = "a"
[[scenario]]
name = "a-fp32"
save_policy = "fp32"
[[scenario]]
name = "a-fault"
fault = "reset_lr_schedule"
[[scenario]]
name = "b"
model = { d_model = 16, ffn_hidden = 16 }
[[scenario]]
name = "b-per-key"
model = { d_model = 16, ffn_hidden = 16 }
save_policy = "per_key"
[[scenario]]
name = "c"
train = { iterations = 8, lr_decay_iters = 8 }
)";

using rh::testutil::slurp;
using rh::testutil::ToolRun;

class Shards : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("rh_shard_" + std::to_string(::getpid()));
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    std::ofstream(dir_ / "m.toml") << kShardTinyToml;
  }
  static void TearDownTestSuite() { fs::remove_all(dir_); }

  static ToolRun tool(const std::vector<std::string>& args) { return rh::testutil::run_tool(dir_, args); }
  static ToolRun matrix(const std::string& run, const std::string& shard = "", const std::string& file = "m.toml") {
    std::vector<std::string> a{"matrix", (dir_ / file).string(), "-j", "2", "--run-dir", (dir_ / run).string()};
    if (!shard.empty()) a.insert(a.end(), {"--shard", shard});
    else a.push_back("--no-report");
    return tool(a);
  }
  static fs::path dir_;
};
fs::path Shards::dir_;


// summary.json without what may differ between runs: seconds, the run's job count.
nlohmann::json without_seconds(nlohmann::json j) {
  j.erase("seconds");
  j["environment"].erase("jobs");
  for (auto& e : j["scenarios"]) e.erase("seconds"), e.erase("trainer_seconds");
  return j;
}

// summary.csv without its seconds column (index 21), or junit.xml without time="..." values.
std::string csv_without_seconds(const std::string& csv) {
  std::istringstream in(csv);
  std::string line, out;
  while (std::getline(in, line)) {
    std::vector<std::string> f;
    std::string cur;
    bool quoted = false;
    for (char c : line) {   // the tiny matrix's verdicts hold no line breaks
      if (c == '"') quoted = !quoted;
      if (c == ',' && !quoted) f.push_back(cur), cur.clear();
      else cur += c;
    }
    f.push_back(cur);
    if (f.size() > 21) f.erase(f.begin() + 21);
    for (const auto& x : f) out += x + ",";
    out += "\n";
  }
  return out;
}
std::string junit_without_times(std::string x) {
  size_t p = 0;
  while ((p = x.find("time=\"", p)) != std::string::npos) {
    const size_t q = x.find('"', p + 6);
    x.erase(p + 6, q - p - 6);
    p += 7;
  }
  return x;
}

TEST(ShardPlan, KeepsBaselineGroupsTogetherAndAssignsEveryCellOnce) {
  const fs::path d = fs::temp_directory_path() / ("rh_shard_plan_" + std::to_string(::getpid()));
  fs::create_directories(d);
  std::ofstream(d / "m.toml") << kShardTinyToml;
  const auto sel = rh::load_scenarios((d / "m.toml").string());
  fs::remove_all(d);
  const auto plan = rh::plan_checks(sel, "baselines");
  for (int n = 1; n <= 7; ++n) {
    const auto sp = rh::plan_shards(sel, n);
    ASSERT_EQ(sp.shard_of.size(), sel.size());
    for (int s : sp.shard_of) EXPECT_TRUE(s >= 1 && s <= n) << s;
    // Slow, obvious check: every two cells with a common baseline are on one shard.
    for (const auto& x : plan.cells) {
      for (const auto& y : plan.cells) {
        if (x.baseline != y.baseline && x.baseline != y.reference && x.reference != y.baseline) continue;
        EXPECT_EQ(sp.shard_of[x.scenario], sp.shard_of[y.scenario])
            << sel[x.scenario].name << " / " << sel[y.scenario].name;
      }
    }
    EXPECT_EQ(rh::plan_shards(sel, n).shard_of, sp.shard_of) << "not deterministic";
  }
  // Three groups on two shards, costs by hand (iterations x ranks): a: baseline 6 + 3 x 3
  // resumed = 15; b: 6 + 2 x 3 = 12; c: 8 + 5 = 13. Largest first: a -> 1, c -> 2, b -> 2.
  const auto two = rh::plan_shards(sel, 2);
  EXPECT_EQ(two.cost, (std::vector<int64_t>{15, 25}));
  EXPECT_EQ(two.shard_of, (std::vector<int>{1, 1, 1, 2, 2, 2}));
}

TEST(ShardPlan, BadShardTextIsRefusedNamingTheFlag) {
  for (const char* bad : {"", "1", "0/2", "3/2", "1/0", "a/b", "1/2/3", "/2", "1/", "-1/2", "1/99999"})
    EXPECT_THROW(rh::parse_shard(bad), std::invalid_argument) << bad;
  const auto s = rh::parse_shard("2/4");
  EXPECT_EQ(s.index, 2);
  EXPECT_EQ(s.count, 4);
}

TEST_F(Shards, MergedShardsEqualAnUnshardedRun) {
  ASSERT_EQ(tool({"matrix", (dir_ / "m.toml").string(), "-j", "2", "--run-dir", (dir_ / "whole").string(),
                  "--no-report", "--junit", (dir_ / "whole-junit.xml").string()})
                .code,
            1);   // a-fault fails
  EXPECT_EQ(slurp(dir_ / "whole-junit.xml"), slurp(dir_ / "whole" / "junit.xml")) << "--junit PATH";
  for (int n : {2, 3}) {
    std::vector<std::string> merge{"report", "--merge", (dir_ / ("merged" + std::to_string(n))).string()};
    for (int i = n; i >= 1; --i) {   // shards given in any order
      const std::string run = "s" + std::to_string(n) + "_" + std::to_string(i);
      const ToolRun r = matrix(run, std::to_string(i) + "/" + std::to_string(n));
      EXPECT_TRUE(r.code == 0 || r.code == 1) << r.log;
      EXPECT_NE(r.log.find("shard " + std::to_string(i) + "/" + std::to_string(n)), std::string::npos) << r.log;
      EXPECT_FALSE(fs::exists(dir_ / run / "report.md")) << "a shard writes no report";
      merge.push_back((dir_ / run).string());
    }
    const ToolRun m = tool(merge);
    EXPECT_EQ(m.code, 1) << "a merged cell failed: " << m.log;
    const fs::path out = dir_ / ("merged" + std::to_string(n));
    const auto whole = nlohmann::json::parse(slurp(dir_ / "whole" / "summary.json"));
    const auto merged = nlohmann::json::parse(slurp(out / "summary.json"));
    EXPECT_EQ(without_seconds(merged), without_seconds(whole)) << n << " shards";
    EXPECT_EQ(csv_without_seconds(slurp(out / "summary.csv")),
              csv_without_seconds(slurp(dir_ / "whole" / "summary.csv")));
    EXPECT_EQ(junit_without_times(slurp(out / "junit.xml")), junit_without_times(slurp(dir_ / "whole" / "junit.xml")));
    for (const auto& e : whole.at("scenarios")) {
      const fs::path cell = e.at("dir").get<std::string>();
      for (const char* f : {"metrics_compare.csv", "state_compare.csv"})
        EXPECT_EQ(slurp(out / cell / f), slurp(dir_ / "whole" / cell / f)) << cell / f;
    }
    EXPECT_TRUE(fs::exists(out / "report.md")) << m.log;
  }
}

TEST_F(Shards, ShardsThatAreNotOneMatrixAreRefused) {
  ASSERT_NE(matrix("r1", "1/2").code, 2);
  std::ofstream(dir_ / "other.toml") << std::string(kShardTinyToml) + "\n# changed\n";
  ASSERT_NE(matrix("other2", "2/2", "other.toml").code, 2);
  const auto merge = [&](std::vector<std::string> shards) {
    std::vector<std::string> a{"report", "--merge", (dir_ / "bad").string()};
    for (const auto& s : shards) a.push_back((dir_ / s).string());
    return tool(a);
  };
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"r1"}, "shard(s) 2 of 2 are missing"},
      {{"r1", "r1"}, "is given twice"},
      {{"r1", "other2"}, "another scenario file"},
      {{"r1", "nonexistent"}, "cannot read summary.json"},
  };
  for (const auto& [shards, want] : cases) {
    const ToolRun r = merge(shards);
    EXPECT_EQ(r.code, 2) << r.log;
    EXPECT_NE(r.log.find(want), std::string::npos) << "want '" << want << "' in: " << r.log;
    EXPECT_EQ(std::count(r.log.begin(), r.log.end(), '\n'), 1) << r.log;
  }
  const ToolRun bad = tool({"matrix", (dir_ / "m.toml").string(), "--shard", "3/2"});
  EXPECT_EQ(bad.code, 2) << bad.log;
  EXPECT_NE(bad.log.find("--shard '3/2'"), std::string::npos) << bad.log;
}

// Shard directories tampered with after the run: each is refused with one line naming the shard's
// file and what was expected, exit 2. The shards are written here (two cells, one per shard): the
// merge reads only summary.json, summary.csv and the cells' directories.
struct Tamper {
  const char* name;
  std::function<void(nlohmann::json& json1, std::string& csv1, nlohmann::json& json2, std::string& csv2)> edit;
  const char* file;   // the file of shard 1 the error names
  const char* want;
};

class MergeTampered : public ::testing::TestWithParam<Tamper> {};

void write_shard(const fs::path& dir, const nlohmann::json& summary, const std::string& csv) {
  fs::create_directories(dir);
  std::ofstream(dir / "summary.json") << summary.dump(2);
  std::ofstream(dir / "summary.csv") << csv;
  for (const auto& e : summary.at("scenarios")) {
    std::string cell = e.at("name").get<std::string>();
    for (size_t p = 0; (p = cell.find('/', p)) != std::string::npos;) cell.replace(p, 1, "__");
    fs::create_directories(dir / "scenarios" / cell);
    std::ofstream(dir / "scenarios" / cell / "result.json") << "{}";
  }
}

nlohmann::json shard_summary(int index, const std::vector<std::string>& cells, const std::string& cell) {
  return {{"file", "m.toml"},
          {"file_xxh3", "00"},
          {"filter", ""},
          {"environment", {{"harness_version", "v"}, {"git_commit", "c"}}},
          {"shard", {{"index", index}, {"count", 2}, {"cells", cells}}},
          {"scenarios", nlohmann::json::array({nlohmann::json{{"name", cell},
                                                              {"expectation", "exact"},
                                                              {"passed", true},
                                                              {"outcome", "identical"},
                                                              {"verdict", "PASS: identical"},
                                                              {"first_divergence", ""}}})}};
}

const char* kCsvHeader = "scenario,expectation,passed,outcome,verdict,first_divergence\n";
std::string csv_row(const std::string& cell) { return cell + ",exact,1,identical,PASS: identical,\n"; }

TEST_P(MergeTampered, RefusedNamingTheFileAndWhatWasExpected) {
  const Tamper& t = GetParam();
  const fs::path dir = rh::testutil::fresh_dir("merge_tampered", t.name);
  const std::vector<std::string> cells{"g/plain", "h"};
  nlohmann::json json1 = shard_summary(1, cells, "g/plain"), json2 = shard_summary(2, cells, "h");
  std::string csv1 = kCsvHeader + csv_row("g/plain"), csv2 = kCsvHeader + csv_row("h");
  if (t.edit) t.edit(json1, csv1, json2, csv2);
  write_shard(dir / "s1", json1, csv1);
  write_shard(dir / "s2", json2, csv2);
  const ToolRun r = rh::testutil::run_tool(dir,
                                           {"report", "--merge", (dir / "out").string(), (dir / "s1").string(),
                                            (dir / "s2").string()},
                                           120);
  if (!t.edit) {   // the untampered pair merges (the report of such a bare run directory may still refuse it)
    EXPECT_NE(r.log.find("merged 2 shards: 2 passed, 0 failed"), std::string::npos) << r.log;
    EXPECT_EQ(slurp(dir / "out" / "summary.csv"), kCsvHeader + csv_row("g/plain") + csv_row("h"));
    fs::remove_all(dir);
    return;
  }
  EXPECT_EQ(r.code, 2) << r.log;
  EXPECT_NE(r.log.find((dir / "s1").string() + ": " + t.file), std::string::npos) << r.log;
  EXPECT_NE(r.log.find(t.want), std::string::npos) << "want '" << t.want << "' in: " << r.log;
  EXPECT_EQ(std::count(r.log.begin(), r.log.end(), '\n'), 1) << r.log;
  EXPECT_FALSE(fs::exists(dir / "out" / "summary.json")) << "refused, yet merged";
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, MergeTampered,
    ::testing::Values(Tamper{"untampered", nullptr, "", ""},
                      // 10^12 shards once grew the list of missing ones until the tool ran out of memory
                      Tamper{"count_huge",
                             [](auto& j1, auto&, auto& j2, auto&) {
                               j1["shard"]["count"] = 1000000000000ll;
                               j2["shard"]["count"] = 1000000000000ll;
                             },
                             "summary.json", "shard.count 1000000000000 is not in 1..1024"},
                      Tamper{"cell_twice",
                             [](auto& j1, auto&, auto& j2, auto&) {
                               for (auto* j : {&j1, &j2})
                                 (*j)["shard"]["cells"] = nlohmann::json::array({"g/plain", "h", "h"});
                             },
                             "summary.json", "shard.cells names cell 'h' twice; expected each cell once"},
                      Tamper{"names_equal_after_escaping",
                             [](auto& j1, auto&, auto& j2, auto& c2) {
                               for (auto* j : {&j1, &j2})
                                 (*j)["shard"]["cells"] = nlohmann::json::array({"g/plain", "g__plain"});
                               j2["scenarios"][0]["name"] = "g__plain";
                               c2 = kCsvHeader + csv_row("g__plain");
                             },
                             "summary.json", "'g/plain' and 'g__plain' both become the directory scenarios/g__plain"},
                      Tamper{"csv_contradicts_json",
                             [](auto&, auto& c1, auto&, auto&) {
                               c1 = std::string(kCsvHeader) + "g/plain,exact,0,identical,PASS: identical,\n";
                             },
                             "summary.csv", "row 'g/plain' has passed '0', but summary.json says '1'"},
                      Tamper{"csv_row_twice", [](auto&, auto& c1, auto&, auto&) { c1 += csv_row("g/plain"); },
                             "summary.csv", "a second row for cell 'g/plain'; expected one row per cell"}),
    [](const auto& info) { return std::string(info.param.name); });

}   // namespace
