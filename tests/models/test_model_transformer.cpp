// Tests of the whole MoE transformer: shapes and names, causality, RoPE against the cos/sin
// formula, seeded init, determinism with dropout and jitter on, grads in the param dtype, an
// expert left without tokens, and config/input validation messages.
#include <cmath>
#include <set>

#include "tests/model_test_util.h"

namespace rh::models::testing {
namespace {

class TransformerTest : public ::testing::TestWithParam<NumericsCase> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
};

TEST_P(TransformerTest, ShapesNamesAndParameterCount) {
  const ModelConfig cfg = config_for(GetParam());
  auto model = build(cfg, 1);
  model->eval();
  const int64_t B = 3, T = 17;   // odd sizes, T < seq_len
  auto out = model->forward(random_tokens(B, T, cfg.vocab_size, 2), nullptr);
  EXPECT_EQ(out.logits.sizes(), (std::vector<int64_t>{B, T, cfg.vocab_size}));
  EXPECT_EQ(out.logits.scalar_type(), torch::kFloat);
  EXPECT_EQ(out.aux_loss.dim(), 0);
  int64_t routed = 0;
  for (auto c : out.tokens_per_expert) routed += c;
  EXPECT_EQ(out.tokens_per_expert.size(), size_t(cfg.n_experts));
  EXPECT_EQ(routed, cfg.n_layers * B * T * cfg.top_k);

  const int64_t C = cfg.d_model, F = cfg.ffn_hidden, E = cfg.n_experts, V = cfg.vocab_size;
  const int64_t per_layer = 2 * C + 4 * C * C + E * C + E * 3 * F * C;
  EXPECT_EQ(model->num_parameters(), 2 * V * C + C + cfg.n_layers * per_layer);
  EXPECT_EQ(model->num_parameters(), 984704);   // the default is the ~1M model model.h promises

  std::set<std::string> names;
  const auto want_dtype = cfg.param_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat;
  for (auto& p : model->named_parameters()) {
    names.insert(p.key());
    EXPECT_EQ(p.value().scalar_type(), want_dtype) << p.key();
  }
  for (const char* n : {"embedding.weight", "layers.0.attention_norm.weight", "layers.0.attention.qkv.weight",
                        "layers.1.attention.proj.weight", "layers.0.moe_norm.weight", "layers.0.moe.router.weight",
                        "layers.1.moe.experts.3.fc1.weight", "layers.0.moe.experts.1.fc2.weight", "final_norm.weight",
                        "lm_head.weight"})
    EXPECT_EQ(names.count(n), 1u) << n;
  EXPECT_EQ(names.size(), size_t(3 + cfg.n_layers * (5 + 2 * E)));
  EXPECT_NE(model->describe().find("params=984704"), std::string::npos) << model->describe();
}

// Changing token t may change logits at positions >= t only; earlier ones stay bit-identical.
TEST_P(TransformerTest, FutureTokensNeverChangeEarlierLogits) {
  const ModelConfig cfg = config_for(GetParam());
  auto model = build(cfg, 3);
  model->eval();
  const int64_t B = 2, T = 24;
  auto tokens = random_tokens(B, T, cfg.vocab_size, 4);
  auto base = model->logits(tokens, nullptr);
  for (int64_t t : {0, 9, 23}) {
    auto changed = tokens.clone();
    changed.select(1, t).add_(1).remainder_(cfg.vocab_size);
    auto logits = model->logits(changed, nullptr);
    // Bit for bit where outputs are bf16-rounded. With fp32 outputs the earlier logits may move
    // by a few ULP without any leak: changing token t re-routes it, so each expert's GEMM gets
    // another number of rows, and OpenBLAS's sgemm result for a row can depend on the row count
    // (edge tiles use other micro-kernels). Seen on an AVX-512 EPYC with OpenBLAS 0.3.21: 2.7e-7
    // on logits of magnitude ~1. A causal leak moves them by orders of magnitude more.
    const auto early = logits.narrow(1, 0, t), early_base = base.narrow(1, 0, t);
    if (t > 0 && cfg.param_dtype == "fp32") {
      const double tol = 8 * std::ldexp(1.0, -23) * (1.0 + early_base.abs().max().item<double>());
      EXPECT_LE((early.to(torch::kDouble) - early_base.to(torch::kDouble)).abs().max().item<double>(), tol)
          << "changed position " << t;
    } else {
      EXPECT_TRUE(same_bits(early, early_base)) << "changed position " << t;
    }
    EXPECT_FALSE(same_bits(logits.select(1, t), base.select(1, t))) << "change at " << t << " had no effect";
  }
}

// Position 0 is the identity; every other position follows the rotate-half formula with
// angle t * theta^(-2i/D).
TEST(Rope, MatchesDirectCosSinFormula) {
  const int64_t B = 2, H = 3, T = 9, D = 8;
  const double theta = 10000.0;
  auto rope = make_rope_tables(16, D, theta, torch::kCPU);
  auto g = cpu_gen(8);
  auto x = torch::randn({B, H, T, D}, g);
  auto y = apply_rope(x, rope);
  EXPECT_TRUE(same_bits(y.narrow(2, 0, 1), x.narrow(2, 0, 1)));
  auto xa = x.accessor<float, 4>();
  auto ya = y.accessor<float, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t t = 0; t < T; ++t)
        for (int64_t i = 0; i < D / 2; ++i) {
          const double a = double(t) * std::pow(theta, -2.0 * double(i) / double(D));
          const double x1 = xa[b][h][t][i], x2 = xa[b][h][t][i + D / 2];
          // fp32 table entries and fp32 products/sums: a few ulps of |x1| + |x2|.
          const double tol = 4 * 1.2e-7 * (std::abs(x1) + std::abs(x2));
          EXPECT_NEAR(ya[b][h][t][i], x1 * std::cos(a) - x2 * std::sin(a), tol);
          EXPECT_NEAR(ya[b][h][t][i + D / 2], x2 * std::cos(a) + x1 * std::sin(a), tol);
        }
}

// The determinism the harness builds on: same seed -> same bits everywhere, with dropout, router
// jitter and the z-loss all on, drawing only from the generator handed to loss().
TEST_P(TransformerTest, SameSeedSameBitsWithDropoutAndJitter) {
  ModelConfig cfg = config_for(GetParam());
  cfg.dropout = 0.1;
  cfg.router_jitter = 0.1;
  cfg.z_loss_coeff = 1e-3;
  auto tokens = random_tokens(4, 33, cfg.vocab_size, 6);
  auto in = tokens.narrow(1, 0, 32), tg = tokens.narrow(1, 1, 32);
  auto global_before = at::detail::getDefaultCPUGenerator().get_state();

  auto run = [&](uint64_t model_seed, uint64_t gen_seed) {
    auto model = build(cfg, model_seed);
    model->train();
    auto gen = cpu_gen(gen_seed);
    auto out = model->loss(in, tg, &gen);
    (out.lm_loss + out.aux_loss).backward();
    return std::make_tuple(model, out);
  };
  auto [m1, o1] = run(17, 5);
  auto [m2, o2] = run(17, 5);
  EXPECT_EQ(float_bits(o1.lm_loss.item<float>()), float_bits(o2.lm_loss.item<float>()));
  EXPECT_EQ(float_bits(o1.aux_loss.item<float>()), float_bits(o2.aux_loss.item<float>()));
  EXPECT_EQ(o1.tokens_per_expert, o2.tokens_per_expert);
  auto p1 = m1->named_parameters(), p2 = m2->named_parameters();
  for (auto& p : p1) {
    EXPECT_TRUE(same_bits(p.value(), p2[p.key()])) << p.key();
    ASSERT_EQ(p.value().grad().defined(), p2[p.key()].grad().defined()) << p.key();
    if (p.value().grad().defined()) {
      EXPECT_TRUE(same_bits(p.value().grad(), p2[p.key()].grad())) << p.key();
    }
  }
  // Negative control: another dropout/jitter stream gives another loss.
  auto [m3, o3] = run(17, 6);
  EXPECT_NE(float_bits(o1.lm_loss.item<float>()), float_bits(o3.lm_loss.item<float>()));
  EXPECT_TRUE(same_bits(global_before, at::detail::getDefaultCPUGenerator().get_state()))
      << "the model drew from the global generator";
  // Eval: no dropout, no generator needed, and repeated calls agree.
  m1->eval();
  auto e1 = m1->loss(in, tg, nullptr).lm_loss, e2 = m1->loss(in, tg, nullptr).lm_loss;
  EXPECT_TRUE(same_bits(e1, e2));
  m1->train();
  EXPECT_THROW(m1->loss(in, tg, nullptr), std::invalid_argument);
}

TEST_P(TransformerTest, InitDependsOnSeedOnly) {
  const ModelConfig cfg = config_for(GetParam());
  auto a = build(cfg, 100), b = build(cfg, 101);
  auto pb = b->named_parameters();
  for (auto& p : a->named_parameters()) {
    if (p.value().dim() == 1) {   // norm weights start at ones whatever the seed
      EXPECT_TRUE(torch::equal(p.value(), torch::ones_like(p.value()))) << p.key();
    } else {
      EXPECT_FALSE(torch::equal(p.value(), pb[p.key()])) << p.key() << " ignores the seed";
    }
  }
  // The draws are fp32 whatever the param dtype: a bf16 model holds the fp32 model's init rounded.
  ModelConfig fp32_cfg = cfg;
  fp32_cfg.param_dtype = "fp32";
  auto ref = build(fp32_cfg, 100)->named_parameters();
  for (auto& p : a->named_parameters())
    EXPECT_TRUE(same_bits(p.value(), ref[p.key()].to(p.value().scalar_type()))) << p.key();
}

// Grads land on the params in the param dtype (bf16 params: bf16 grads through the fp32 cast).
// With all router weights zero every token ties on every expert: top-k then picks the same K
// experts for all tokens, the others get no tokens and hence no grad.
TEST_P(TransformerTest, GradsInParamDtypeAndNoneForIdleExperts) {
  const ModelConfig cfg = config_for(GetParam());
  auto model = build(cfg, 5);
  {
    torch::NoGradGuard ng;
    for (auto& block : model->layers) block->moe->router->weight.zero_();
  }
  model->train();
  auto gen = cpu_gen(1);
  auto tokens = random_tokens(2, 17, cfg.vocab_size, 7);
  auto out = model->loss(tokens.narrow(1, 0, 16), tokens.narrow(1, 1, 16), &gen);
  (out.lm_loss + out.aux_loss).backward();
  int64_t idle = 0;
  for (auto c : out.tokens_per_expert) idle += c == 0;
  ASSERT_EQ(idle, cfg.n_experts - cfg.top_k) << "tied logits should route every token alike";
  for (auto& p : model->named_parameters()) {
    const auto& grad = p.value().grad();
    bool expect_grad = true;
    for (int64_t e = 0; e < cfg.n_experts; ++e)
      if (out.tokens_per_expert[e] == 0 && p.key().find("experts." + std::to_string(e) + ".") != std::string::npos)
        expect_grad = false;
    ASSERT_EQ(grad.defined(), expect_grad) << p.key();
    if (!expect_grad) continue;
    EXPECT_EQ(grad.scalar_type(), p.value().scalar_type()) << p.key();
    EXPECT_EQ(grad.sizes(), p.value().sizes()) << p.key();
    EXPECT_TRUE(torch::isfinite(grad.to(torch::kFloat)).all().item<bool>()) << p.key();
  }
}

INSTANTIATE_TEST_SUITE_P(Numerics, TransformerTest, ::testing::ValuesIn(numerics_cases()), case_name);

struct BadConfig {
  std::string name;
  void (*mutate)(ModelConfig&);
  std::string message;   // must appear in the exception text
};

void PrintTo(const BadConfig& c, std::ostream* os) { *os << c.name; }

class ConfigValidationTest : public ::testing::TestWithParam<BadConfig> {};

TEST_P(ConfigValidationTest, NamesTheField) {
  ModelConfig cfg;
  GetParam().mutate(cfg);
  try {
    make_moe_transformer(cfg, 1, torch::kCPU);
    FAIL() << "accepted a bad config";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(GetParam().message), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Fields, ConfigValidationTest,
    ::testing::Values(
        BadConfig{"vocab", [](ModelConfig& c) { c.vocab_size = 0; }, "ModelConfig.vocab_size (0) must be > 0"},
        BadConfig{"seq_len", [](ModelConfig& c) { c.seq_len = -1; }, "ModelConfig.seq_len (-1)"},
        BadConfig{"layers", [](ModelConfig& c) { c.n_layers = 0; }, "ModelConfig.n_layers"},
        BadConfig{"heads_divide", [](ModelConfig& c) { c.n_heads = 3; },
                  "ModelConfig.d_model (128) must be divisible by n_heads = 3"},
        BadConfig{"odd_head_dim",
                  [](ModelConfig& c) {
                    c.d_model = 12;
                    c.n_heads = 4;
                  },
                  "ModelConfig.n_heads (4) must give an even head dim"},
        BadConfig{"top_k_big", [](ModelConfig& c) { c.top_k = 5; },
                  "ModelConfig.top_k (5) must be in [1, n_experts = 4]"},
        BadConfig{"top_k_zero", [](ModelConfig& c) { c.top_k = 0; }, "ModelConfig.top_k (0)"},
        BadConfig{"experts", [](ModelConfig& c) { c.n_experts = 0; }, "ModelConfig.n_experts"},
        BadConfig{"ffn", [](ModelConfig& c) { c.ffn_hidden = 0; }, "ModelConfig.ffn_hidden"},
        BadConfig{"dropout", [](ModelConfig& c) { c.dropout = 1.0; }, "ModelConfig.dropout (1) must be in [0, 1)"},
        BadConfig{"jitter_nan", [](ModelConfig& c) { c.router_jitter = std::nan(""); }, "ModelConfig.router_jitter"},
        BadConfig{"aux_negative", [](ModelConfig& c) { c.aux_loss_coeff = -1e-2; }, "ModelConfig.aux_loss_coeff"},
        BadConfig{"z_inf", [](ModelConfig& c) { c.z_loss_coeff = INFINITY; }, "ModelConfig.z_loss_coeff"},
        BadConfig{"theta", [](ModelConfig& c) { c.rope_theta = 0; }, "ModelConfig.rope_theta"},
        BadConfig{"eps", [](ModelConfig& c) { c.norm_eps = 0; }, "ModelConfig.norm_eps"},
        BadConfig{"init_std", [](ModelConfig& c) { c.init_std = -0.02; }, "ModelConfig.init_std"},
        BadConfig{"param_dtype", [](ModelConfig& c) { c.param_dtype = "fp16"; },
                  "ModelConfig.param_dtype (\"fp16\") must be \"bf16\" or \"fp32\""},
        BadConfig{"compute", [](ModelConfig& c) { c.compute = "bf16"; }, "ModelConfig.compute (\"bf16\")"}),
    [](const ::testing::TestParamInfo<BadConfig>& info) { return info.param.name; });

TEST(TransformerInputs, RejectsBadTokensNamingThem) {
  torch::set_num_threads(1);
  ModelConfig cfg;
  auto model = build(cfg, 1);
  model->eval();
  auto ok = random_tokens(2, 8, cfg.vocab_size, 1);
  auto expect_msg = [&](const torch::Tensor& tokens, const torch::Tensor& targets, const std::string& msg) {
    try {
      model->loss(tokens, targets, nullptr);
      ADD_FAILURE() << "accepted bad input, expected: " << msg;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(msg), std::string::npos) << e.what();
    }
  };
  expect_msg(ok + cfg.vocab_size, ok, "tokens ids must be in [0, vocab_size = 256)");
  expect_msg(ok, ok - 1 - ok.max(), "targets ids must be in [0, vocab_size = 256)");
  expect_msg(random_tokens(1, cfg.seq_len + 1, cfg.vocab_size, 2), random_tokens(1, cfg.seq_len + 1, 1, 2),
             "1 <= T <= seq_len = 64");
  expect_msg(ok.to(torch::kInt), ok, "tokens must be int64");
  expect_msg(ok.flatten(), ok.flatten(), "must be (B, T)");
  expect_msg(ok, ok.narrow(1, 0, 4), "targets must have the shape of tokens");
}

}   // namespace
}   // namespace rh::models::testing
