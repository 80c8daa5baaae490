// PrecisionAdam's contract outside the update math: Megatron's option rules (each refusal with
// its message), the master mode in effect, state accessors (unscaled get / scaled set, raw
// stored get / set with validation), an optimizer-level save/restore that continues bit for bit,
// step counters, and the main-grad helpers.
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <functional>

#include "harness/optim/precision_adam.h"
#include "tests/optim_test_util.h"

using namespace rh::optim;
using rh::optim::testutil::Case;
using rh::optim::testutil::Rig;

namespace {


// --- option rules ---------------------------------------------------------------------------
struct Invalid {
  const char* name;
  std::function<void(OptimizerConfig&)> set;
  torch::ScalarType param_dtype;
  const char* message;   // a substring the refusal must contain
};

class InvalidOptions : public ::testing::TestWithParam<Invalid> {};

TEST_P(InvalidOptions, RefusedWithItsMessage) {
  OptimizerConfig config;
  GetParam().set(config);
  try {
    validate(config, GetParam().param_dtype);
    FAIL() << "accepted an invalid combination";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().message), std::string::npos) << e.what();
  }
  // The constructor applies the same rules.
  auto p = torch::zeros({3}, GetParam().param_dtype);
  EXPECT_THROW(PrecisionAdam({{"g", {{"p", p}}, 0.0}}, config), std::invalid_argument);
}

const Invalid kInvalid[] = {
    {"bf16_grads_without_pao", [](auto& c) { c.main_grads_dtype = Dtype::bf16; }, torch::kBFloat16,
     "--main-grads-dtype can only be fp32 when not using precision-aware optimizer"},
    {"fp16_master_without_pao", [](auto& c) { c.main_params_dtype = Dtype::fp16; }, torch::kBFloat16,
     "--main-params-dtype can only be fp32 when not using precision-aware optimizer"},
    {"bf16_exp_avg_without_pao", [](auto& c) { c.exp_avg_dtype = Dtype::bf16; }, torch::kBFloat16,
     "--exp-avg-dtype can only be fp32 when not using precision-aware optimizer"},
    {"fp8_exp_avg_sq_without_pao", [](auto& c) { c.exp_avg_sq_dtype = Dtype::fp8; }, torch::kBFloat16,
     "--exp-avg-sq-dtype can only be fp32 when not using precision-aware optimizer"},
    {"fp16_main_grads",
     [](auto& c) {
       c.use_precision_aware_optimizer = true;
       c.main_grads_dtype = Dtype::fp16;
     },
     torch::kBFloat16, "--main-grads-dtype fp16 is not supported (allowed: fp32, bf16)"},
    {"fp8_main_grads",
     [](auto& c) {
       c.use_precision_aware_optimizer = true;
       c.main_grads_dtype = Dtype::fp8;
     },
     torch::kBFloat16, "--main-grads-dtype fp8 is not supported"},
    {"bf16_master",
     [](auto& c) {
       c.use_precision_aware_optimizer = true;
       c.main_params_dtype = Dtype::bf16;
     },
     torch::kBFloat16, "--main-params-dtype bf16 is not supported (allowed: fp32, fp16)"},
    {"fp8_master",
     [](auto& c) {
       c.use_precision_aware_optimizer = true;
       c.main_params_dtype = Dtype::fp8;
     },
     torch::kBFloat16, "--main-params-dtype fp8 is not supported"},
    {"int16_exp_avg",
     [](auto& c) {
       c.use_precision_aware_optimizer = true;
       c.exp_avg_dtype = Dtype::int16;
     },
     torch::kBFloat16, "--exp-avg-dtype int16 is not supported (allowed: fp32, bf16, fp16, fp8)"},
    {"int16_exp_avg_sq",
     [](auto& c) {
       c.use_precision_aware_optimizer = true;
       c.exp_avg_sq_dtype = Dtype::int16;
     },
     torch::kBFloat16, "--exp-avg-sq-dtype int16 is not supported"},
    {"int16_master",
     [](auto& c) {
       c.use_precision_aware_optimizer = true;
       c.main_params_dtype = Dtype::int16;
     },
     torch::kBFloat16, "--main-params-dtype int16 is not supported"},
    {"fp16_params", [](auto&) {}, torch::kHalf, "model params must be fp32 or bf16"},
    {"beta1_one", [](auto& c) { c.beta1 = 1.0; }, torch::kFloat, "beta1 must be in [0, 1)"},
    {"beta2_negative", [](auto& c) { c.beta2 = -0.1; }, torch::kFloat, "beta2 must be in [0, 1)"},
    {"eps_zero", [](auto& c) { c.eps = 0.0; }, torch::kFloat, "eps must be > 0"},
};
INSTANTIATE_TEST_SUITE_P(Rules, InvalidOptions, ::testing::ValuesIn(kInvalid),
                         [](const auto& i) { return std::string(i.param.name); });

TEST(Options, ParseDtype) {
  EXPECT_EQ(parse_dtype("fp8", "--exp-avg-dtype"), Dtype::fp8);
  try {
    parse_dtype("float32", "--exp-avg-dtype");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("--exp-avg-dtype: unknown dtype 'float32'"), std::string::npos);
  }
}

TEST(Options, EffectiveMasterModeIsReportedNotSilentlyChanged) {
  OptimizerConfig config;   // store_param_remainders defaults to true
  EXPECT_EQ(effective_master_mode(config, torch::kBFloat16), MasterMode::fp32) << "needs pao";
  config.use_precision_aware_optimizer = true;
  EXPECT_EQ(effective_master_mode(config, torch::kBFloat16), MasterMode::remainders);
  EXPECT_EQ(effective_master_mode(config, torch::kFloat), MasterMode::fp32) << "needs bf16 params";
  config.main_params_dtype = Dtype::fp16;
  EXPECT_EQ(effective_master_mode(config, torch::kBFloat16), MasterMode::fp16);
  PrecisionAdam opt({{"g", {{"p", torch::zeros({2}, torch::kBFloat16)}}, 0.0}}, config);
  EXPECT_EQ(opt.master_mode(), MasterMode::fp16);
  EXPECT_TRUE(opt.config().store_param_remainders) << "the option itself is left as given";
  EXPECT_EQ(opt.remainders_note(), "store_param_remainders=true NOT in effect (needs fp32 --main-params-dtype)");
  EXPECT_EQ(opt.describe().find("NOT in effect"), std::string::npos) << "the default run prints no warning";
  config.store_param_remainders = false;
  config.main_params_dtype = Dtype::fp32;
  EXPECT_EQ(effective_master_mode(config, torch::kBFloat16), MasterMode::fp32);
}

// --- state access ---------------------------------------------------------------------------
class StateAccess : public ::testing::TestWithParam<Case> {};

TEST_P(StateAccess, SetScaledThenGetUnscaledAppliesStorage) {
  Rig rig(GetParam(), {{"a", {64}, 0, 1, 0}});
  auto& opt = *rig.opt;
  auto x = torch::randn({64}) * 0.01;
  for (auto key : {StateKey::exp_avg, StateKey::exp_avg_sq}) {
    opt.set_scaled_state("a", key, x);
    const auto& stored_state = opt.stored("a", key);
    const Dtype stored_dtype = key == StateKey::exp_avg ? GetParam().exp_avg : GetParam().exp_avg_sq;
    ASSERT_EQ(stored_state.dtype, stored_dtype);
    ASSERT_EQ(stored_state.data.scalar_type(), storage_scalar_type(stored_dtype));
    auto back = opt.get_unscaled_state("a", key);
    if (stored_dtype == Dtype::fp32) {
      EXPECT_TRUE(torch::equal(back, x));
    } else if (stored_dtype == Dtype::bf16) {
      EXPECT_TRUE(torch::equal(back, x.to(torch::kBFloat16).to(torch::kFloat)));
    }
    if (stored_dtype == Dtype::fp16 || stored_dtype == Dtype::fp8) {
      EXPECT_EQ(*stored_state.scale, x.abs().max().item<float>() / (stored_dtype == Dtype::fp8 ? 448.0f : 32752.0f))
          << "set_scaled_state recomputes the scale";
      EXPECT_LE((back - x).abs().max().item<float>(), x.abs().max().item<float>() / 8);
    }
    // get of a set of what get returned is a fixed point (storage is idempotent).
    opt.set_scaled_state("a", key, back);
    EXPECT_TRUE(torch::equal(opt.get_unscaled_state("a", key), back)) << key_name(key);
  }
  // master_param (TE fused_adam.py @d0067d0, set_scaled_state / get_unscaled_state): the model
  // param is never written; an fp16 master is scaled like an fp16 moment; under remainders both
  // take and return the raw int16 remainder, and an fp32 value fails upstream's dtype assertion.
  const auto w_before = opt.param("a").clone();
  const auto& master_state = opt.stored("a", StateKey::master_param);
  switch (GetParam().master) {
    case MasterMode::fp32:
      opt.set_scaled_state("a", StateKey::master_param, x);
      EXPECT_TRUE(torch::equal(opt.get_unscaled_state("a", StateKey::master_param), x));
      EXPECT_FALSE(master_state.scale.has_value()) << "an fp32 master has no scale";
      break;
    case MasterMode::fp16: {
      opt.set_scaled_state("a", StateKey::master_param, x);
      ASSERT_TRUE(master_state.scale.has_value()) << "an fp16 master is scaled like an fp16 moment";
      EXPECT_EQ(*master_state.scale, x.abs().max().item<float>() / 32752.0f);
      EXPECT_FALSE(master_state.scale_inv.has_value());
      auto master_value = opt.get_unscaled_state("a", StateKey::master_param);
      EXPECT_LE(((master_value - x).abs() / x.abs().max()).max().item<float>(), 1.0f / 2048);
      break;
    }
    case MasterMode::remainders: {
      try {
        opt.set_scaled_state("a", StateKey::master_param, x);
        ADD_FAILURE() << "an fp32 value for a remainder master must be refused";
      } catch (const std::invalid_argument& e) {
        EXPECT_NE(std::string(e.what()).find("upstream TransformerEngine fails an assertion"), std::string::npos)
            << e.what();
      }
      auto remainder = torch::randint(-32768, 32768, {64}, torch::kLong).to(torch::kShort);
      opt.set_scaled_state("a", StateKey::master_param, remainder);
      auto back = opt.get_unscaled_state("a", StateKey::master_param);
      EXPECT_EQ(back.scalar_type(), torch::kShort);
      EXPECT_TRUE(torch::equal(back, remainder)) << "the raw int16 remainder in and out";
      break;
    }
  }
  EXPECT_TRUE(torch::equal(opt.param("a"), w_before)) << "set_scaled_state never writes the model param";
}

// Save every stored state, the model params and the step counters after 10 steps; a fresh
// optimizer restored from them must continue exactly as the original (bitwise, 10 more steps).
TEST_P(StateAccess, StoredRoundTripContinuesBitForBit) {
  const auto specs = testutil::small_specs();
  Rig saved_rig(GetParam(), specs, 21);
  for (int s = 0; s < 10; ++s) saved_rig.step(s, 1e-3);
  std::vector<StoredState> saved;
  std::vector<torch::Tensor> weights;
  for (const auto& sp : specs) {
    weights.push_back(saved_rig.opt->param(sp.name).clone());
    for (auto key : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq}) {
      auto stored_state = saved_rig.opt->stored(sp.name, key);
      stored_state.data = stored_state.data.clone();
      saved.push_back(stored_state);
    }
  }
  Rig resumed_rig(GetParam(), specs, 99);   // different init: everything must come from the restore
  EXPECT_FALSE(torch::equal(resumed_rig.opt->param("a"), saved_rig.opt->param("a"))) << "negative control";
  size_t saved_index = 0;
  for (size_t i = 0; i < specs.size(); ++i) {
    resumed_rig.params[i].detach().copy_(weights[i]);
    for (auto key : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq})
      resumed_rig.opt->set_stored(specs[i].name, key, saved[saved_index++]);
  }
  for (size_t g = 0; g < 2; ++g) resumed_rig.opt->set_step_count(g, saved_rig.opt->step_count(g));
  torch::manual_seed(1234);
  for (int s = 10; s < 20; ++s) saved_rig.step(s, 1e-3);
  torch::manual_seed(1234);
  for (int s = 10; s < 20; ++s) resumed_rig.step(s, 1e-3);
  for (const auto& sp : specs) {
    EXPECT_TRUE(torch::equal(saved_rig.opt->param(sp.name), resumed_rig.opt->param(sp.name))) << sp.name;
    for (auto key : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq}) {
      const auto &x = saved_rig.opt->stored(sp.name, key), &y = resumed_rig.opt->stored(sp.name, key);
      EXPECT_TRUE(torch::equal(x.data, y.data)) << sp.name << " " << key_name(key);
      EXPECT_EQ(x.scale, y.scale) << sp.name << " " << key_name(key);
      EXPECT_EQ(x.scale_inv, y.scale_inv) << sp.name << " " << key_name(key);
    }
  }
}

TEST_P(StateAccess, SetStoredValidates) {
  Rig rig(GetParam(), {{"a", {8}, 0, 1, 0}});
  auto& opt = *rig.opt;
  auto expect_msg = [&](StateKey key, StoredState state, const std::string& msg) {
    try {
      opt.set_stored("a", key, state);
      FAIL() << "accepted: " << msg;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("param 'a'"), std::string::npos) << e.what();
    }
  };
  for (auto key : {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq}) {
    const StoredState good = opt.stored("a", key);
    StoredState altered = good;
    altered.dtype = good.dtype == Dtype::fp32 ? Dtype::bf16 : Dtype::fp32;
    expect_msg(key, altered, "is held as " + to_string(good.dtype));
    altered = good;
    altered.data = good.data.to(good.data.scalar_type() == torch::kFloat ? torch::kDouble : torch::kFloat);
    expect_msg(key, altered, "expects data of type");
    altered = good;
    altered.data = torch::zeros({9}, good.data.scalar_type());
    expect_msg(key, altered, "expects shape [8]");
    altered = good;
    altered.scale = altered.scale ? std::nullopt : std::optional<float>(1.0f);
    expect_msg(key, altered, good.scale ? "needs a scale" : "takes no scale");
    if (good.scale) {
      // scale = amax / range is never negative; fp8's scale_inv must be frcp(1/scale).
      altered = good;
      altered.scale = -0.5f;
      expect_msg(key, altered, "is negative");
      altered = good;
      altered.scale = 0.0f;   // an all-zero tensor: upstream's own state, accepted
      if (good.dtype == Dtype::fp8) altered.scale_inv = 0.0f;
      EXPECT_NO_THROW(opt.check_stored("a", key, altered)) << key_name(key);
    }
    if (good.dtype == Dtype::fp8) {
      altered = good;
      altered.scale_inv.reset();
      expect_msg(key, altered, "needs a scale_inv");
      altered = good;
      altered.scale = 0.25f;
      altered.scale_inv = 4.5f;
      expect_msg(key, altered, "does not belong to scale");
    } else {
      altered = good;
      altered.scale_inv = 1.0f;
      expect_msg(key, altered, "takes no scale_inv");
    }
    if (key == StateKey::master_param && good.dtype != Dtype::int16) {
      // An int16 remainder offered to an optimizer without remainders is refused (upstream
      // would silently take the integers as master values).
      altered = StoredState{torch::zeros({8}, torch::kShort), Dtype::int16, std::nullopt, std::nullopt};
      expect_msg(key, altered, "is held as " + to_string(good.dtype) + ", got int16");
    }
    EXPECT_NO_THROW(opt.set_stored("a", key, good));
  }
  EXPECT_THROW(opt.stored("nope", StateKey::exp_avg), std::invalid_argument);
}

std::vector<Case> access_cases() {
  return {{Dtype::fp32, Dtype::bf16, MasterMode::fp32, true, Dtype::fp32, true},
          {Dtype::fp16, Dtype::fp8, MasterMode::fp16, true, Dtype::bf16, true},
          {Dtype::fp8, Dtype::fp16, MasterMode::remainders, false, Dtype::fp32, true},
          {Dtype::bf16, Dtype::fp32, MasterMode::remainders, true, Dtype::bf16, true}};
}
INSTANTIATE_TEST_SUITE_P(Modes, StateAccess, ::testing::ValuesIn(access_cases()),
                         [](const auto& i) { return i.param.name(); });

// --- step counters and grads ------------------------------------------------------------------
TEST(Steps, EveryGroupAdvancesEvenWithoutGradients) {
  auto p = torch::ones({3}, torch::kBFloat16), q = torch::ones({3}, torch::kBFloat16);
  PrecisionAdam opt({{"g0", {{"p", p}}, 0.1}, {"g1", {{"q", q}}, 0.0}}, OptimizerConfig{});
  ASSERT_EQ(opt.num_groups(), 2u);
  EXPECT_EQ(opt.group_name(1), "g1");
  EXPECT_EQ(opt.group_of("q"), 1u);
  p.mutable_grad() = torch::ones({3}, torch::kBFloat16);
  opt.accumulate_grads();
  EXPECT_FALSE(p.grad().defined()) << "param.grad is reset after accumulation";
  opt.step(1e-3);
  opt.step(1e-3);   // the main grad is kept until zero_grads
  EXPECT_EQ(opt.step_count(0), 2);
  EXPECT_EQ(opt.step_count(1), 2);
  EXPECT_TRUE(torch::equal(q, torch::ones({3}, torch::kBFloat16))) << "no grad: untouched";
  EXPECT_TRUE(torch::equal(opt.get_unscaled_state("q", StateKey::exp_avg), torch::zeros({3})));
  EXPECT_FALSE(torch::equal(p, torch::ones({3}, torch::kBFloat16)));
  EXPECT_THROW(opt.step_count(2), std::out_of_range);
  opt.set_step_count(1, 40);
  EXPECT_EQ(opt.step_count(1), 40);
}

TEST(Grads, NormZerosScaleAndAccumulate) {
  OptimizerConfig config;
  config.use_precision_aware_optimizer = true;
  config.main_grads_dtype = Dtype::bf16;
  auto p = torch::zeros({5000}, torch::kBFloat16), q = torch::zeros({7}, torch::kBFloat16);
  PrecisionAdam opt({{"g", {{"p", p}, {"q", q}}, 0.0}}, config);
  torch::manual_seed(2);
  auto g1 = torch::randn({5000}).to(torch::kBFloat16), g2 = torch::randn({5000}).to(torch::kBFloat16);
  g1.index_put_({torch::indexing::Slice(0, 100)}, 0);
  g2.index_put_({torch::indexing::Slice(0, 100)}, 0);
  p.mutable_grad() = g1;
  opt.accumulate_grads();
  p.mutable_grad() = g2;
  opt.accumulate_grads();
  const auto want = (g1.to(torch::kFloat) + g2.to(torch::kFloat)).to(torch::kBFloat16);
  ASSERT_TRUE(torch::equal(opt.main_grad("p"), want)) << "fp32 sum, one RNE to bf16";
  EXPECT_EQ(opt.main_grad("p").scalar_type(), torch::kBFloat16);
  // 100 forced zeros, q's 7, plus any exact cancellations g1 == -g2 (bf16 values collide).
  EXPECT_EQ(opt.count_zeros(), want.eq(0).sum().item<int64_t>() + 7);
  EXPECT_GE(opt.count_zeros(), 107);
  // fp32 accumulation of 5000 squares: within a few fp32 ulps of the double result.
  const double norm = want.to(torch::kDouble).norm().item<double>();
  EXPECT_NEAR(opt.grad_norm(), norm, norm * 1e-5);
  torch::set_num_threads(2);   // the norm's summation order does not depend on threads
  const double norm_with_two_threads = opt.grad_norm();
  torch::set_num_threads(1);
  EXPECT_EQ(opt.grad_norm(), norm_with_two_threads);
  opt.scale_grads(0.5f);
  EXPECT_TRUE(torch::equal(opt.main_grad("p"), (want.to(torch::kFloat) * 0.5).to(torch::kBFloat16)));
  opt.zero_grads();
  EXPECT_EQ(opt.count_zeros(), 5007);
  EXPECT_EQ(opt.grad_norm(), 0.0);
}

}   // namespace

namespace {

// One rank of a group of `size` in a test: all_gather_strings records what this rank sends and
// hands back `world` (every rank's string, this one's in its place).
class AgreeFakeGroup final : public Collectives {
 public:
  AgreeFakeGroup(int rank, std::vector<std::string> world) : rank_(rank), world_(std::move(world)) {}
  int rank() const override { return rank_; }
  int size() const override { return static_cast<int>(world_.size()); }
  void all_reduce_sum(torch::Tensor&) override {}
  void all_reduce_max(torch::Tensor&) override {}
  void all_gather_bytes(const torch::Tensor&, torch::Tensor&) override {}
  std::vector<std::string> all_gather_strings(const std::string& mine) override {
    sent = mine;
    ++calls;
    world_[static_cast<size_t>(rank_)] = mine;
    return world_;
  }
  std::string sent;
  int calls = 0;

 private:
  int rank_;
  std::vector<std::string> world_;
};

// Every rank's Agreement for these outcomes: first what each rank sends (agree is a function of
// its outcome), then each rank's agree over all of it.
std::vector<Agreement> agree_all(const std::vector<RankOutcome>& outcomes) {
  const size_t rank_count = outcomes.size();
  std::vector<std::string> wire(rank_count);
  for (size_t r = 0; r < rank_count; ++r) {
    AgreeFakeGroup group(static_cast<int>(r), std::vector<std::string>(rank_count));
    (void)agree(&group, outcomes[r]);
    wire[r] = group.sent;
  }
  std::vector<Agreement> out;
  for (size_t r = 0; r < rank_count; ++r) {
    AgreeFakeGroup group(static_cast<int>(r), wire);
    out.push_back(agree(&group, outcomes[r]));
    EXPECT_EQ(group.calls, 1) << "one collective per agreement";
  }
  return out;
}

RankOutcome agree_ok(const std::string& payload) {
  RankOutcome outcome;
  outcome.payload = payload;
  return outcome;
}
RankOutcome agree_failed(const std::string& error, bool flag) {
  RankOutcome outcome;
  outcome.ok = false;
  outcome.error = error;
  outcome.flag = flag;
  return outcome;
}

TEST(RankAgreement, AllSucceedEveryRankGetsEveryPayloadInRankOrder) {
  for (const Agreement& agreement : agree_all({agree_ok("a"), agree_ok(""), agree_ok("ok:err:\n")})) {
    EXPECT_TRUE(agreement.ok());
    EXPECT_EQ(agreement.payloads, (std::vector<std::string>{"a", "", "ok:err:\n"}));
  }
}

TEST(RankAgreement, AFailingRankIsNamedWithItsFlagOnEveryRank) {
  const auto all = agree_all({agree_ok("p0"), agree_failed("disk full", true), agree_failed("later", false)});
  for (const Agreement& agreement : all) {
    EXPECT_FALSE(agreement.ok());
    EXPECT_EQ(agreement.failed_rank, 1);   // the first failure in rank order
    EXPECT_EQ(agreement.error, "disk full");
    EXPECT_TRUE(agreement.flag);
    EXPECT_EQ(agreement.failure(), "rank 1: disk full");
    EXPECT_TRUE(agreement.payloads.empty());
  }
  const auto unflagged = agree_all({agree_failed("refused", false), agree_ok("p1")});
  EXPECT_EQ(unflagged[1].failure(), "rank 0: refused");
  EXPECT_FALSE(unflagged[1].flag);
}

TEST(RankAgreement, WithoutAGroupNothingIsSent) {
  const Agreement ok = agree(nullptr, agree_ok("{\"k\": 1}"));
  EXPECT_TRUE(ok.ok());
  EXPECT_EQ(ok.payloads, (std::vector<std::string>{"{\"k\": 1}"}));
  const Agreement failed = agree(nullptr, agree_failed("bad input", true));
  EXPECT_EQ(failed.failure(), "rank 0: bad input");
  EXPECT_TRUE(failed.flag);
}

}   // namespace
