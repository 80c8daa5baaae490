// Megatron's OptimizerParamScheduler (harness/train/schedule.h), pinned against:
//  - an independent Python computation (tests/sched_reference.py, run by this test with
//    /usr/bin/python3) of get_lr / get_wd at chosen num_steps for every LR decay style, every WSD
//    anneal style and every weight-decay increment style, compared bit for bit;
//  - constants worked out by hand from upstream's formulas;
//  - _check_and_set / load_state_dict: a mismatch is refused naming the key, unless
//    --use-checkpoint-opt_param-scheduler (the checkpoint's value) or
//    --override-opt_param-scheduler (this run's), never both;
//  - the trainer: the LR of each iteration and the weight decay its step applies are the
//    scheduler's, and a restored state continues identically, a reset one does not.
#include <gtest/gtest.h>

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <vector>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "tests/python_reference.h"
#include "harness/train/env.h"
#include "harness/train/schedule.h"
#include "harness/train/trainer.h"
#include "tests/test_util.h"

namespace {

using rh::testutil::slurp;

const nlohmann::json& schedule_reference() {
  return rh::testing::python_reference("sched_reference.py", "sched_reference.json");
}

uint64_t bits(double d) {
  uint64_t u;
  std::memcpy(&u, &d, 8);
  return u;
}

rh::RunConfig config_of(const nlohmann::json& reference_case) {
  rh::RunConfig cfg;
  cfg.train.lr = reference_case.at("max_lr");
  cfg.train.min_lr = reference_case.at("min_lr");
  cfg.train.lr_warmup_init = reference_case.at("init_lr");
  cfg.train.global_batch = reference_case.at("gb");
  cfg.train.micro_batch = reference_case.at("gb");
  cfg.train.lr_warmup_iters = reference_case.at("warmup_iters");
  cfg.train.lr_decay_iters = reference_case.at("decay_iters");
  cfg.train.iterations = reference_case.at("train_iters");
  cfg.train.lr_wsd_decay_iters = reference_case.at("wsd_iters");
  cfg.train.lr_decay_style = reference_case.at("style");
  cfg.train.lr_wsd_decay_style = reference_case.at("wsd_style");
  cfg.train.weight_decay_incr_style = reference_case.at("wd_style");
  if (cfg.train.weight_decay_incr_style == "constant") {   // upstream: start/end unset, = weight_decay
    cfg.optim.weight_decay = reference_case.at("start_wd");
  } else {
    cfg.train.start_weight_decay = reference_case.at("start_wd");
    cfg.train.end_weight_decay = reference_case.at("end_wd");
  }
  return cfg;
}

TEST(Schedule, EveryStyleMatchesAnIndependentPythonComputationBitForBit) {
  size_t values_checked = 0;
  for (const auto& reference_case : schedule_reference().at("cases")) {
    const auto cfg = config_of(reference_case);
    ASSERT_NO_THROW(rh::validate(cfg)) << reference_case.at("name");
    auto scheduler = rh::scheduler_from_config(cfg);
    const auto scheduler_args = rh::scheduler_args_from_config(cfg);
    for (const auto& reference_value : reference_case.at("values")) {
      scheduler.num_steps = reference_value.at("num_steps");
      const double lr = std::strtod(reference_value.at("lr").get<std::string>().c_str(), nullptr);
      const double wd = std::strtod(reference_value.at("wd").get<std::string>().c_str(), nullptr);
      EXPECT_EQ(bits(rh::scheduler_lr(scheduler, scheduler_args)), bits(lr))
          << reference_case.at("name") << " lr at num_steps " << scheduler.num_steps << ": "
          << rh::scheduler_lr(scheduler, scheduler_args) << " vs " << lr;
      EXPECT_EQ(bits(rh::scheduler_wd(scheduler)), bits(wd))
          << reference_case.at("name") << " wd at num_steps " << scheduler.num_steps << ": "
          << rh::scheduler_wd(scheduler) << " vs " << wd;
      ++values_checked;
    }
  }
  EXPECT_GT(values_checked, 200u);
}

// Hand-worked from upstream's formulas (max 1e-2, min 1e-3, warmup 2 iterations, decay 20, 16
// samples per iteration): warmup is inclusive and starts at init_lr, so iteration 1 steps with
// lr 0 and iteration 3 (num_steps 32 = warmup) with the peak; linear halfway is (max + min) / 2.
TEST(Schedule, HandWorkedValues) {
  rh::RunConfig cfg;
  cfg.train.lr_decay_style = "linear";
  auto scheduler = rh::scheduler_from_config(cfg);
  const auto scheduler_args = rh::scheduler_args_from_config(cfg);
  EXPECT_EQ(scheduler.lr_warmup_steps, 32);
  EXPECT_EQ(scheduler.lr_decay_steps, 320);
  EXPECT_EQ(scheduler.wd_incr_steps, 320);
  EXPECT_EQ(scheduler.start_wd, cfg.optim.weight_decay);   // --start/--end-weight-decay default to --weight-decay
  scheduler.num_steps = 0;
  EXPECT_EQ(rh::scheduler_lr(scheduler, scheduler_args), 0.0);
  scheduler.num_steps = 16;
  EXPECT_EQ(rh::scheduler_lr(scheduler, scheduler_args), 0.005);
  scheduler.num_steps = 32;
  EXPECT_EQ(rh::scheduler_lr(scheduler, scheduler_args), 0.01);
  scheduler.num_steps = 176;   // (176 - 32) / 288 = 0.5
  EXPECT_NEAR(rh::scheduler_lr(scheduler, scheduler_args), 0.0055, 1e-17);
  scheduler.num_steps = 320;
  EXPECT_NEAR(rh::scheduler_lr(scheduler, scheduler_args), 0.001, 1e-18);
  scheduler.num_steps = 321;
  EXPECT_EQ(rh::scheduler_lr(scheduler, scheduler_args), 0.001);
  scheduler.lr_decay_style = "constant";
  EXPECT_EQ(rh::scheduler_lr(scheduler, scheduler_args), 0.01);   // constant ignores the end of decay
  scheduler.lr_decay_style = "inverse-square-root";
  scheduler.num_steps = 128;   // 1e-2 * sqrt(32) / sqrt(128) = 5e-3
  EXPECT_EQ(rh::scheduler_lr(scheduler, scheduler_args), 0.005);
  scheduler.num_steps = 160;
  scheduler.start_wd = 0.0;
  scheduler.end_wd = 0.1;
  scheduler.wd_incr_style = "linear";
  EXPECT_EQ(rh::scheduler_wd(scheduler), 0.05);
  scheduler.wd_incr_style = "cosine";   // 0.5 * (cos(pi / 2) + 1) * 0.1
  EXPECT_NEAR(rh::scheduler_wd(scheduler), 0.05, 1e-17);
  scheduler.num_steps = 400;
  EXPECT_EQ(rh::scheduler_wd(scheduler), 0.1);
}

TEST(Schedule, BadStylesAndUpstreamAssertsAreBadInput) {
  auto refused = [](auto edit, const std::string& want) {
    rh::RunConfig cfg;
    edit(cfg);
    try {
      rh::validate(cfg);
      ADD_FAILURE() << "accepted, expected: " << want;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  refused([](rh::RunConfig& c) { c.train.lr_decay_style = "cosine-ish"; },
          "train.lr_decay_style (--lr-decay-style) must be one of constant, linear, cosine, inverse-square-root, WSD, "
          "got 'cosine-ish'");
  refused([](rh::RunConfig& c) { c.train.weight_decay_incr_style = "exp"; },
          "must be one of constant, linear, cosine, got 'exp'");
  refused([](rh::RunConfig& c) { c.train.lr_decay_style = "WSD"; }, "needs train.lr_wsd_decay_iters");
  refused([](rh::RunConfig& c) { c.train.lr_wsd_decay_style = "step"; }, "train.lr_wsd_decay_style");
  refused([](rh::RunConfig& c) { c.train.weight_decay_incr_style = "exp"; }, "train.weight_decay_incr_style");
  // arguments.py: constant asserts --start/--end-weight-decay are None, even set to the same
  // value; linear and cosine assert both are set.
  refused(
      [](rh::RunConfig& c) {
        c.train.start_weight_decay = 0.0;
        c.train.end_weight_decay = 0.1;
      },
      "constant: train.start_weight_decay and train.end_weight_decay");
  refused([](rh::RunConfig& c) { c.train.start_weight_decay = c.train.end_weight_decay = 0.1; }, "must be unset");
  refused([](rh::RunConfig& c) { c.train.end_weight_decay = 0.1; }, "must be unset");
  for (const char* style : {"linear", "cosine"}) {
    refused([&](rh::RunConfig& c) { c.train.weight_decay_incr_style = style; },
            std::string("weight_decay_incr_style ") + style + " needs both");
    refused(
        [&](rh::RunConfig& c) {
          c.train.weight_decay_incr_style = style;
          c.train.start_weight_decay = 0.0;
        },
        "needs both");
    refused(
        [&](rh::RunConfig& c) {
          c.train.weight_decay_incr_style = style;
          c.train.end_weight_decay = 0.1;
        },
        "needs both");
  }
  refused(
      [](rh::RunConfig& c) {
        c.train.start_weight_decay = 0.2;
        c.train.end_weight_decay = 0.1;
        c.train.weight_decay_incr_style = "linear";
      },
      "end_wd >= start_wd");
  refused([](rh::RunConfig& c) { c.train.lr_warmup_init = 1.0; }, "train.lr_warmup_init");
  refused([](rh::RunConfig&
                 c) { c.train.override_opt_param_scheduler = c.train.use_checkpoint_opt_param_scheduler = true; },
          "both override and use-checkpoint are set.");
}

TEST(Schedule, LoadChecksEveryKeyOrTakesTheSideTheFlagsName) {
  rh::RunConfig cfg;
  auto saved = rh::scheduler_from_config(cfg);
  saved.num_steps = 160;
  auto run_scheduler = rh::scheduler_from_config(cfg);
  auto scheduler_args = rh::scheduler_args_from_config(cfg);
  // Same values: the saved state comes back whole, num_steps included.
  auto loaded = rh::load_scheduler_state(run_scheduler, saved, scheduler_args, "ckpt");
  EXPECT_EQ(loaded.num_steps, 160);
  EXPECT_EQ(loaded.lr_decay_style, "cosine");
  // A different decay style in this run: refused naming the key (upstream's assert).
  run_scheduler.lr_decay_style = "linear";
  try {
    rh::load_scheduler_state(run_scheduler, saved, scheduler_args, "ckpt");
    ADD_FAILURE() << "a mismatch was accepted";
  } catch (const std::invalid_argument& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("ckpt: opt_param_scheduler.lr_decay_style"), std::string::npos) << message;
    EXPECT_NE(message.find(
                  "class input value linear and checkpoint value cosine for learning rate decay style do not match"),
              std::string::npos)
        << message;
  }
  scheduler_args.use_checkpoint_opt_param_scheduler = true;
  EXPECT_EQ(rh::load_scheduler_state(run_scheduler, saved, scheduler_args, "ckpt").lr_decay_style, "cosine");
  scheduler_args.use_checkpoint_opt_param_scheduler = false;
  scheduler_args.override_opt_param_scheduler = true;
  loaded = rh::load_scheduler_state(run_scheduler, saved, scheduler_args, "ckpt");
  EXPECT_EQ(loaded.lr_decay_style, "linear");
  EXPECT_EQ(loaded.num_steps, 160);   // num_steps is never overridden: step(increment=num_steps)
  scheduler_args.use_checkpoint_opt_param_scheduler = true;
  EXPECT_THROW(rh::load_scheduler_state(run_scheduler, saved, scheduler_args, "ckpt"), std::invalid_argument);
  // Every other key is checked too.
  scheduler_args = rh::scheduler_args_from_config(cfg);
  for (int k = 0; k < 8; ++k) {
    auto mismatched = rh::scheduler_from_config(cfg);
    switch (k) {
      case 0: mismatched.max_lr *= 2; break;
      case 1: mismatched.min_lr *= 2; break;
      case 2: mismatched.lr_warmup_steps += 1; break;
      case 3: mismatched.lr_decay_steps += 1; break;
      case 4: mismatched.start_wd = 0; break;
      case 5: mismatched.end_wd = 1; break;
      case 6: mismatched.wd_incr_steps += 1; break;
      case 7: mismatched.wd_incr_style = "linear"; break;
    }
    EXPECT_THROW(rh::load_scheduler_state(mismatched, saved, scheduler_args, "ckpt"), std::invalid_argument)
        << "key " << k;
  }
}

TEST(Schedule, LoadComparesTheKeysInUpstreamsOrderNamingEach) {
  rh::RunConfig cfg;
  const auto saved = rh::scheduler_from_config(cfg);
  auto run_scheduler = saved;
  run_scheduler.max_lr *= 2;
  run_scheduler.min_lr *= 2;
  run_scheduler.lr_warmup_steps += 1;
  run_scheduler.lr_decay_steps += 1;
  run_scheduler.lr_decay_style = "linear";
  run_scheduler.start_wd = 0.5;
  run_scheduler.end_wd = 0.5;
  run_scheduler.wd_incr_steps += 1;
  run_scheduler.wd_incr_style = "linear";
  run_scheduler.num_steps = 7;   // added, never compared
  // OptimizerParamScheduler.load_state_dict's order and _check_and_set's names.
  const std::vector<std::pair<std::string, std::string>> order = {{"max_lr", "learning rate"},
                                                                  {"min_lr", "minimum learning rate"},
                                                                  {"lr_warmup_steps", "warmup iterations"},
                                                                  {"lr_decay_steps", "total number of iterations"},
                                                                  {"lr_decay_style", "learning rate decay style"},
                                                                  {"start_wd", "start weight decay"},
                                                                  {"end_wd", "end weight decay"},
                                                                  {"wd_incr_steps",
                                                                   "total number of weight decay iterations"},
                                                                  {"wd_incr_style", "weight decay incr style"}};
  const auto scheduler_args = rh::scheduler_args_from_config(cfg);
  for (size_t i = 0; i < order.size(); ++i) {
    try {
      rh::load_scheduler_state(run_scheduler, saved, scheduler_args, "ckpt");
      ADD_FAILURE() << order[i].first << " was not compared";
    } catch (const std::invalid_argument& e) {
      const std::string message = e.what();
      EXPECT_EQ(message.rfind("ckpt: opt_param_scheduler." + order[i].first + ": ", 0), 0u) << message;
      EXPECT_NE(message.find(" for " + order[i].second + " do not match"), std::string::npos) << message;
    }
    switch (i) {   // this key agrees now: the next one is named
      case 0: run_scheduler.max_lr = saved.max_lr; break;
      case 1: run_scheduler.min_lr = saved.min_lr; break;
      case 2: run_scheduler.lr_warmup_steps = saved.lr_warmup_steps; break;
      case 3: run_scheduler.lr_decay_steps = saved.lr_decay_steps; break;
      case 4: run_scheduler.lr_decay_style = saved.lr_decay_style; break;
      case 5: run_scheduler.start_wd = saved.start_wd; break;
      case 6: run_scheduler.end_wd = saved.end_wd; break;
      case 7: run_scheduler.wd_incr_steps = saved.wd_incr_steps; break;
      case 8: run_scheduler.wd_incr_style = saved.wd_incr_style; break;
    }
  }
  EXPECT_EQ(rh::load_scheduler_state(run_scheduler, saved, scheduler_args, "ckpt").num_steps, 7 + saved.num_steps);
}

rh::RunConfig small_scheduled_config();

TEST(Schedule, FingerprintsNameEverySchedulerKeyInStateDictOrder) {
  rh::RunConfig cfg = small_scheduled_config();
  rh::Trainer trainer(cfg);
  std::vector<std::string> got;
  for (const auto& [k, h] : trainer.fingerprints())
    if (k.rfind("state/opt_param_scheduler.", 0) == 0) got.push_back(k.substr(26));
  EXPECT_EQ(got, (std::vector<std::string>{"max_lr", "lr_warmup_steps", "num_steps", "lr_decay_style", "lr_decay_steps",
                                           "min_lr", "start_wd", "end_wd", "wd_incr_style", "wd_incr_steps"}));
}

rh::RunConfig small_scheduled_config() {
  rh::RunConfig cfg;
  cfg.model.d_model = 64;
  cfg.model.ffn_hidden = 64;
  cfg.model.seq_len = 32;
  cfg.model.vocab_size = 64;
  cfg.train.global_batch = 8;
  cfg.train.micro_batch = 4;
  cfg.train.iterations = 6;
  cfg.train.lr_decay_iters = 6;
  cfg.train.lr_decay_style = "WSD";
  cfg.train.lr_wsd_decay_iters = 3;
  cfg.train.lr_wsd_decay_style = "cosine";
  cfg.train.start_weight_decay = 0.0;
  cfg.train.end_weight_decay = 0.3;
  cfg.train.weight_decay_incr_style = "cosine";
  return cfg;
}

TEST(ScheduleInTrainer, EachStepUsesTheSchedulersLrAndWeightDecay) {
  rh::configure_determinism(1);
  const auto cfg = small_scheduled_config();
  rh::Trainer trainer(cfg);
  auto scheduler = rh::scheduler_from_config(cfg);
  const auto scheduler_args = rh::scheduler_args_from_config(cfg);
  size_t decay_group = 0;
  while (trainer.optimizer().group_name(decay_group) != "decay") ++decay_group;
  for (int i = 1; i <= 6; ++i) {
    const auto metrics = trainer.train_iteration();
    EXPECT_EQ(bits(metrics.lr), bits(rh::scheduler_lr(scheduler, scheduler_args))) << "iteration " << i;
    EXPECT_EQ(bits(trainer.optimizer().weight_decay(decay_group)), bits(rh::scheduler_wd(scheduler)))
        << "iteration " << i;
    scheduler.num_steps += cfg.train.global_batch;
    EXPECT_EQ(trainer.state().opt_param_scheduler.num_steps, scheduler.num_steps);
  }
}

bool same_loss_norm_lr_bits(const rh::IterMetrics& x, const rh::IterMetrics& y) {
  return bits(x.lm_loss) == bits(y.lm_loss) && bits(x.grad_norm) == bits(y.grad_norm) && bits(x.lr) == bits(y.lr);
}

TEST(ScheduleInTrainer, RestoredSchedulerContinuesIdenticallyAndAResetOneDoesNot) {
  rh::configure_determinism(1);
  const auto cfg = small_scheduled_config();
  rh::Trainer uninterrupted(cfg), restored(cfg), reset(cfg);
  for (auto* t : {&uninterrupted, &restored, &reset})
    for (int i = 0; i < 3; ++i) t->train_iteration();
  const auto saved_state = uninterrupted.state();
  const auto next = uninterrupted.train_iteration();
  restored.set_state(saved_state);
  EXPECT_TRUE(same_loss_norm_lr_bits(restored.train_iteration(), next));
  auto broken = saved_state;   // reset_wd_schedule: a constant optimizer.weight_decay instead of the increment
  broken.opt_param_scheduler.start_wd = broken.opt_param_scheduler.end_wd = cfg.optim.weight_decay;
  broken.opt_param_scheduler.wd_incr_style = "constant";
  reset.set_state(broken);
  const auto reset_metrics = reset.train_iteration();
  EXPECT_EQ(bits(reset_metrics.lr), bits(next.lr));   // the LR part is intact; the step's weight decay is not
  auto weights = [](const rh::Trainer& t) {
    std::vector<std::pair<std::string, uint64_t>> model_fingerprints;
    for (const auto& [k, h] : t.fingerprints())
      if (k.rfind("model/", 0) == 0) model_fingerprints.emplace_back(k, h);
    return model_fingerprints;
  };
  EXPECT_EQ(weights(restored), weights(uninterrupted));
  EXPECT_NE(weights(reset), weights(uninterrupted));
}

// Through the tool, in fresh processes: a checkpoint saved with a cosine schedule, resumed by a
// run asking for linear. Upstream (checkpointing.py load_checkpoint -> load_state_dict ->
// _check_and_set) refuses that by default, keeps cosine with --use-checkpoint-opt_param-scheduler
// (so the resumed LRs equal the uninterrupted run's) and takes linear with
// --override-opt_param-scheduler.
namespace cli {

namespace fs = std::filesystem;

const std::vector<std::string> kScheduleTinyFlags = {"train", "--vocab-size",
                                                     "32",    "--seq-length",
                                                     "16",    "--hidden-size",
                                                     "32",    "--num-layers",
                                                     "1",     "--num-attention-heads",
                                                     "2",     "--moe-ffn-hidden-size",
                                                     "32",    "--train-iters",
                                                     "6",     "--global-batch-size",
                                                     "4",     "--micro-batch-size",
                                                     "2",     "--lr-decay-iters",
                                                     "6",     "--quiet"};   // the default decay style: cosine

// `train` with the tiny flags and `more`, its output in log; the exit code.
int tool(std::vector<std::string> more, const fs::path& log) {
  std::vector<std::string> argv = rh::testutil::tool_argv(kScheduleTinyFlags);
  argv.insert(argv.end(), more.begin(), more.end());
  return rh::testutil::run_logged(argv, log).code;
}

// The lr_hex column of iterations from..6 in a metrics.csv.
std::vector<std::string> lrs(const fs::path& metrics, int from) {
  std::ifstream metrics_file(metrics);
  std::string line;
  std::getline(metrics_file, line);
  std::vector<std::string> cols;
  {
    std::stringstream header(line);
    std::string field;
    while (std::getline(header, field, ',')) cols.push_back(field);
  }
  const size_t at = std::find(cols.begin(), cols.end(), "lr_hex") - cols.begin();
  std::vector<std::string> out;
  while (std::getline(metrics_file, line)) {
    std::stringstream row(line);
    std::vector<std::string> fields;
    std::string field;
    while (std::getline(row, field, ',')) fields.push_back(field);
    if (std::stoi(fields.at(0)) >= from) out.push_back(fields.at(at));
  }
  return out;
}

TEST(ScheduleCli, ADifferentDecayStyleOnResumeIsRefusedUnlessAFlagSaysWhichSideWins) {
  const fs::path work_dir = fs::temp_directory_path() / ("rh_sched_cli_" + std::to_string(::getpid()));
  fs::remove_all(work_dir);
  fs::create_directories(work_dir);
  ASSERT_EQ(tool({"--out", (work_dir / "full").string()}, work_dir / "full.log"), 0) << slurp(work_dir / "full.log");
  ASSERT_EQ(tool({"--stop-at", "3", "--save", (work_dir / "ck").string(), "--out", (work_dir / "a").string()},
                 work_dir / "a.log"),
            0)
      << slurp(work_dir / "a.log");
  const std::vector<std::string> resume = {"--load", (work_dir / "ck").string(), "--lr-decay-style", "linear"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), resume.begin(), resume.end());
    return more;
  };
  EXPECT_EQ(tool(with({"--out", (work_dir / "refused").string()}), work_dir / "refused.log"), 2);
  EXPECT_NE(slurp(work_dir / "refused.log")
                .find("opt_param_scheduler.lr_decay_style: OptimizerParamScheduler: class input "
                      "value linear and checkpoint value cosine"),
            std::string::npos)
      << slurp(work_dir / "refused.log");
  ASSERT_EQ(tool(with({"--use-checkpoint-opt_param-scheduler", "--out", (work_dir / "ckpt").string()}),
                 work_dir / "ckpt.log"),
            0)
      << slurp(work_dir / "ckpt.log");
  ASSERT_EQ(tool(with({"--override-opt_param-scheduler", "--out", (work_dir / "over").string()}),
                 work_dir / "over.log"),
            0)
      << slurp(work_dir / "over.log");
  const auto full = lrs(work_dir / "full" / "metrics.csv", 4);
  ASSERT_EQ(full.size(), 3u);
  EXPECT_EQ(lrs(work_dir / "ckpt" / "metrics.csv", 4), full);   // the checkpoint's cosine
  EXPECT_NE(lrs(work_dir / "over" / "metrics.csv", 4), full);   // this run's linear
  EXPECT_EQ(tool(with({"--use-checkpoint-opt_param-scheduler", "--override-opt_param-scheduler", "--out",
                       (work_dir / "both").string()}),
                 work_dir / "both.log"),
            2);
  EXPECT_NE(slurp(work_dir / "both.log").find("both override and use-checkpoint are set."), std::string::npos)
      << slurp(work_dir / "both.log");
  fs::remove_all(work_dir);
}

}   // namespace cli

}   // namespace
