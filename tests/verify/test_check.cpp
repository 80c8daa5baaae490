// End-to-end resume checks on a tiny config, through the real tool in child processes: an exact
// case, a tolerance case, every deliberate fault (which must be caught), and the negative case
// that proves the check can fail (a fault declared "exact" must FAIL).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "harness/train/job.h"
#include "harness/train/metrics.h"
#include "harness/verify/baseline.h"
#include "harness/verify/check.h"
#include "harness/verify/golden.h"
#include "harness/verify/matrix.h"
#include "tests/test_util.h"

namespace fs = std::filesystem;

namespace {

const char* kCheckTinyToml = R"(
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

# A lossy checkpoint loaded without allow_lossy: the resumed run refuses it (load_result.json).
[[scenario]]
name = "refused"
optimizer = { exp_avg_dtype = "fp32", exp_avg_sq_dtype = "fp32" }
save_overrides = { exp_avg_sq = "bf16" }
expect = "diverge"
reason = "a lossy load must be refused"

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
    std::ofstream(dir_ / "tiny.toml") << kCheckTinyToml;
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
    for (const char* f : {"result.json", "metrics_compare.csv", "state_compare.csv", "disk.csv", "baseline/metrics.csv",
                          "resumed/metrics.csv"})
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

// The resumed process says why it refused in load_result.json (no log is read): the check's
// load_error is that file's message, and the file names the kind of error.
TEST_F(Check, ARefusedLoadIsReadFromLoadResultJson) {
  auto r = run("refused");
  EXPECT_TRUE(r.passed) << r.verdict;
  EXPECT_EQ(r.outcome, rh::Outcome::load_refused);
  const auto lr = rh::read_load_result((dir_ / "refused" / "resumed" / rh::kLoadResultFile).string());
  EXPECT_FALSE(lr.loaded);
  EXPECT_EQ(lr.error_kind, "checkpoint");
  EXPECT_FALSE(lr.message.empty());
  EXPECT_EQ(r.load_error, lr.message);
  EXPECT_NE(lr.message.find("exp_avg_sq"), std::string::npos) << lr.message;
  // A load that succeeds says so, with the iteration it resumed from.
  auto ok = run("exact");
  const auto done = rh::read_load_result((dir_ / "exact" / "resumed" / rh::kLoadResultFile).string());
  EXPECT_TRUE(done.loaded);
  EXPECT_EQ(done.iteration, 3);
}

// The golden comparison is part of the verdict before anything is written: result.json, and the
// matrix's summary.json and summary.csv, say the same.
TEST_F(Check, AGoldenMismatchIsInResultJsonAndTheSummaries) {
  const fs::path golden = dir_ / "golden";
  fs::create_directories(golden);
  std::vector<rh::IterMetrics> rows(6);
  for (int i = 0; i < 6; ++i) rows[static_cast<size_t>(i)].iteration = i + 1;
  rh::write_metrics_csv((golden / "exact.csv").string(), rows);   // not what training gives
  rh::MatrixOptions mo;
  mo.file = (dir_ / "tiny.toml").string();
  mo.filter = "exact";
  mo.run_dir = (dir_ / "golden-run").string();
  mo.golden_dir = golden.string();
  mo.tool = RH_TOOL;
  std::ostringstream log;
  const auto m = rh::run_matrix(mo, log);
  ASSERT_EQ(m.results.size(), 1u);
  EXPECT_FALSE(m.results[0].passed);
  EXPECT_EQ(m.results[0].outcome, rh::Outcome::identical);   // the resume itself was exact
  EXPECT_NE(m.results[0].verdict.find("baseline differs from golden"), std::string::npos) << m.results[0].verdict;
  auto read_json = [](const fs::path& p) {
    std::ifstream f(p);
    return nlohmann::json::parse(f);
  };
  const auto result = read_json(dir_ / "golden-run" / "scenarios" / "exact" / "result.json");
  const auto summary = read_json(dir_ / "golden-run" / "summary.json");
  EXPECT_EQ(result["passed"], false);
  EXPECT_EQ(result["verdict"], m.results[0].verdict);
  EXPECT_EQ(summary["scenarios"][0]["passed"], false);
  EXPECT_EQ(summary["scenarios"][0]["verdict"], result["verdict"]);
  EXPECT_EQ(summary["failed"], 1);
  std::ifstream csv(dir_ / "golden-run" / "summary.csv");
  std::string header, row;
  std::getline(csv, header);
  std::getline(csv, row);
  EXPECT_EQ(row.rfind("exact,exact,0,identical,", 0), 0u) << row;
}

// Cells that differ only at load share one baseline in a matrix; their results are the same as
// each checked on its own with its own baseline.
TEST_F(Check, ASharedBaselineGivesTheSameResultsAsSeparateOnes) {
  rh::MatrixOptions mo;
  mo.file = (dir_ / "tiny.toml").string();
  mo.filter = "sched-faults/*";
  mo.run_dir = (dir_ / "shared-run").string();
  mo.tool = RH_TOOL;
  mo.jobs = 2;
  std::ostringstream log;
  const auto m = rh::run_matrix(mo, log);
  ASSERT_EQ(m.results.size(), 2u);
  EXPECT_NE(log.str().find("1 baselines for 2 scenarios"), std::string::npos) << log.str();
  for (const auto& shared : m.results) {
    const auto alone = run(shared.name);
    EXPECT_EQ(shared.passed, alone.passed) << shared.name;
    EXPECT_EQ(shared.outcome, alone.outcome) << shared.name;
    EXPECT_EQ(shared.first_divergence, alone.first_divergence) << shared.name;
    ASSERT_EQ(shared.metric_diffs.size(), alone.metric_diffs.size());
    for (size_t i = 0; i < shared.metric_diffs.size(); ++i) {
      EXPECT_EQ(std::memcmp(&shared.metric_diffs[i].resumed, &alone.metric_diffs[i].resumed, sizeof(double)), 0);
      EXPECT_EQ(std::memcmp(&shared.metric_diffs[i].baseline, &alone.metric_diffs[i].baseline, sizeof(double)), 0);
    }
    EXPECT_EQ(shared.checkpoint_bytes, alone.checkpoint_bytes);
  }
}

class CheckFault : public Check, public ::testing::WithParamInterface<std::string> {};

TEST_P(CheckFault, IsCaughtAndNamed) {
  auto r = run("faults/fault=" + GetParam());
  EXPECT_TRUE(r.passed) << r.verdict;
  EXPECT_EQ(r.outcome, rh::Outcome::diverged);
  EXPECT_FALSE(r.first_divergence.empty());
}

// Through the tool: `matrix` and `check` with a scenario named "..", "." or ""
// used to remove the run directory itself and report PASS. Now: exit 2 naming file and line, and
// nothing in the run directory is touched.
TEST(CheckCli, DotDotScenarioNameIsBadInputAndRemovesNothing) {
  const fs::path dir = fs::temp_directory_path() / ("rh_cli_dotdot_" + std::to_string(::getpid()));
  fs::create_directories(dir / "run" / "scenarios");
  std::ofstream(dir / "run" / "keep.txt") << "other results\n";
  for (const char* name : {"..", ".", ""}) {
    std::ofstream(dir / "bad.toml") << "[[scenario]]\nname = \"" << name << "\"\n";
    for (const std::vector<std::string>& sub :
         {std::vector<std::string>{"matrix", (dir / "bad.toml").string(), "--no-report"},
          std::vector<std::string>{"check", "--file", (dir / "bad.toml").string(), "a"}}) {
      std::vector<std::string> args = sub;
      args.insert(args.end(), {"--run-dir", (dir / "run").string()});
      const auto r = rh::testutil::run_logged(rh::testutil::tool_argv(args), dir / "out.txt");
      EXPECT_EQ(r.code, 2) << sub[0] << " " << name;
      EXPECT_NE(r.log.find((dir / "bad.toml").string() + ":2: scenario.name"), std::string::npos) << r.log;
      EXPECT_TRUE(fs::exists(dir / "run" / "keep.txt")) << sub[0] << " " << name;
    }
  }
  fs::remove_all(dir);
}

// The matrix's plan: the CI file's 55 cells train 23 baselines; cells differing only in save
// policy, compression or fault share one, and a resharded cell's reference is the baseline of its
// resumed size.
TEST(CheckPlan, CellsThatDifferOnlyAtSaveOrLoadShareABaseline) {
  const auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml");
  const auto plan = rh::plan_checks(all, "/nonexistent/baselines");
  ASSERT_EQ(plan.cells.size(), all.size());
  EXPECT_EQ(plan.baselines.size(), 23u);
  auto cell = [&](const std::string& name) {
    for (const auto& c : plan.cells)
      if (all[c.scenario].name == name) return c;
    throw std::runtime_error("no cell " + name);
  };
  const auto a = cell("states/moments=bf16,master=fp32,policy=native");
  const auto b = cell("states/moments=bf16,master=fp32,policy=per_key");
  EXPECT_EQ(a.baseline, b.baseline);
  EXPECT_NE(a.save, b.save);   // two checkpoints of one state
  const auto f1 = cell("faults/fault=skip_rng_restore");
  const auto f2 = cell("faults/fault=drop_remainders");
  EXPECT_EQ(f1.baseline, f2.baseline);
  EXPECT_EQ(f1.save, f2.save);   // the same checkpoint: faults act on load
  EXPECT_NE(cell("states/moments=bf16,master=remainders,policy=native").baseline, a.baseline);
  const auto r = cell("reshard/sizes=1to2");
  EXPECT_NE(r.reference, r.baseline);
  EXPECT_EQ(plan.baselines[r.reference].dp_size, 2);
  for (const auto& c : plan.cells) {
    const auto& s = all[c.scenario];
    const auto& base = plan.baselines[c.baseline];
    EXPECT_EQ(rh::to_json(base.cfg), rh::to_json(s.cfg)) << s.name;
    EXPECT_EQ(base.dp_size, s.dp_size) << s.name;
    EXPECT_EQ(base.save_at, s.save_at) << s.name;
  }
}

TEST(SavePlan, RoundTripsAndRefusesBadEntriesNamingThem) {
  const fs::path d = fs::temp_directory_path() / ("rh_save_plan_" + std::to_string(::getpid()));
  fs::create_directories(d);
  rh::SaveTarget a{(d / "a").string(), {}}, b{(d / "b").string(), {}};
  b.policy.kind = rh::ckpt::SavePolicyKind::per_key;
  b.policy.compress = rh::ckpt::Compression::zstd;
  b.policy.overrides["exp_avg_sq"] = rh::optim::Dtype::bf16;
  rh::write_save_plan((d / "plan.json").string(), {a, b});
  const auto back = rh::read_save_plan((d / "plan.json").string());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].root, b.root);
  EXPECT_EQ(back[1].policy.kind, rh::ckpt::SavePolicyKind::per_key);
  EXPECT_EQ(back[1].policy.compress, rh::ckpt::Compression::zstd);
  EXPECT_EQ(back[1].policy.overrides.at("exp_avg_sq"), rh::optim::Dtype::bf16);
  for (const auto& [text, want] :
       {std::pair{R"({"schema_version": 2, "saves": []})", "schema_version"},
        std::pair{R"({"schema_version": 1, "saves": [{"policy": "native"}]})", "field /saves/0/root: missing"},
        std::pair{R"({"schema_version": 1, "saves": [{"root": "x", "policy": "fp64"}]})", "field /saves/0"},
        std::pair{R"({"schema_version": "1", "saves": []})", "field /schema_version: expected an integer"},
        std::pair{R"({"schema_version": 1, "saves": [{"root": "a\u0000b"}]})", "field /saves/0/root: NUL byte"},
        std::pair{R"({"schema_version": 1, "schema_version": 1, "saves": []})", "duplicate key 'schema_version'"}}) {
    std::ofstream(d / "bad.json") << text;
    try {
      rh::read_save_plan((d / "bad.json").string());
      ADD_FAILURE() << "accepted " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find((d / "bad.json").string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  fs::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Faults, CheckFault,
                         ::testing::Values("skip_rng_restore", "skip_data_position_restore", "reset_step_counter",
                                           "skip_exp_avg_restore", "reset_lr_schedule", "drop_remainders"),
                         [](const auto& info) { return info.param; });

}   // namespace
