// Scenario files: matrix expansion, canonical names and selection, TOML errors with file:line:key,
// JUnit XML validity (parsed by Python's XML parser), and the golden metrics comparison.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <unistd.h>
#include <cmath>

#include "harness/matrix.h"
#include "harness/metrics.h"
#include "harness/scenario.h"

namespace fs = std::filesystem;

namespace {

fs::path temp_file(const std::string& name, const std::string& body) {
  auto dir = fs::temp_directory_path() / ("rh_scenario_test_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  auto p = dir / name;
  std::ofstream(p) << body;
  return p;
}

const rh::Scenario& by_name(const std::vector<rh::Scenario>& v, const std::string& n) {
  for (const auto& s : v)
    if (s.name == n) return s;
  throw std::runtime_error("no scenario " + n);
}

TEST(Scenarios, CiMatrixExpandsWithCanonicalNamesExcludesAndExpectations) {
  auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml");
  // states: 2 x 2 x 3 minus the excluded fp32+remainders row (3) = 9; scaled 6; faults 7; 2 named.
  EXPECT_EQ(all.size(), 9u + 6u + 7u + 2u + 4u + 2u + 1u + 6u);   // + dp (2 sizes x 2 moments), reshard (2), dp fault, dead-expert (2 guards x 3 policies)
  const auto& s = by_name(all, "states/moments=bf16,master=remainders,policy=per_key");
  EXPECT_EQ(s.policy.kind, rh::ckpt::SavePolicyKind::per_key);
  EXPECT_EQ(s.cfg.optim.exp_avg_dtype, rh::optim::Dtype::bf16);
  EXPECT_TRUE(s.cfg.optim.store_param_remainders);
  EXPECT_EQ(s.expect.kind, rh::Expectation::Kind::exact);
  EXPECT_THROW(by_name(all, "states/moments=fp32,master=remainders,policy=native"), std::runtime_error);
  const auto& lossy = by_name(all, "scaled/moments=fp8,policy=per_key");
  EXPECT_EQ(lossy.expect.kind, rh::Expectation::Kind::diverge);
  EXPECT_TRUE(lossy.allow_lossy);
  EXPECT_FALSE(lossy.expect.reason.empty());
  const auto& fault = by_name(all, "faults/fault=lossy_dtype_override");
  EXPECT_EQ(fault.fault, rh::Fault::lossy_dtype_override);
  EXPECT_EQ(fault.policy.overrides.at("exp_avg_sq"), rh::optim::Dtype::bf16);
  EXPECT_EQ(fault.cfg.optim.exp_avg_dtype, rh::optim::Dtype::fp32);
  EXPECT_EQ(by_name(all, "seed-protocol").save_at, 10);
  EXPECT_EQ(by_name(all, "seed-protocol").cfg.train.iterations, 20);
}

TEST(Scenarios, DefaultMatrixCoversEveryFaultAndPolicy) {
  auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/default.toml");
  std::set<std::string> faults, policies;
  for (const auto& s : all) {
    faults.insert(rh::to_string(s.fault));
    policies.insert(rh::ckpt::to_string(s.policy.kind));
  }
  EXPECT_EQ(faults.size(), rh::fault_names().size());
  EXPECT_EQ(policies.size(), 3u);
  EXPECT_EQ(rh::select_scenarios(all, "states/").size(), 24u);
}

TEST(Scenarios, SelectionByNameSubstringAndGlob) {
  auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml");
  EXPECT_EQ(rh::select_scenarios(all, "seed-protocol").size(), 1u);
  EXPECT_EQ(rh::select_scenarios(all, "faults/").size(), 7u);
  EXPECT_EQ(rh::select_scenarios(all, "states/*policy=per_key").size(), 3u);
  EXPECT_TRUE(rh::select_scenarios(all, "no-such").empty());
  EXPECT_EQ(rh::safe_name("states/a=b,c=d"), "states__a=b+c=d");
}

struct BadFile {
  const char* label;
  const char* body;
  const char* needle;   // must appear in the message, after "file:line"
  int line;
};

class ScenarioErrors : public ::testing::TestWithParam<BadFile> {};

TEST_P(ScenarioErrors, NameFileLineAndKey) {
  const auto& c = GetParam();
  auto p = temp_file(std::string(c.label) + ".toml", c.body);
  try {
    rh::load_scenarios(p.string());
    FAIL() << "accepted " << c.label;
  } catch (const rh::ScenarioError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(p.string() + ":" + std::to_string(c.line)), std::string::npos) << msg;
    EXPECT_NE(msg.find(c.needle), std::string::npos) << msg;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Cases, ScenarioErrors,
    ::testing::Values(
        BadFile{"syntax", "[[scenario]]\nname = \"a\"\nsave_at = = 3\n", "", 3},
        BadFile{"unknown_key", "[[scenario]]\nname = \"a\"\nsave_at = 3\nsav_policy = \"native\"\n", "sav_policy", 4},
        BadFile{"bad_type", "[[scenario]]\nname = \"a\"\n\nsave_at = \"ten\"\n", "save_at", 4},
        BadFile{"bad_policy", "[[scenario]]\nname = \"a\"\nsave_policy = \"fp64\"\n", "save_policy", 3},
        BadFile{"bad_model_key", "[[scenario]]\nname = \"a\"\n[scenario.model]\nd_modle = 3\n", "model.d_modle", 4},
        BadFile{"bad_dtype", "[[scenario]]\nname = \"a\"\n[scenario.optimizer]\nexp_avg_dtype = \"fp64\"\n",
                "exp_avg_dtype", 4},
        BadFile{"no_reason", "[[scenario]]\nname = \"a\"\nexpect = \"diverge\"\n", "needs a reason", 1},
        BadFile{"save_at_range", "[[scenario]]\nname = \"a\"\nsave_at = 20\n", "save_at", 1},
        BadFile{"missing_preset",
                "[[matrix]]\nname = \"m\"\n[[matrix.axis]]\nname = \"x\"\nvalues = [\"a\"]\n[matrix.axis.presets]\nb = {}\n",
                "no preset", 3},
        BadFile{"bad_fault", "[[scenario]]\nname = \"a\"\nfault = \"skip_everything\"\n", "skip_everything", 3},
        BadFile{"megatron_rule",
                "[[scenario]]\nname = \"a\"\n[scenario.optimizer]\nuse_precision_aware_optimizer = false\nexp_avg_dtype = \"bf16\"\n",
                "precision", 1},
        BadFile{"dp_indivisible", "[[scenario]]\nname = \"a\"\ndp_size = 4\n", "do not divide the 2 micro-batches", 1},
        BadFile{"resume_dp_range", "[[scenario]]\nname = \"a\"\nresume_dp_size = -1\n", "resume_dp_size", 1},
        BadFile{"dp_type", "[[scenario]]\nname = \"a\"\ndp_size = \"two\"\n", "dp_size", 3}),
    [](const auto& info) { return std::string(info.param.label); });

TEST(Scenarios, DataParallelKeysAndResharding) {
  auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/default.toml");
  const auto& same = by_name(all, "dp/dp=4,moments=fp8,master=remainders");
  EXPECT_EQ(same.dp_size, 4);
  EXPECT_EQ(same.resume_dp(), 4);
  EXPECT_FALSE(same.resharded());
  EXPECT_EQ(same.expect.kind, rh::Expectation::Kind::exact);
  const auto& re = by_name(all, "reshard/sizes=2to4,moments=bf16");
  EXPECT_EQ(re.dp_size, 2);
  EXPECT_EQ(re.resume_dp(), 4);
  EXPECT_TRUE(re.resharded());
  EXPECT_EQ(re.expect.kind, rh::Expectation::Kind::tolerance);
  EXPECT_EQ(re.expect.tolerances.at("lm_loss").atol, 1e-3);
  std::set<std::pair<int64_t, int64_t>> sizes;
  for (const auto& s : all)
    if (s.resharded()) sizes.insert({s.dp_size, s.resume_dp()});
  EXPECT_EQ(sizes, (std::set<std::pair<int64_t, int64_t>>{{2, 1}, {1, 2}, {2, 4}, {4, 2}}));
}

TEST(Junit, IsValidXmlWithOneTestcasePerScenario) {
  std::vector<rh::CheckResult> rs(2);
  rs[0].name = "states/a=1";
  rs[0].passed = true;
  rs[0].verdict = "PASS: bit-exact resume";
  rs[1].name = "faults/x=<&>";
  rs[1].passed = false;
  rs[1].verdict = "FAIL: expected a difference \"quoted\" & <tagged>";
  auto path = fs::temp_directory_path() / ("rh_junit_" + std::to_string(::getpid()) + ".xml");
  rh::write_junit(path.string(), "ci", rs);
  const std::string py =
      "import sys, xml.etree.ElementTree as E\n"
      "r = E.parse(sys.argv[1]).getroot()\n"
      "cases = r.findall('.//testcase')\n"
      "assert len(cases) == 2, len(cases)\n"
      "f = cases[1].find('failure')\n"
      "assert f is not None and f.get('message').startswith('FAIL: expected a difference \"quoted\" & <tagged>')\n"
      "assert cases[0].find('failure') is None\n"
      "assert r.find('testsuite').get('failures') == '1'\n";
  auto script = temp_file("junit_check.py", py);
  const std::string cmd = "/usr/bin/python3 " + script.string() + " " + path.string();
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
}

TEST(Golden, ComparisonNamesIterationAndMetric) {
  std::vector<rh::IterMetrics> rows(3);
  for (int i = 0; i < 3; ++i) {
    rows[i].iteration = i + 1;
    rows[i].lm_loss = 5.0f - static_cast<float>(i);
    rows[i].lr = 1e-3;
  }
  auto a = temp_file("golden_a.csv", ""), b = temp_file("golden_b.csv", "");
  rh::write_metrics_csv(a.string(), rows);
  rh::write_metrics_csv(b.string(), rows);
  EXPECT_EQ(rh::compare_golden(a.string(), b.string()), "");
  rows[1].lm_loss = std::nextafter(rows[1].lm_loss, 0.0f);
  rh::write_metrics_csv(b.string(), rows);
  const auto diff = rh::compare_golden(a.string(), b.string());
  EXPECT_NE(diff.find("iteration 2: lm_loss"), std::string::npos) << diff;
  rows.pop_back();
  rh::write_metrics_csv(b.string(), rows);
  EXPECT_NE(rh::compare_golden(a.string(), b.string()).find("rows"), std::string::npos);
}

}  // namespace
