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
    for (const auto& scenario : *all_)
      if (scenario.name == name) {
        rh::CheckOptions options;
        options.tool = RH_TOOL;
        options.work_dir = (dir_ / rh::safe_name(name)).string();
        options.timeout_s = 300;
        return rh::run_check(scenario, options);
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
    auto result = run(name);
    EXPECT_TRUE(result.passed) << name << ": " << result.verdict;
    EXPECT_EQ(result.outcome, rh::Outcome::identical) << name;
    EXPECT_TRUE(result.first_divergence.empty()) << result.first_divergence;
    EXPECT_TRUE(result.control_fresh_differs);
    EXPECT_TRUE(result.control_k_differs);
    EXPECT_EQ(result.metric_diffs.size(), 3u * 6u);   // iterations 4..6 x 6 metrics
    EXPECT_GT(result.checkpoint_bytes, 0u);
    EXPECT_GT(result.bytes_per_param, 2.0);
    for (const auto& d : result.after_load) EXPECT_TRUE(d.identical()) << d.key;
    const fs::path out = dir_ / rh::safe_name(name);
    for (const char* f : {"result.json", "metrics_compare.csv", "state_compare.csv", "disk.csv", "baseline/metrics.csv",
                          "resumed/metrics.csv"})
      EXPECT_TRUE(fs::exists(out / f)) << f;
  }
}

TEST_F(Check, ToleranceCaseDiffersButStaysWithinItsDeclaredEnvelope) {
  auto result = run("tolerance");
  EXPECT_TRUE(result.passed) << result.verdict;
  EXPECT_EQ(result.outcome, rh::Outcome::within_tolerance) << result.verdict;
  EXPECT_FALSE(result.first_divergence.empty());
  EXPECT_LT(result.bit_equal_after_load.at("exp_avg_sq"), 1.0);
}

TEST_F(Check, AFaultDeclaredExactFails) {
  auto result = run("fault-declared-exact");
  EXPECT_FALSE(result.passed) << result.verdict;
  EXPECT_NE(result.first_divergence.find("opt_param_scheduler.num_steps"), std::string::npos)
      << result.first_divergence;
}

// The scheduler's faults are caught, and the first divergence names the key they broke.
TEST_F(Check, SchedulerFaultsAreCaughtNamingTheKey) {
  for (auto [fault, key] : {std::pair{"reset_wd_schedule", "state/opt_param_scheduler.start_wd"},
                            std::pair{"wrong_lr_decay_style", "state/opt_param_scheduler.lr_decay_style"}}) {
    auto result = run(std::string("sched-faults/fault=") + fault);
    EXPECT_TRUE(result.passed) << fault << ": " << result.verdict;
    EXPECT_EQ(result.outcome, rh::Outcome::diverged) << fault;
    EXPECT_NE(result.first_divergence.find(key), std::string::npos) << fault << ": " << result.first_divergence;
  }
}

TEST_F(Check, ExpertBiasResumesBitForBitAndASkippedRestoreIsNamed) {
  auto ok = run("expert-bias/fault=none");
  EXPECT_TRUE(ok.passed) << ok.verdict;
  EXPECT_EQ(ok.outcome, rh::Outcome::identical);
  auto result = run("expert-bias/fault=skip_expert_bias_restore");
  EXPECT_TRUE(result.passed) << result.verdict;
  EXPECT_EQ(result.outcome, rh::Outcome::diverged);
  EXPECT_NE(result.first_divergence.find("model/layers.0.moe.router.expert_bias"), std::string::npos)
      << result.first_divergence;
}

TEST_F(Check, EveryDecayStyleResumesBitForBit) {
  for (const char* name : {"sched/lr=constant", "sched/lr=linear", "sched/lr=inverse-square-root", "sched/lr=WSD"}) {
    auto result = run(name);
    EXPECT_TRUE(result.passed) << name << ": " << result.verdict;
    EXPECT_EQ(result.outcome, rh::Outcome::identical) << name;
  }
}

// The resumed process says why it refused in load_result.json (no log is read): the check's
// load_error is that file's message, and the file names the kind of error.
TEST_F(Check, ARefusedLoadIsReadFromLoadResultJson) {
  auto result = run("refused");
  EXPECT_TRUE(result.passed) << result.verdict;
  EXPECT_EQ(result.outcome, rh::Outcome::load_refused);
  const auto load_result = rh::read_load_result((dir_ / "refused" / "resumed" / rh::kLoadResultFile).string());
  EXPECT_FALSE(load_result.loaded);
  EXPECT_EQ(load_result.error_kind, "checkpoint");
  EXPECT_FALSE(load_result.message.empty());
  EXPECT_EQ(result.load_error, load_result.message);
  EXPECT_NE(load_result.message.find("exp_avg_sq"), std::string::npos) << load_result.message;
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
  rh::MatrixOptions matrix_options;
  matrix_options.file = (dir_ / "tiny.toml").string();
  matrix_options.filter = "exact";
  matrix_options.run_dir = (dir_ / "golden-run").string();
  matrix_options.golden_dir = golden.string();
  matrix_options.tool = RH_TOOL;
  std::ostringstream log;
  const auto matrix_run = rh::run_matrix(matrix_options, log);
  ASSERT_EQ(matrix_run.results.size(), 1u);
  EXPECT_FALSE(matrix_run.results[0].passed);
  EXPECT_EQ(matrix_run.results[0].outcome, rh::Outcome::identical);   // the resume itself was exact
  EXPECT_NE(matrix_run.results[0].verdict.find("baseline differs from golden"), std::string::npos)
      << matrix_run.results[0].verdict;
  auto read_json = [](const fs::path& p) {
    std::ifstream f(p);
    return nlohmann::json::parse(f);
  };
  const auto result = read_json(dir_ / "golden-run" / "scenarios" / "exact" / "result.json");
  const auto summary = read_json(dir_ / "golden-run" / "summary.json");
  EXPECT_EQ(result["passed"], false);
  EXPECT_EQ(result["verdict"], matrix_run.results[0].verdict);
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
  rh::MatrixOptions matrix_options;
  matrix_options.file = (dir_ / "tiny.toml").string();
  matrix_options.filter = "sched-faults/*";
  matrix_options.run_dir = (dir_ / "shared-run").string();
  matrix_options.tool = RH_TOOL;
  matrix_options.jobs = 2;
  std::ostringstream log;
  const auto matrix_run = rh::run_matrix(matrix_options, log);
  ASSERT_EQ(matrix_run.results.size(), 2u);
  EXPECT_NE(log.str().find("1 baseline for 2 scenarios"), std::string::npos) << log.str();
  for (const auto& shared : matrix_run.results) {
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
  auto result = run("faults/fault=" + GetParam());
  EXPECT_TRUE(result.passed) << result.verdict;
  EXPECT_EQ(result.outcome, rh::Outcome::diverged);
  EXPECT_FALSE(result.first_divergence.empty());
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
      const auto tool_run = rh::testutil::run_logged(rh::testutil::tool_argv(args), dir / "out.txt");
      EXPECT_EQ(tool_run.code, 2) << sub[0] << " " << name;
      EXPECT_NE(tool_run.log.find((dir / "bad.toml").string() + ":2: scenario.name"), std::string::npos)
          << tool_run.log;
      EXPECT_TRUE(fs::exists(dir / "run" / "keep.txt")) << sub[0] << " " << name;
    }
  }
  fs::remove_all(dir);
}

// The matrix's plan: the CI file's 59 cells train 26 baselines; cells differing only in save
// policy, compression, fault or the resumed bucket layout share one, and a resharded cell's
// reference is the baseline of its resumed size.
TEST(CheckPlan, CellsThatDifferOnlyAtSaveOrLoadShareABaseline) {
  const auto all = rh::load_scenarios(std::string(RH_SOURCE_DIR) + "/scenarios/ci.toml");
  const auto plan = rh::plan_checks(all, "/nonexistent/baselines");
  ASSERT_EQ(plan.cells.size(), all.size());
  EXPECT_EQ(plan.baselines.size(), 26u);
  auto cell = [&](const std::string& name) {
    for (const auto& c : plan.cells)
      if (all[c.scenario].name == name) return c;
    throw std::runtime_error("no cell " + name);
  };
  const auto native_cell = cell("states/moments=bf16,master=fp32,policy=native");
  const auto per_key_cell = cell("states/moments=bf16,master=fp32,policy=per_key");
  EXPECT_EQ(native_cell.baseline, per_key_cell.baseline);
  EXPECT_EQ(cell("buckets/resume=same").baseline, cell("buckets/resume=one-bucket").baseline);
  EXPECT_NE(native_cell.save, per_key_cell.save);   // two checkpoints of one state
  const auto rng_fault_cell = cell("faults/fault=skip_rng_restore");
  const auto remainders_fault_cell = cell("faults/fault=drop_remainders");
  EXPECT_EQ(rng_fault_cell.baseline, remainders_fault_cell.baseline);
  EXPECT_EQ(rng_fault_cell.save, remainders_fault_cell.save);   // the same checkpoint: faults act on load
  EXPECT_NE(cell("states/moments=bf16,master=remainders,policy=native").baseline, native_cell.baseline);
  const auto reshard_cell = cell("reshard/sizes=1to2");
  EXPECT_NE(reshard_cell.reference, reshard_cell.baseline);
  EXPECT_EQ(plan.baselines[reshard_cell.reference].dp_size, 2);
  for (const auto& planned_cell : plan.cells) {
    const auto& scenario = all[planned_cell.scenario];
    const auto& base = plan.baselines[planned_cell.baseline];
    EXPECT_EQ(rh::to_json(base.cfg), rh::to_json(scenario.cfg)) << scenario.name;
    EXPECT_EQ(base.dp_size, scenario.dp_size) << scenario.name;
    EXPECT_EQ(base.save_at, scenario.save_at) << scenario.name;
  }
}

TEST(SavePlan, RoundTripsAndRefusesBadEntriesNamingThem) {
  const fs::path work_dir = fs::temp_directory_path() / ("rh_save_plan_" + std::to_string(::getpid()));
  fs::create_directories(work_dir);
  rh::SaveTarget native_target{(work_dir / "a").string(), {}}, per_key_target{(work_dir / "b").string(), {}};
  per_key_target.policy.kind = rh::ckpt::SavePolicyKind::per_key;
  per_key_target.policy.compress = rh::ckpt::Compression::zstd;
  per_key_target.policy.overrides["exp_avg_sq"] = rh::optim::Dtype::bf16;
  rh::write_save_plan((work_dir / "plan.json").string(), {native_target, per_key_target});
  const auto back = rh::read_save_plan((work_dir / "plan.json").string());
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].root, per_key_target.root);
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
    std::ofstream(work_dir / "bad.json") << text;
    try {
      rh::read_save_plan((work_dir / "bad.json").string());
      ADD_FAILURE() << "accepted " << text;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find((work_dir / "bad.json").string()), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  }
  fs::remove_all(work_dir);
}

INSTANTIATE_TEST_SUITE_P(Faults, CheckFault,
                         ::testing::Values("skip_rng_restore", "skip_data_position_restore", "reset_step_counter",
                                           "skip_exp_avg_restore", "reset_lr_schedule", "drop_remainders"),
                         [](const auto& info) { return info.param; });

}   // namespace
