// Tests of the MoE layer on its own: the router's top-k and losses on a hand-computed case, the
// dropless dispatch against a per-token loop reference, and experts that receive no tokens.
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/python_reference.h"
#include "tests/model_test_util.h"

namespace rh::models::testing {
namespace {

class MoELayerTest : public ::testing::TestWithParam<NumericsCase> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  MoELayer make_layer(const ModelConfig& cfg, uint64_t seed) {
    auto model = build(cfg, seed);   // initialized layers; keep only the first block's MoE
    return model->layers[0]->moe;
  }
};

// Router weight = identity, so the logits are the inputs; every number below follows from them.
TEST_P(MoELayerTest, RouterTopKAndLossesMatchHandComputedCase) {
  ModelConfig cfg = config_for(GetParam());
  cfg.d_model = 4;
  cfg.n_heads = 2;
  cfg.aux_loss_coeff = 1e-2;
  cfg.z_loss_coeff = 1e-3;
  auto moe = make_layer(cfg, 1);
  {
    torch::NoGradGuard ng;
    moe->router->weight.copy_(torch::eye(4));
  }
  auto x = torch::tensor({1.0f, 2.0f, 3.0f, 4.0f, 0.5f, -1.0f, 2.0f, 0.0f, 0.0f, 1.0f, -2.0f, 3.0f})
               .view({3, 4})
               .to(moe->num.compute_dtype);
  auto r = moe->route(x, nullptr);

  const std::vector<int64_t> want_idx = {3, 2, 2, 0, 3, 1};   // descending logit order per token
  auto idx = r.top_idx.contiguous();
  ASSERT_EQ(idx.sizes(), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(std::vector<int64_t>(idx.data_ptr<int64_t>(), idx.data_ptr<int64_t>() + 6), want_idx);
  EXPECT_EQ(r.tokens_per_expert, (std::vector<int64_t>{1, 1, 2, 2}));
  ASSERT_EQ(r.logits.scalar_type(), torch::kFloat);

  // Softmax over the two chosen logits: p0 = sigmoid(gap). Gaps: 1, 1.5, 2.
  const double gaps[3] = {1.0, 1.5, 2.0};
  auto probs = r.top_probs.contiguous();
  for (int n = 0; n < 3; ++n) {
    const double p0 = 1.0 / (1.0 + std::exp(-gaps[n]));
    // fp32 softmax of two O(1) values: a few ulps (1e-7 relative) from the double result.
    EXPECT_NEAR(probs[n][0].item<float>(), p0, 1e-6);
    EXPECT_NEAR(probs[n][1].item<float>(), 1.0 - p0, 1e-6);
  }
  // aux = E*c/(K*N^2) * sum_e P_e * tokens_e = 0.012292614189286451 (double, by hand from the
  // full softmaxes of the rows above); z = 1e-3 * mean(lse^2) = 0.011761927981181832.
  const double want = 0.012292614189286451 + 0.011761927981181832;
  // fp32 softmax/logsumexp/sums over 12 values: relative error well under 1e-6.
  EXPECT_NEAR(r.aux_loss.item<float>(), want, 1e-6 * want);

  // The same case with the z-loss off isolates the load-balancing term.
  moe->z_loss_coeff = 0.0;
  EXPECT_NEAR(moe->route(x, nullptr).aux_loss.item<float>(), 0.012292614189286451, 1e-8);
}

// The z-loss in the router logits' dtype (moe_utils.py z_loss_func, router.py gating), against
// an independent numpy computation of upstream's ops (tests/megatron_reference.py): bf16 logits
// (a bf16 model with --moe-router-dtype none) give the bf16 result bit for bit; fp32 and fp64
// logits give theirs within 2 ulps (the order of a float sum over 4-8 values may differ).
const nlohmann::json& megatron_reference() {
  return rh::testing::python_reference("megatron_reference.py", "megatron_reference_moe.json");
}

TEST_P(MoELayerTest, ZLossIsComputedInTheRouterLogitsDtype) {
  size_t checked = 0;
  for (const auto& c : megatron_reference().at("z_loss")) {
    const std::string dtype = c.at("dtype");
    const bool bf16_model = GetParam().param_dtype == "bf16";
    // Which router dtype gives logits of this dtype in this model.
    std::string router_dtype = dtype == "fp64" ? "fp64" : "fp32";
    if (dtype == "bf16") {
      if (!bf16_model) continue;
      router_dtype = "none";
    }
    const auto rows = c.at("rows").get<std::vector<std::vector<double>>>();
    const int64_t N = static_cast<int64_t>(rows.size()), E = static_cast<int64_t>(rows[0].size());
    ModelConfig cfg = config_for(GetParam());
    cfg.d_model = E;
    cfg.n_heads = 2;
    cfg.n_experts = E;
    cfg.aux_loss_coeff = 0.0;   // isolate the z-loss
    cfg.z_loss_coeff = c.at("coeff");
    cfg.router_dtype = router_dtype;
    auto moe = make_layer(cfg, 1);
    {
      torch::NoGradGuard ng;
      moe->router->weight.copy_(torch::eye(E));
    }
    std::vector<float> flat;
    for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
    auto x = torch::tensor(flat).view({N, E}).to(moe->num.compute_dtype);
    const float got = moe->route(x, nullptr).aux_loss.item<float>();
    const std::string what = std::string(c.at("case")) + " " + dtype + " router_dtype " + router_dtype;
    if (dtype == "bf16") {
      EXPECT_EQ(float_bits(got), c.at("z_bits").get<uint32_t>()) << what << ": got " << got;
    } else {
      double want;
      if (dtype == "fp64") {
        const uint64_t u = c.at("z_bits64");
        std::memcpy(&want, &u, 8);
      } else {
        const uint32_t u = c.at("z_bits");
        float f;
        std::memcpy(&f, &u, 4);
        want = f;
      }
      EXPECT_NEAR(got, want, 2 * std::abs(want) * 1.2e-7) << what;
    }
    ++checked;
  }
  EXPECT_GE(checked, 4u);
}

// The bf16 z-loss is not the fp32 one: a bf16 model with --moe-router-dtype none differs from
// one with fp32 router logits (the rule this pins; before, both were computed in fp32).
TEST(MoEZLoss, Bf16AndFp32RouterDtypesDiffer) {
  const auto& ref = megatron_reference().at("z_loss");
  size_t pairs = 0;
  for (const auto& c : ref) {
    if (c.at("dtype") != "bf16") continue;
    for (const auto& d : ref) {
      if (d.at("dtype") != "fp32" || d.at("case") != c.at("case")) continue;
      EXPECT_NE(c.at("z_bits").get<uint32_t>(), d.at("z_bits").get<uint32_t>()) << c.at("case");
      ++pairs;
    }
  }
  EXPECT_GE(pairs, 2u);
}

// Slow, obvious reference: a per-token loop decides which rows each expert sees (in token, slot
// order) and puts results back per token. Each expert's rows are run as one batch, as the layer
// does: OpenBLAS may round a 1-row matmul differently from a many-row one in the last bit, so a
// per-row expert call would test BLAS, not the dispatch.
torch::Tensor reference_dispatch(MoELayer& moe, const torch::Tensor& x, const RouterOutput& r) {
  const int64_t N = x.size(0), K = moe->top_k, E = moe->n_experts;
  auto idx = r.top_idx.contiguous();
  std::vector<std::vector<std::pair<int64_t, int64_t>>> pairs(E);   // expert -> (token, slot)
  for (int64_t n = 0; n < N; ++n)
    for (int64_t j = 0; j < K; ++j) pairs[idx[n][j].item<int64_t>()].push_back({n, j});
  std::vector<torch::Tensor> y(N * K);   // pair n*K + j -> expert output row (C)
  for (int64_t e = 0; e < E; ++e) {
    if (pairs[e].empty()) continue;
    std::vector<torch::Tensor> rows;
    for (auto [n, j] : pairs[e]) rows.push_back(x[n]);
    auto ye = moe->experts[e]->forward(torch::stack(rows));
    for (size_t i = 0; i < pairs[e].size(); ++i) y[pairs[e][i].first * K + pairs[e][i].second] = ye[i];
  }
  std::vector<torch::Tensor> out;
  for (int64_t n = 0; n < N; ++n) {
    auto acc = y[n * K].to(torch::kFloat) * r.top_probs[n][0];
    for (int64_t j = 1; j < K; ++j) acc = acc + y[n * K + j].to(torch::kFloat) * r.top_probs[n][j];
    out.push_back(moe->num.act(acc));
  }
  return torch::stack(out);
}

TEST_P(MoELayerTest, DispatchMatchesPerTokenReferenceBitwise) {
  for (int64_t top_k : {1, 2, 3}) {
    ModelConfig cfg = config_for(GetParam());
    cfg.top_k = top_k;
    auto moe = make_layer(cfg, 11);
    auto g = cpu_gen(5);
    auto x = torch::randn({37, cfg.d_model}, g).to(moe->num.compute_dtype);   // odd N
    auto r = moe->route(x, nullptr);
    auto got = moe->dispatch(x, r);
    auto want = reference_dispatch(moe, x, r);
    EXPECT_EQ(got.scalar_type(), moe->num.compute_dtype);
    EXPECT_TRUE(same_bits(got, want)) << "top_k=" << top_k << " max |diff| "
                                      << (got.to(torch::kFloat) - want.to(torch::kFloat)).abs().max().item<float>();
  }
}

// Positive inputs and a router row that is negative everywhere: expert 3's logit is always the
// lowest, so with top-2 of 4 it never receives a token and must not be run.
TEST_P(MoELayerTest, ExpertWithoutTokensIsNotRunAndGetsNoGrad) {
  ModelConfig cfg = config_for(GetParam());
  auto moe = make_layer(cfg, 3);
  auto g = cpu_gen(9);
  {
    torch::NoGradGuard ng;
    auto w = torch::rand({4, cfg.d_model}, g) + 0.1;
    w[3] = -w[3];
    moe->router->weight.copy_(w);
  }
  auto x = (torch::rand({24, cfg.d_model}, g) + 0.1).to(moe->num.compute_dtype);
  auto [y, r] = moe->forward(x, nullptr);
  ASSERT_EQ(r.tokens_per_expert[3], 0);
  (y.to(torch::kFloat).sum() + r.aux_loss).backward();
  for (int64_t e = 0; e < 4; ++e) {
    for (auto& p : moe->experts[e]->named_parameters()) {
      EXPECT_EQ(p.value().grad().defined(), r.tokens_per_expert[e] > 0)
          << "expert " << e << " " << p.key() << " tokens " << r.tokens_per_expert[e];
    }
  }
  EXPECT_TRUE(moe->router->weight.grad().defined());
}

// Router jitter draws only from the generator handed in: same generator state, same routing;
// the global generator is never touched.
TEST_P(MoELayerTest, RouterJitterDrawsOnlyFromGivenGenerator) {
  ModelConfig cfg = config_for(GetParam());
  cfg.router_jitter = 0.3;
  auto moe = make_layer(cfg, 2);
  moe->train();
  auto g = cpu_gen(4);
  auto x = torch::randn({64, cfg.d_model}, g).to(moe->num.compute_dtype);
  auto global_before = at::detail::getDefaultCPUGenerator().get_state();
  auto g1 = cpu_gen(21), g2 = cpu_gen(21), g3 = cpu_gen(22);
  auto a = moe->route(x, &g1).logits, b = moe->route(x, &g2).logits, c = moe->route(x, &g3).logits;
  EXPECT_TRUE(same_bits(a, b));
  EXPECT_FALSE(same_bits(a, c));   // negative control: the jitter is really applied
  EXPECT_TRUE(same_bits(global_before, at::detail::getDefaultCPUGenerator().get_state()));
  moe->eval();   // no jitter in eval: no generator needed, logits are plain x W^T
  EXPECT_TRUE(same_bits(moe->route(x, nullptr).logits,
                        torch::linear(x.to(torch::kFloat), moe->router->weight.to(torch::kFloat))));
  moe->train();
  EXPECT_THROW(moe->route(x, nullptr), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Numerics, MoELayerTest, ::testing::ValuesIn(numerics_cases()), case_name);

}   // namespace
}   // namespace rh::models::testing
