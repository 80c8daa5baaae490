// End-to-end resume checks on a tiny config, through the real tool in child processes: an exact
// case, a tolerance case, every deliberate fault (which must be caught), and the negative case
// that proves the check can fail (a fault declared "exact" must FAIL).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "harness/verify/check.h"

namespace fs = std::filesystem;

namespace {

const char* kTiny = R"(
[defaults]
save_at = 3
[defaults.model]
vocab_size = 32
seq_len = 16
d_model = 32
n_layers = 1
n_heads = 2
ffn_hidden = 32
[defaults.optimizer]
use_precision_aware_optimizer = true
exp_avg_dtype = "bf16"
exp_avg_sq_dtype = "bf16"
[defaults.train]
iterations = 6
global_batch = 4
micro_batch = 2
lr_decay_iters = 6

[[scenario]]
name = "exact"

[[scenario]]
name = "exact-per-key-remainders"
save_policy = "per_key"
[scenario.optimizer]
store_param_remainders = true

[[scenario]]
name = "tolerance"
optimizer = { exp_avg_dtype = "fp32", exp_avg_sq_dtype = "fp32" }
save_overrides = { exp_avg_sq = "bf16" }
allow_lossy = true
expect = "tolerance"
reason = "bf16 second moments; loss within 5 %"
tolerance = { lm_loss = { rtol = 0.05 } }

[[scenario]]
name = "fault-declared-exact"
fault = "reset_lr_schedule"

[[matrix]]
name = "faults"
expect = "diverge"
reason = "deliberate fault"
optimizer = { store_param_remainders = true }
  [[matrix.axis]]
  name = "fault"
  key = "fault"
  values = ["skip_rng_restore", "skip_data_position_restore", "reset_step_counter",
            "skip_exp_avg_restore", "reset_lr_schedule", "drop_remainders"]

# The scheduler's faults need a schedule they can break: a weight decay rising 0 -> 0.1 (cosine)
# while optimizer.weight_decay is 0.1, and a cosine LR decay.
[[matrix]]
name = "sched-faults"
expect = "diverge"
reason = "deliberate fault"
train = { start_weight_decay = 0.0, end_weight_decay = 0.1, weight_decay_incr_style = "cosine" }
  [[matrix.axis]]
  name = "fault"
  key = "fault"
  values = ["reset_wd_schedule", "wrong_lr_decay_style"]

# Every decay style and weight-decay style resumes bit for bit.
[[matrix]]
name = "sched"
  [[matrix.axis]]
  name = "lr"
  values = ["constant", "linear", "inverse-square-root", "WSD"]
  [matrix.axis.presets]
  constant = { train = { lr_decay_style = "constant" } }
  linear = { train = { lr_decay_style = "linear", start_weight_decay = 0.0, end_weight_decay = 0.1, weight_decay_incr_style = "linear" } }
  inverse-square-root = { train = { lr_decay_style = "inverse-square-root", start_weight_decay = 0.0, end_weight_decay = 0.1, weight_decay_incr_style = "cosine" } }
  WSD = { train = { lr_decay_style = "WSD", lr_wsd_decay_iters = 3, lr_wsd_decay_style = "minus_sqrt" } }

# Aux-loss-free balancing: the routers' expert_bias resumes bit for bit; skipping it is caught.
[[matrix]]
name = "expert-bias"
model = { score_function = "sigmoid", enable_expert_bias = true, bias_update_rate = 1e-2 }
  [[matrix.axis]]
  name = "fault"
  values = ["none", "skip_expert_bias_restore"]
  [matrix.axis.presets]
  none = { expect = "exact" }
  skip_expert_bias_restore = { fault = "skip_expert_bias_restore", expect = "diverge", reason = "deliberate fault" }
)";

class Check : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = fs::temp_directory_path() / ("rh_check_test_" + std::to_string(::getpid()));
    fs::create_directories(dir_);
    std::ofstream(dir_ / "tiny.toml") << kTiny;
    all_ = new std::vector<rh::Scenario>(rh::load_scenarios((dir_ / "tiny.toml").string()));
  }
  static void TearDownTestSuite() {
    delete all_;
    fs::remove_all(dir_);
  }
  rh::CheckResult run(const std::string& name) {
    for (const auto& s : *all_)
      if (s.name == name) {
        rh::CheckOptions o;
        o.tool = RH_TOOL;
        o.work_dir = (dir_ / rh::safe_name(name)).string();
        o.timeout_s = 300;
        return rh::run_check(s, o);
      }
    throw std::runtime_error("no scenario " + name);
  }
  static fs::path dir_;
  static std::vector<rh::Scenario>* all_;
};
fs::path Check::dir_;
std::vector<rh::Scenario>* Check::all_ = nullptr;

TEST_F(Check, ExactResumeIsBitExactAndWritesItsFiles) {
  for (const char* name : {"exact", "exact-per-key-remainders"}) {
    auto r = run(name);
    EXPECT_TRUE(r.passed) << name << ": " << r.verdict;
    EXPECT_EQ(r.outcome, rh::Outcome::identical) << name;
    EXPECT_TRUE(r.first_divergence.empty()) << r.first_divergence;
    EXPECT_TRUE(r.control_fresh_differs);
    EXPECT_TRUE(r.control_k_differs);
    EXPECT_EQ(r.metric_diffs.size(), 3u * 6u);   // iterations 4..6 x 6 metrics
    EXPECT_GT(r.checkpoint_bytes, 0u);
    EXPECT_GT(r.bytes_per_param, 2.0);
    for (const auto& d : r.after_load) EXPECT_TRUE(d.identical()) << d.key;
    const fs::path out = dir_ / rh::safe_name(name);
    for (const char* f : {"result.json", "metrics_compare.csv", "state_compare.csv", "disk.csv",
                          "baseline/metrics.csv", "resumed/metrics.csv"})
      EXPECT_TRUE(fs::exists(out / f)) << f;
  }
}

TEST_F(Check, ToleranceCaseDiffersButStaysWithinItsDeclaredEnvelope) {
  auto r = run("tolerance");
  EXPECT_TRUE(r.passed) << r.verdict;
  EXPECT_EQ(r.outcome, rh::Outcome::within_tolerance) << r.verdict;
  EXPECT_FALSE(r.first_divergence.empty());
  EXPECT_LT(r.bit_equal_after_load.at("exp_avg_sq"), 1.0);
}

TEST_F(Check, AFaultDeclaredExactFails) {
  auto r = run("fault-declared-exact");
  EXPECT_FALSE(r.passed) << r.verdict;
  EXPECT_NE(r.first_divergence.find("opt_param_scheduler.num_steps"), std::string::npos) << r.first_divergence;
}

// The scheduler's faults are caught, and the first divergence names the key they broke.
TEST_F(Check, SchedulerFaultsAreCaughtNamingTheKey) {
  for (auto [fault, key] : {std::pair{"reset_wd_schedule", "state/opt_param_scheduler.start_wd"},
                            std::pair{"wrong_lr_decay_style", "state/opt_param_scheduler.lr_decay_style"}}) {
    auto r = run(std::string("sched-faults/fault=") + fault);
    EXPECT_TRUE(r.passed) << fault << ": " << r.verdict;
    EXPECT_EQ(r.outcome, rh::Outcome::diverged) << fault;
    EXPECT_NE(r.first_divergence.find(key), std::string::npos) << fault << ": " << r.first_divergence;
  }
}

TEST_F(Check, ExpertBiasResumesBitForBitAndASkippedRestoreIsNamed) {
  auto ok = run("expert-bias/fault=none");
  EXPECT_TRUE(ok.passed) << ok.verdict;
  EXPECT_EQ(ok.outcome, rh::Outcome::identical);
  auto r = run("expert-bias/fault=skip_expert_bias_restore");
  EXPECT_TRUE(r.passed) << r.verdict;
  EXPECT_EQ(r.outcome, rh::Outcome::diverged);
  EXPECT_NE(r.first_divergence.find("model/layers.0.moe.router.expert_bias"), std::string::npos) << r.first_divergence;
}

TEST_F(Check, EveryDecayStyleResumesBitForBit) {
  for (const char* name : {"sched/lr=constant", "sched/lr=linear", "sched/lr=inverse-square-root", "sched/lr=WSD"}) {
    auto r = run(name);
    EXPECT_TRUE(r.passed) << name << ": " << r.verdict;
    EXPECT_EQ(r.outcome, rh::Outcome::identical) << name;
  }
}

class CheckFault : public Check, public ::testing::WithParamInterface<std::string> {};

TEST_P(CheckFault, IsCaughtAndNamed) {
  auto r = run("faults/fault=" + GetParam());
  EXPECT_TRUE(r.passed) << r.verdict;
  EXPECT_EQ(r.outcome, rh::Outcome::diverged);
  EXPECT_FALSE(r.first_divergence.empty());
}

// Issue 17 item 1, through the tool: `matrix` and `check` with a scenario named "..", "." or ""
// used to remove the run directory itself and report PASS. Now: exit 2 naming file and line, and
// nothing in the run directory is touched.
TEST(CheckCli, DotDotScenarioNameIsBadInputAndRemovesNothing) {
  const fs::path dir = fs::temp_directory_path() / ("rh_cli_dotdot_" + std::to_string(::getpid()));
  fs::create_directories(dir / "run" / "scenarios");
  std::ofstream(dir / "run" / "keep.txt") << "other results\n";
  for (const char* name : {"..", ".", ""}) {
    std::ofstream(dir / "bad.toml") << "[[scenario]]\nname = \"" << name << "\"\n";
    for (const std::string& sub : {"matrix " + (dir / "bad.toml").string() + " --no-report",
                                  "check --file " + (dir / "bad.toml").string() + " a"}) {
      const std::string cmd = std::string(RH_TOOL) + " " + sub + " --run-dir " + (dir / "run").string() + " > " +
                              (dir / "out.txt").string() + " 2>&1";
      const int rc = std::system(cmd.c_str());
      ASSERT_TRUE(WIFEXITED(rc)) << cmd;
      EXPECT_EQ(WEXITSTATUS(rc), 2) << cmd;
      std::ifstream f(dir / "out.txt");
      const std::string out((std::istreambuf_iterator<char>(f)), {});
      EXPECT_NE(out.find((dir / "bad.toml").string() + ":2: scenario.name"), std::string::npos) << out;
      EXPECT_TRUE(fs::exists(dir / "run" / "keep.txt")) << cmd;
    }
  }
  fs::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Faults, CheckFault,
                         ::testing::Values("skip_rng_restore", "skip_data_position_restore",
                                           "reset_step_counter", "skip_exp_avg_restore",
                                           "reset_lr_schedule", "drop_remainders"),
                         [](const auto& info) { return info.param; });

}  // namespace
