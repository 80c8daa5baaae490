// The expert-bias update against a slow reference of Megatron's rule (moe_utils.py
// get_updated_expert_bias, called once per iteration by finalize_model_grads.py
// _update_router_expert_bias): average = sum / E, bias += sign(average - tokens) * rate in fp32;
// in the trainer the counters are zeroed after it, and on resume a restored bias continues
// identically while a skipped restore (the bias left at its fresh 0) does not.
#include <gtest/gtest.h>

#include <ATen/CPUGeneratorImpl.h>

#include <cstring>

#include "harness/train/env.h"
#include "harness/train/trainer.h"

namespace {

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

TEST(ExpertBiasUpdate, MatchesASlowPerExpertLoopBitForBit) {
  auto g = at::detail::createCPUGenerator(9);
  for (int trial = 0; trial < 50; ++trial) {
    const int64_t L = 1 + trial % 3, E = 2 + trial % 7;
    auto tokens = torch::randint(0, 40, {L, E}, g).to(torch::kFloat);
    if (trial % 5 == 0) tokens.fill_(7);   // every expert at the average: sign 0, no change
    auto bias = (torch::randn({L, E}, g) * 1e-2).to(torch::kFloat);
    const double rate = trial % 2 ? 1e-3 : 3.7e-4;
    auto got = rh::updated_expert_bias(tokens, bias, rate).contiguous();
    for (int64_t l = 0; l < L; ++l) {
      float sum = 0;
      for (int64_t e = 0; e < E; ++e) sum += tokens[l][e].item<float>();
      const float average = sum / static_cast<float>(E);
      for (int64_t e = 0; e < E; ++e) {
        const float offset = average - tokens[l][e].item<float>();
        const float sign = offset > 0 ? 1.0f : (offset < 0 ? -1.0f : 0.0f);
        const float want = bias[l][e].item<float>() + sign * static_cast<float>(rate);
        EXPECT_EQ(fbits(got[l][e].item<float>()), fbits(want)) << "trial " << trial << " l " << l << " e " << e;
      }
    }
  }
}

rh::RunConfig config() {
  rh::RunConfig cfg;
  cfg.model.d_model = 64;
  cfg.model.ffn_hidden = 64;
  cfg.model.seq_len = 32;
  cfg.model.vocab_size = 64;
  cfg.model.score_function = "sigmoid";
  cfg.model.enable_expert_bias = true;
  cfg.train.global_batch = 8;
  cfg.train.micro_batch = 4;   // two micro-batches: the counter sums both
  cfg.train.iterations = 6;
  cfg.train.lr_decay_iters = 6;
  return cfg;
}

std::vector<float> flat_bias(rh::models::CausalLM& m) {
  std::vector<float> out;
  for (const auto& s : m.expert_bias_states()) {
    auto b = s.expert_bias.contiguous();
    out.insert(out.end(), b.data_ptr<float>(), b.data_ptr<float>() + b.numel());
  }
  return out;
}

TEST(ExpertBiasInTrainer, MovesByTheRateEachIterationAndZeroesTheCounters) {
  rh::configure_determinism(1);
  auto cfg = config();
  rh::Trainer t(cfg);
  const float r = static_cast<float>(cfg.model.bias_update_rate);
  t.train_iteration();
  int moved = 0;
  for (float b : flat_bias(t.model())) {   // from 0: exactly -rate, 0 or +rate
    EXPECT_TRUE(fbits(b) == fbits(r) || fbits(b) == fbits(-r) || b == 0.0f) << b;
    moved += b != 0.0f;
  }
  EXPECT_GT(moved, 0);
  for (const auto& s : t.model().expert_bias_states())
    EXPECT_EQ(s.local_tokens_per_expert.abs().sum().item<float>(), 0.0f);
}

TEST(ExpertBiasInTrainer, RestoredBiasContinuesIdenticallyAndASkippedRestoreDoesNot) {
  rh::configure_determinism(1);
  auto cfg = config();
  rh::Trainer a(cfg), c(cfg), e(cfg);
  for (auto* t : {&a, &c, &e})
    for (int i = 0; i < 3; ++i) t->train_iteration();
  ASSERT_EQ(flat_bias(c.model()), flat_bias(a.model()));
  const auto st = a.state();
  const auto next = a.train_iteration();
  c.set_state(st);
  const auto mc = c.train_iteration();
  EXPECT_EQ(fbits(mc.lm_loss), fbits(next.lm_loss));
  EXPECT_EQ(flat_bias(c.model()), flat_bias(a.model()));
  e.set_state(st);
  {
    torch::NoGradGuard ng;   // skip_expert_bias_restore: the bias at its fresh value
    for (auto& s : e.model().expert_bias_states()) s.expert_bias.zero_();
  }
  const auto me = e.train_iteration();
  EXPECT_NE(flat_bias(e.model()), flat_bias(a.model()));
  EXPECT_NE(fbits(me.lm_loss), fbits(next.lm_loss)) << "the bias changes which experts are chosen";
}

}   // namespace
