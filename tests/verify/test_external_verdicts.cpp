// The external check's evidence rules, piece by piece: values the harness varied between runs
// (run_varied.h), checkpoint.ignore globs, RNG streams no run draws from, every differing metric
// named with its own first iteration, the probe's state before its metrics, and the dtype audit of
// saved optimizer state. Each expected value is written out by hand from the rule it pins.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "harness/verify/external_checkpoints.h"
#include "harness/verify/external_compare.h"
#include "harness/verify/external_run.h"
#include "harness/verify/run_varied.h"

namespace {

using rh::external::RunSide;

// What the harness gives a run of a nanoGPT-style command (key=value) or a Megatron-style one
// (--flag value): its placeholder values and its argument list before and after expansion.
RunSide side(const std::string& label, int iterations, const std::string& load_dir, bool megatron, bool resume) {
  RunSide s;
  const std::string run_dir = "/cell/" + label, save_dir = run_dir + "/save";
  s.vars = {{"iterations", std::to_string(iterations)}, {"save_at", "10"},     {"save_dir", save_dir},
            {"load_dir", load_dir.empty() ? save_dir : load_dir},             {"run_dir", run_dir}};
  if (megatron) {
    s.argv_template = {"python3", "pretrain.py", "--train-iters", "20", "--exit-interval", "{iterations}",
                       "--save", "{save_dir}", "--load", "{load_dir}"};
    if (resume) s.argv_template.push_back("--use-checkpoint-args");
  } else {
    s.argv_template = {"python3", "train.py", "out_dir={save_dir}", "max_iters={iterations}"};
    if (resume) s.argv_template.insert(s.argv_template.end(), {"init_from=resume", "load_dir={load_dir}"});
  }
  for (const auto& token : s.argv_template) {
    std::string expanded = token;
    for (const auto& [name, value] : s.vars) {
      const std::string placeholder = "{" + name + "}";
      for (size_t at; (at = expanded.find(placeholder)) != std::string::npos;)
        expanded.replace(at, placeholder.size(), value);
    }
    s.argv.push_back(expanded);
  }
  return s;
}

struct VariedCase {
  const char* name;
  bool megatron, b_resumed;   // b: the interrupted run (iterations 10) or the resumed one (20, loading)
  const char* key;
  const char* a_text;         // saved by the uninterrupted run (iterations 20)
  const char* b_text;
  std::optional<std::string> as;
};

class HarnessVaried : public ::testing::TestWithParam<VariedCase> {};

TEST_P(HarnessVaried, MatchesOnlyWhatTheHarnessGave) {
  const auto& c = GetParam();
  const RunSide a = side("uninterrupted_1", 20, "", c.megatron, false);
  const RunSide b = c.b_resumed ? side("resumed", 20, "/cell/interrupted/save", c.megatron, true)
                                : side("interrupted", 10, "", c.megatron, false);
  EXPECT_EQ(rh::external::harness_varied(c.key, c.a_text, c.b_text, a, b), c.as);
}

INSTANTIATE_TEST_SUITE_P(
    Cases, HarnessVaried,
    ::testing::Values(
        VariedCase{"out_dir", false, false, "config/out_dir", "str:/cell/uninterrupted_1/save",
                   "str:/cell/interrupted/save", "argument out_dir={save_dir}"},
        VariedCase{"max_iters", false, false, "config/max_iters", "int:20", "int:10", "argument max_iters={iterations}"},
        // The same numbers under a key no argument names: state (a schedule's horizon), compared.
        VariedCase{"schedule_horizon", false, false, "scheduler/total_steps", "int:20", "int:10", std::nullopt},
        // An argument's name, but not the value the run was given: compared.
        VariedCase{"max_iters_other", false, false, "config/max_iters", "int:20", "int:11", std::nullopt},
        VariedCase{"path_inside", false, false, "config/log_file", "str:/cell/uninterrupted_1/save/log.txt",
                   "str:/cell/interrupted/save/log.txt", "as {save_dir}/log.txt"},
        VariedCase{"run_dir", false, false, "meta/cwd", "path:/cell/uninterrupted_1", "path:/cell/interrupted",
                   "as {run_dir}"},
        VariedCase{"other_dir", false, false, "config/out_dir", "str:/cell/uninterrupted_1/save", "str:/elsewhere/save",
                   std::nullopt},
        VariedCase{"other_type", false, false, "config/out_dir", "str:/cell/uninterrupted_1/save",
                   "path:/cell/interrupted/save", std::nullopt},
        // The user's own difference between command and resume_command.
        VariedCase{"init_from", false, true, "config/init_from", "str:scratch", "str:resume",
                   "argument init_from (not given vs resume)"},
        VariedCase{"init_from_wrong", false, true, "config/init_from", "str:scratch", "str:finetune", std::nullopt},
        VariedCase{"load_dir", false, true, "config/load_dir", "str:", "str:/cell/interrupted/save",
                   "argument load_dir (not given vs {load_dir})"},
        // Megatron's args: --load is {load_dir} in both (the uninterrupted run's is its own save
        // directory), --exit-interval {iterations}, a bare flag only in resume_command.
        VariedCase{"megatron_load", true, false, "args/load", "str:/cell/uninterrupted_1/save",
                   "str:/cell/interrupted/save", "argument load={load_dir}"},
        VariedCase{"megatron_exit_interval", true, false, "args/exit_interval", "int:20", "int:10",
                   "argument exit_interval={iterations}"},
        VariedCase{"megatron_flag", true, true, "args/use_checkpoint_args", "bool:false", "bool:true",
                   "argument use_checkpoint_args (not given vs (given))"},
        VariedCase{"megatron_fixed", true, false, "args/train_iters", "int:20", "int:10", std::nullopt},
        // A saved argv list: a whole expanded token is its template.
        VariedCase{"argv_token", true, false, "argv/5", "str:20", "str:10", "as {iterations}"}),
    [](const auto& info) { return std::string(info.param.name); });

TEST(KeyGlob, StarCrossesSlashesQuestionMarkIsOneCharacter) {
  using rh::external::key_glob_match;
  EXPECT_TRUE(key_glob_match("run_info/*", "run_info/started_at"));
  EXPECT_TRUE(key_glob_match("*started_at", "a/b/started_at"));
  EXPECT_TRUE(key_glob_match("*/host", "x/y/host"));
  EXPECT_TRUE(key_glob_match("rank?", "rank0"));
  EXPECT_TRUE(key_glob_match("*", ""));
  EXPECT_FALSE(key_glob_match("run_info/*", "config/run_info"));
  EXPECT_FALSE(key_glob_match("rank?", "rank10"));
  EXPECT_FALSE(key_glob_match("host", "hostname"));
  EXPECT_EQ(rh::external::flag_key("--Train-Iters"), "train_iters");
  EXPECT_EQ(rh::external::flag_key("max_iters"), "max_iters");
}

rh::external::ProbeRecord record(const char* event, int64_t it, std::vector<std::pair<std::string, std::string>> state,
                                 std::vector<std::pair<std::string, std::string>> metrics = {}) {
  rh::external::ProbeRecord r;
  r.event = event;
  r.iteration = it;
  r.state = std::move(state);
  r.metrics = std::move(metrics);
  return r;
}

TEST(UnusedStreams, ConstantInEveryRunWithTwoRecordsAtLeast) {
  // rng/python: never drawn (its own value per process); rng/torch: drawn every step.
  const std::vector<rh::external::ProbeRecord> first = {
      record("step", 1, {{"rng/python", "a1"}, {"rng/torch", "t1"}, {"rng/numpy", "n1"}}),
      record("step", 2, {{"rng/python", "a1"}, {"rng/torch", "t2"}, {"rng/numpy", "n1"}})};
  const std::vector<rh::external::ProbeRecord> second = {
      record("step", 1, {{"rng/python", "b1"}, {"rng/torch", "t1"}, {"rng/numpy", "n1"}}),
      record("step", 2, {{"rng/python", "b1"}, {"rng/torch", "t2"}, {"rng/numpy", "n2"}})};
  EXPECT_EQ(rh::external::unused_streams({&first, &second}), (std::set<std::string>{"rng/python"}));
  EXPECT_EQ(rh::external::unused_streams({&first}), (std::set<std::string>{"rng/numpy", "rng/python"}));
  // One record shows neither use nor disuse.
  const std::vector<rh::external::ProbeRecord> one = {record("after_load", 10, {{"rng/python", "c"}})};
  EXPECT_TRUE(rh::external::unused_streams({&first, &one}).empty());
}

TEST(ProbeSteps, StateBeforeMetricsAndUnusedStreamsSkipped) {
  const std::vector<rh::external::ProbeRecord> ref = {
      record("step", 11, {{"data/batch", "b"}, {"rng/python", "p1"}, {"param/w", "w"}}, {{"loss", "0x1p+0"}})};
  const std::vector<rh::external::ProbeRecord> got = {
      record("step", 11, {{"data/batch", "B"}, {"rng/python", "p2"}, {"param/w", "W"}}, {{"loss", "0x1.1p+0"}})};
  EXPECT_EQ(rh::external::compare_probe_steps(ref, got, 11, 20).what, "iteration 11: data/batch");
  const std::vector<rh::external::ProbeRecord> same_batch = {
      record("step", 11, {{"data/batch", "b"}, {"rng/python", "p2"}, {"param/w", "W"}}, {{"loss", "0x1.1p+0"}})};
  EXPECT_EQ(rh::external::compare_probe_steps(ref, same_batch, 11, 20).what, "iteration 11: rng/python");
  EXPECT_EQ(rh::external::compare_probe_steps(ref, same_batch, 11, 20, {"rng/python"}).what, "iteration 11: param/w");
}

rh::MetricLog log_of(const std::vector<std::vector<std::pair<std::string, std::string>>>& rows, int64_t first) {
  rh::MetricLog log;
  for (size_t i = 0; i < rows.size(); ++i) {
    rh::MetricRow row;
    row.iteration = first + static_cast<int64_t>(i);
    row.values = rows[i];
    row.line = i + 1;
    log.append(row);
  }
  return log;
}

TEST(CompareRows, NamesEveryMetricAtTheFirstIterationAndEachLaterOnesOwn) {
  // Step 11's update went wrong (lr), its forward did not: the loss differs from 12.
  const auto ref = log_of({{{"loss", "3.5"}, {"lr", "1e-3"}}, {{"loss", "3.4"}, {"lr", "9e-4"}}}, 11);
  const auto lr_first = log_of({{{"loss", "3.5"}, {"lr", "2e-3"}}, {{"loss", "3.6"}, {"lr", "8e-4"}}}, 11);
  EXPECT_EQ(rh::external::compare_rows(ref, lr_first, 11, 12, "resumed", nullptr).what,
            "iteration 11: metric lr (1e-3 vs 2e-3); loss from 12");
  const auto both = log_of({{{"loss", "3.6"}, {"lr", "2e-3"}}, {{"loss", "3.4"}, {"lr", "9e-4"}}}, 11);
  EXPECT_EQ(rh::external::compare_rows(ref, both, 11, 12, "resumed", nullptr).what,
            "iteration 11: metric loss (3.5 vs 3.6), metric lr (1e-3 vs 2e-3)");
  EXPECT_FALSE(rh::external::compare_rows(ref, ref, 11, 12, "resumed", nullptr).found());
}

rh::external::Flat flat_of(const std::vector<std::tuple<std::string, rh::ckpt::StDtype, std::vector<int64_t>>>& rows) {
  rh::external::Flat flat;
  for (const auto& [key, dtype, shape] : rows) flat.tensors[key] = {dtype, torch::zeros(shape)};
  return flat;
}

TEST(DtypeAudit, NamesOptimizerStateNarrowerThanItsParameters) {
  using rh::ckpt::StDtype;
  const auto lossy = flat_of({{"model/fc.weight", StDtype::F32, {4, 4}},
                              {"optimizer/state/0/exp_avg", StDtype::F16, {4, 4}},
                              {"optimizer/state/0/exp_avg_sq", StDtype::F32, {4, 4}},
                              {"optimizer/state/0/step", StDtype::F32, {}},
                              {"optimizer/state/1/exp_avg", StDtype::BF16, {7}}});   // no parameter of that shape
  EXPECT_EQ(rh::external::lossy_optimizer_state(lossy),
            (std::vector<std::string>{"optimizer/state/0/exp_avg saved as F16, the parameters of its shape as F32"}));
  // bf16 parameters with bf16 moments (a low-precision trainer holding them so) are not lossy.
  const auto narrow = flat_of({{"model/fc.weight", StDtype::BF16, {4, 4}},
                               {"optimizer/state/0/exp_avg", StDtype::BF16, {4, 4}}});
  EXPECT_TRUE(rh::external::lossy_optimizer_state(narrow).empty());
}

// A failed run's stderr reaches the FAIL line as its last lines joined by " | ", never as \x0a.
TEST(StderrTail, LastLinesOnOneLineWithoutEscapedLineBreaks) {
  using rh::external::stderr_tail;
  EXPECT_EQ(stderr_tail("Traceback (most recent call last):\n  File \"t.py\", line 3\nKeyError: 'lr'\n"),
            "Traceback (most recent call last): |   File \"t.py\", line 3 | KeyError: 'lr'");
  EXPECT_EQ(stderr_tail("one\r\n\n\n  \ntwo\n"), "one | two");
  EXPECT_EQ(stderr_tail(""), "");
  EXPECT_EQ(stderr_tail("bell\a here"), "bell\\x07 here");   // other control bytes stay escaped
  // Cut at 400 bytes: the first, partial line is dropped and the joined text stays near the cap.
  std::string cut = std::string(390, 'x') + "\nlast line\n";
  EXPECT_EQ(stderr_tail(cut), "last line");
  std::string many;
  for (int i = 0; i < 100; ++i) many += "line " + std::to_string(i) + "\n";
  const std::string tail = stderr_tail(many.substr(many.size() - 400));
  EXPECT_LE(tail.size(), 400u);
  EXPECT_EQ(tail.substr(tail.size() - 7), "line 99");
  EXPECT_EQ(tail.find('\n'), std::string::npos);
}

}   // namespace
