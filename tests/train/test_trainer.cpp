// The trainer: determinism of two runs, learning within 20 iterations, and state
// capture/restore continuing bit-identically in-process (the cross-process check is check's job).
#include <gtest/gtest.h>

#include <cstring>
#include <stdexcept>

#include "harness/train/env.h"
#include "harness/train/fault.h"
#include "harness/train/trainer.h"

namespace {

rh::RunConfig small_config(const std::string& param_dtype) {
  rh::RunConfig cfg;
  cfg.model.d_model = 64;
  cfg.model.ffn_hidden = 64;
  cfg.model.seq_len = 32;
  cfg.model.vocab_size = 64;
  cfg.model.param_dtype = param_dtype;
  cfg.train.global_batch = 8;
  cfg.train.micro_batch = 4;
  cfg.train.iterations = 6;
  cfg.train.lr_decay_iters = 6;
  if (param_dtype == "bf16") {
    cfg.optim.use_precision_aware_optimizer = true;
    cfg.optim.exp_avg_dtype = rh::optim::Dtype::bf16;
    cfg.optim.exp_avg_sq_dtype = rh::optim::Dtype::bf16;
  }
  return cfg;
}

bool same_bits(const rh::IterMetrics& a, const rh::IterMetrics& b) {
  for (const auto& n : rh::metric_names()) {
    const double x = rh::metric_value(a, n), y = rh::metric_value(b, n);
    if (std::memcmp(&x, &y, sizeof x) != 0) return false;
  }
  return a.iteration == b.iteration && a.consumed_samples == b.consumed_samples;
}

class TrainerByDtype : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { rh::configure_determinism(1); }
};

TEST_P(TrainerByDtype, TwoRunsAreBitIdentical) {
  auto cfg = small_config(GetParam());
  rh::Trainer a(cfg), b(cfg);
  for (int i = 0; i < 3; ++i) {
    auto ma = a.train_iteration(), mb = b.train_iteration();
    ASSERT_TRUE(same_bits(ma, mb)) << "iteration " << i + 1;
  }
  EXPECT_EQ(a.fingerprints(), b.fingerprints());
}

TEST_P(TrainerByDtype, DifferentSeedsDiffer) {
  auto cfg = small_config(GetParam());
  rh::Trainer a(cfg);
  cfg.train.seed += 1;
  rh::Trainer b(cfg);
  EXPECT_NE(a.fingerprints(), b.fingerprints());
  EXPECT_FALSE(same_bits(a.train_iteration(), b.train_iteration()));
}

// c reaches iteration 2 with the same weights as a, then gets a perturbed generator (from d, a
// run one iteration further); set_state with a's snapshot must put RNG, data position and LR
// schedule back so the next iteration matches a's bit for bit, and skipping the RNG must not.
TEST_P(TrainerByDtype, RestoredStateContinuesIdenticallyAndSkippedRngDoesNot) {
  auto cfg = small_config(GetParam());
  rh::Trainer a(cfg), c(cfg), d(cfg), e(cfg);
  for (auto* t : {&a, &c, &d, &e}) {
    t->train_iteration();
    t->train_iteration();
  }
  d.train_iteration();
  const auto st = a.state();
  const auto next = a.train_iteration();

  c.set_state(d.state(), /*restore_rng=*/true);   // perturb: d's advanced generator and position
  c.set_state(st, /*restore_rng=*/true);
  EXPECT_TRUE(same_bits(c.train_iteration(), next));

  e.set_state(d.state(), /*restore_rng=*/true);
  e.set_state(st, /*restore_rng=*/false);   // the fault: generator left as it was
  EXPECT_FALSE(same_bits(e.train_iteration(), next));
}

INSTANTIATE_TEST_SUITE_P(ParamDtype, TrainerByDtype, ::testing::Values("fp32", "bf16"),
                         [](const auto& info) { return info.param; });

TEST(Trainer, LossFallsWithinTwentyIterationsAtDefaults) {
  rh::configure_determinism(1);
  rh::RunConfig cfg;   // the default run
  rh::Trainer t(cfg);
  float first = 0, last = 0;
  for (int i = 0; i < 20; ++i) {
    auto m = t.train_iteration();
    if (i == 0) first = m.lm_loss;
    last = m.lm_loss;
    ASSERT_TRUE(std::isfinite(m.lm_loss));
  }
  EXPECT_LT(last, first - 1.0f) << "first " << first << " last " << last;
}

// The GPU path is compiled only with a CUDA LibTorch (RH_WITH_CUDA). Without one, asking for it
// is refused with a message that says why; with one and a device, two runs must be bit-identical
// under the deterministic settings (CUBLAS_WORKSPACE_CONFIG=:4096:8).
TEST(CudaDevice, WithoutACudaBuildIsRefusedSayingWhy) {
#ifdef RH_WITH_CUDA
  GTEST_SKIP() << "this build has CUDA; CudaDevice.TwoRunsAreBitIdentical covers the GPU path";
#else
  auto cfg = small_config("bf16");
  cfg.train.device = "cuda";
  try {
    rh::Trainer t(cfg);
    ADD_FAILURE() << "--device cuda accepted by a build without CUDA";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("this build has no CUDA"), std::string::npos) << e.what();
  }
#endif
}

TEST(CudaDevice, TwoRunsAreBitIdentical) {
#ifndef RH_WITH_CUDA
  GTEST_SKIP() << "skipped: no CUDA LibTorch in this build (the GPU path is compile-guarded)";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "skipped: CUDA build, but no CUDA device here";
  rh::configure_determinism(1);
  auto cfg = small_config("bf16");
  cfg.train.device = "cuda";
  rh::Trainer a(cfg), b(cfg);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(same_bits(a.train_iteration(), b.train_iteration())) << "iteration " << i + 1;
#endif
}

}   // namespace

namespace {

TEST(FaultTable, EveryNamePrintsAndParsesBackInTheEnumsOrder) {
  const std::vector<std::string> names = {"none",
                                          "skip_rng_restore",
                                          "skip_data_position_restore",
                                          "reset_step_counter",
                                          "skip_exp_avg_restore",
                                          "reset_lr_schedule",
                                          "drop_remainders",
                                          "reset_wd_schedule",
                                          "wrong_lr_decay_style",
                                          "skip_expert_bias_restore"};
  EXPECT_EQ(rh::fault_names(), names);
  for (size_t i = 0; i < names.size(); ++i) {
    const rh::Fault f = static_cast<rh::Fault>(i);
    EXPECT_EQ(rh::to_string(f), names[i]);
    EXPECT_EQ(rh::parse_fault(names[i]), f);
    EXPECT_EQ(rh::spec_of(f).fault, f);
    EXPECT_NE(std::string(rh::spec_of(f).what), "");
  }
  try {
    rh::parse_fault("skip_everything");
    ADD_FAILURE() << "parsed";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown fault 'skip_everything' (expected one of: none, skip_rng_restore,"),
              std::string::npos)
        << e.what();
  }
}

TEST(FaultTable, EachFaultActsWhereItSays) {
  using rh::Fault;
  EXPECT_EQ(rh::fault_skip_keys(Fault::skip_exp_avg_restore), (std::set<std::string>{"exp_avg"}));
  EXPECT_EQ(rh::fault_skip_keys(Fault::drop_remainders), (std::set<std::string>{"remainder"}));
  EXPECT_EQ(rh::fault_skip_keys(Fault::skip_expert_bias_restore), (std::set<std::string>{"buffers"}));
  EXPECT_TRUE(rh::fault_skip_keys(Fault::none).empty());
  EXPECT_TRUE(rh::fault_skip_keys(Fault::reset_lr_schedule).empty());
  for (const auto& s : rh::fault_specs()) EXPECT_EQ(s.fresh_rng, s.fault == Fault::skip_rng_restore) << s.name;

  rh::RunConfig cfg = small_config("fp32");
  cfg.optim.weight_decay = 0.05;
  cfg.train.start_weight_decay = 0.0;
  cfg.train.end_weight_decay = 0.1;
  cfg.train.weight_decay_incr_style = "linear";
  rh::Trainer tr(cfg);
  tr.train_iteration();
  const rh::ckpt::TrainState saved = tr.state();
  auto injected = [&](Fault f) {
    rh::ckpt::TrainState st = saved;
    rh::inject_state_fault(f, cfg, tr, st);
    return st;
  };
  EXPECT_EQ(injected(Fault::skip_data_position_restore).consumed_samples, 0);
  EXPECT_EQ(injected(Fault::reset_lr_schedule).opt_param_scheduler.num_steps, 0);
  const auto wd = injected(Fault::reset_wd_schedule).opt_param_scheduler;
  EXPECT_EQ(wd.start_wd, 0.05);
  EXPECT_EQ(wd.end_wd, 0.05);
  EXPECT_EQ(wd.wd_incr_style, "constant");
  EXPECT_EQ(saved.opt_param_scheduler.lr_decay_style, "cosine");
  EXPECT_EQ(injected(Fault::wrong_lr_decay_style).opt_param_scheduler.lr_decay_style, "linear");
  // The faults that act elsewhere leave the state as it was.
  for (Fault f : {Fault::none, Fault::skip_rng_restore, Fault::skip_exp_avg_restore, Fault::drop_remainders}) {
    const auto st = injected(f);
    EXPECT_EQ(st.consumed_samples, saved.consumed_samples);
    EXPECT_EQ(st.opt_param_scheduler.num_steps, saved.opt_param_scheduler.num_steps);
  }
  EXPECT_EQ(tr.optimizer().step_count(0), 1);
  injected(Fault::reset_step_counter);
  for (size_t g = 0; g < tr.optimizer().num_groups(); ++g) EXPECT_EQ(tr.optimizer().step_count(g), 0);
}

}   // namespace
