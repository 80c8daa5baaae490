// Sigmoid routing with an expert bias (aux-loss-free balancing) against slow per-token references:
//  - moe_utils.py topk_routing_with_score_function (sigmoid): scores = sigmoid(logits); the
//    experts are the top-k of scores + expert_bias; the gate weights are the unbiased scores of
//    those experts divided by (their sum + 1e-20) when K > 1;
//  - router.py routing: the token counter adds each training forward's token-expert pairs per
//    expert (not in eval or without grad mode), so it sums over micro-batches;
//  - the buffer is persistent (registered, saved with the weights), the counter is not;
//  - transformer_config.py: expert bias with softmax scoring is refused.
// The update rule itself (get_updated_expert_bias) is the trainer's: tests/train/test_expert_bias.cpp.
#include <algorithm>
#include <cmath>
#include <numeric>

#include "tests/model_test_util.h"

namespace rh::models::testing {
namespace {

ModelConfig sigmoid_config() {
  ModelConfig cfg;
  cfg.param_dtype = "fp32";
  cfg.compute = "fp32";
  cfg.score_function = "sigmoid";
  cfg.enable_expert_bias = true;
  cfg.n_experts = 6;
  cfg.top_k = 3;
  return cfg;
}

uint32_t fbits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// moe_utils.py compute_routing_scores_for_aux_loss: the load-balancing loss weighs
// sigmoid(logits) / (sum + 1e-20) (for every K, K = 1 included) by token counts from the top-k
// of those unbiased scores; the expert bias changes the routing, never the loss. Reference in
// double from the logits, per token.
TEST(SigmoidRouting, AuxLossCountsTheUnbiasedTopKOfNormalisedScores) {
  torch::set_num_threads(1);
  for (int64_t K : {1, 3}) {
    auto cfg = sigmoid_config();
    cfg.top_k = K;
    cfg.aux_loss_coeff = 1e-2;
    auto model = build(cfg, 7);
    MoELayer moe = model->layers[0]->moe;
    moe->eval();
    auto g = at::detail::createCPUGenerator(11);
    auto x = torch::randn({40, cfg.d_model}, g);
    {
      torch::NoGradGuard ng;
      moe->expert_bias.copy_(torch::tensor({0.3f, -0.2f, 0.0f, 0.25f, -0.1f, 0.05f}));
    }
    auto r = moe->route(x, nullptr);
    auto logits = r.logits.to(torch::kDouble).contiguous();
    const int64_t N = x.size(0), E = cfg.n_experts;
    std::vector<double> prob_sum(E, 0.0), tokens(E, 0.0), routed(E, 0.0);
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> s(E);
      double total = 0.0;
      for (int64_t e = 0; e < E; ++e) total += s[e] = 1.0 / (1.0 + std::exp(-logits[n][e].item<double>()));
      for (int64_t e = 0; e < E; ++e) prob_sum[e] += s[e] / (total + 1e-20);
      std::vector<int64_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return s[a] > s[b]; });
      for (int64_t j = 0; j < K; ++j) tokens[order[j]] += 1.0;
      for (int64_t j = 0; j < K; ++j) routed[r.top_idx[n][j].item<int64_t>()] += 1.0;
    }
    double want = 0.0;
    for (int64_t e = 0; e < E; ++e) want += prob_sum[e] * tokens[e];
    want *= double(E) * cfg.aux_loss_coeff / (double(K) * double(N) * double(N));
    EXPECT_NE(tokens, routed) << "K=" << K << ": the bias must change the routing for this test to mean anything";
    EXPECT_NEAR(r.aux_loss.item<double>(), want, 1e-6 * want) << "K=" << K;
  }
}

TEST(SigmoidRouting, ChoosesByBiasedScoresWeighsByUnbiasedOnesLikeAPerTokenLoop) {
  torch::set_num_threads(1);
  auto cfg = sigmoid_config();
  auto model = build(cfg, 7);
  MoELayer moe = model->layers[0]->moe;
  moe->eval();
  auto g = at::detail::createCPUGenerator(11);
  auto x = torch::randn({40, cfg.d_model}, g);
  {
    torch::NoGradGuard ng;   // a bias that changes choices: large against the score spread
    moe->expert_bias.copy_(torch::tensor({0.3f, -0.2f, 0.0f, 0.25f, -0.1f, 0.05f}));
  }
  auto r = moe->route(x, nullptr);
  auto logits = r.logits.contiguous();
  auto bias = moe->expert_bias.contiguous();
  const int64_t N = x.size(0), E = cfg.n_experts, K = cfg.top_k;
  int64_t changed_by_bias = 0;
  for (int64_t n = 0; n < N; ++n) {
    std::vector<float> score(E), routing(E);
    for (int64_t e = 0; e < E; ++e) {
      const float l = logits[n][e].item<float>();
      score[e] = 1.0f / (1.0f + std::exp(-l));
      routing[e] = score[e] + bias[e].item<float>();
    }
    std::vector<int64_t> order(E), plain(E);
    std::iota(order.begin(), order.end(), 0);
    plain = order;
    std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return routing[a] > routing[b]; });
    std::stable_sort(plain.begin(), plain.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
    std::vector<int64_t> want(order.begin(), order.begin() + K), got(K);
    for (int64_t j = 0; j < K; ++j) got[j] = r.top_idx[n][j].item<int64_t>();
    EXPECT_EQ(got, want) << "token " << n;
    changed_by_bias += !std::equal(want.begin(), want.end(), plain.begin());
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) sum += score[want[j]];
    for (int64_t j = 0; j < K; ++j) {
      const float want_p = score[want[j]] / (sum + 1e-20f);
      // the score is torch's sigmoid, compared within 1 ulp of libm's; the weight then bitwise
      const float got_p = r.top_probs[n][j].item<float>();
      EXPECT_NEAR(got_p, want_p, 4e-7f * std::abs(want_p)) << "token " << n << " slot " << j;
    }
  }
  EXPECT_GT(changed_by_bias, 0) << "the bias changed no choice: the test would not see it ignored";
}

TEST(SigmoidRouting, GateWeightsAreTheUnbiasedScoresNormalisedBitForBit) {
  auto cfg = sigmoid_config();
  auto model = build(cfg, 7);
  MoELayer moe = model->layers[0]->moe;
  moe->eval();
  auto x = torch::randn({16, cfg.d_model}, at::detail::createCPUGenerator(3));
  {
    torch::NoGradGuard ng;
    moe->expert_bias.copy_(torch::tensor({0.0f, 0.5f, -0.5f, 0.0f, 0.2f, 0.0f}));
  }
  auto r = moe->route(x, nullptr);
  auto scores = torch::sigmoid(r.logits);
  for (int64_t n = 0; n < 16; ++n) {
    float sum = 0.0f;
    for (int64_t j = 0; j < cfg.top_k; ++j) sum += scores[n][r.top_idx[n][j].item<int64_t>()].item<float>();
    for (int64_t j = 0; j < cfg.top_k; ++j) {
      const float s = scores[n][r.top_idx[n][j].item<int64_t>()].item<float>();
      EXPECT_EQ(fbits(r.top_probs[n][j].item<float>()), fbits(s / (sum + 1e-20f))) << n << "," << j;
    }
  }
}

TEST(ExpertBiasState, CounterSumsTrainingForwardsOnlyAndOnlyTheBiasIsPersistent) {
  auto cfg = sigmoid_config();
  auto model = build(cfg, 7);
  auto states = model->expert_bias_states();
  ASSERT_EQ(states.size(), static_cast<size_t>(cfg.n_layers));
  std::vector<std::string> buffers;
  for (const auto& b : model->named_buffers(true)) buffers.push_back(b.key());
  EXPECT_EQ(buffers, (std::vector<std::string>{"layers.0.moe.router.expert_bias", "layers.1.moe.router.expert_bias"}));
  for (const auto& s : states) {
    EXPECT_EQ(s.expert_bias.scalar_type(), torch::kFloat);
    EXPECT_EQ(s.local_tokens_per_expert.scalar_type(), torch::kFloat);
  }
  model->train();
  auto tg = at::detail::createCPUGenerator(5);
  auto gen = at::detail::createCPUGenerator(6);
  auto tokens = torch::randint(cfg.vocab_size, {2, cfg.seq_len}, gen);
  auto targets = torch::randint(cfg.vocab_size, {2, cfg.seq_len}, gen);
  std::vector<int64_t> total(cfg.n_experts, 0);
  for (int micro = 0; micro < 2; ++micro) {
    auto out = model->loss(tokens, targets, &tg);
    for (int64_t e = 0; e < cfg.n_experts; ++e) total[e] += out.tokens_per_expert[e];
  }
  {
    torch::NoGradGuard ng;   // no counting without grad mode (upstream: torch.is_grad_enabled())
    model->loss(tokens, targets, &tg);
  }
  model->eval();
  model->loss(tokens, targets, nullptr);   // nor in eval
  for (int64_t e = 0; e < cfg.n_experts; ++e) {
    float sum = 0;
    for (const auto& s : states) sum += s.local_tokens_per_expert[e].item<float>();
    EXPECT_EQ(sum, static_cast<float>(total[e])) << "expert " << e;
  }
}

TEST(ExpertBiasState, WithSoftmaxScoringIsRefusedAsUpstreamDoes) {
  ModelConfig cfg;
  cfg.enable_expert_bias = true;   // score_function softmax
  try {
    validate_config(cfg);
    ADD_FAILURE() << "accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("only supports sigmoid score function"), std::string::npos) << e.what();
  }
  cfg.score_function = "sparsemax";
  cfg.enable_expert_bias = false;
  EXPECT_THROW(validate_config(cfg), std::invalid_argument);
}

}   // namespace
}   // namespace rh::models::testing
