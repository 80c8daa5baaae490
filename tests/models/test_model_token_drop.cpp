// Token dropping (Megatron --moe-expert-capacity-factor / --moe-token-drop-policy) and the router
// dtype (--moe-router-dtype): capacities against upstream's get_capacity formula, the kept pairs
// and combined output against a slow per-token reference loop, determinism, the expert-bias
// counter counting after dropping, and the logits' dtype in each numerics mode.
#include <algorithm>
#include <map>
#include <tuple>

#include "models/moe.h"
#include "tests/model_test_util.h"

namespace rh::models::testing {
namespace {

using DropCase = std::tuple<std::string, NumericsCase>;   // policy, numerics

std::string drop_case_name(const ::testing::TestParamInfo<DropCase>& info) {
  return std::get<0>(info.param) + "_" + std::get<1>(info.param).name;
}

// Values of Python's `math.ceil((num_tokens / num_experts) * capacity_factor)` (moe_utils.py
// get_capacity), computed by running that expression in CPython 3. (100, 2, 1.1): the double
// product is 55.00000000000001, so upstream (and we) get 56 where exact arithmetic gives 55.
TEST(ExpertCapacity, MatchesUpstreamGetCapacity) {
  const std::vector<std::tuple<int64_t, int64_t, double, int64_t>> cases = {{128, 4, 1.0, 32}, {74, 4, 1.0, 19},
                                                                            {111, 4, 0.3, 9},  {10, 3, 1.5, 5},
                                                                            {64, 4, 0.5, 8},   {78, 4, 1.25, 25},
                                                                            {96, 3, 0.7, 23},  {74, 4, 0.0, 0},
                                                                            {6, 4, 2.0, 3},    {100, 2, 1.1, 56}};
  for (auto [n, e, cf, want] : cases)
    EXPECT_EQ(expert_capacity(n, e, cf), want) << n << " tokens, " << e << " experts, factor " << cf;
}

class TokenDropTest : public ::testing::TestWithParam<DropCase> {
 protected:
  void SetUp() override { torch::set_num_threads(1); }
  ModelConfig config() const {
    ModelConfig cfg = config_for(std::get<1>(GetParam()));
    cfg.token_drop_policy = std::get<0>(GetParam());
    return cfg;
  }
  static MoELayer make_layer(const ModelConfig& cfg, uint64_t seed) { return build(cfg, seed)->layers[0]->moe; }
  // 13 random rows repeated 3 times: duplicate tokens have equal probabilities, so the tie rule
  // (lower token index first) is exercised.
  static torch::Tensor input(const MoELayer& moe, int64_t C) {
    auto g = cpu_gen(17);
    auto a = torch::randn({13, C}, g);
    return torch::cat({a, a, a}, 0).to(moe->num.compute_dtype);   // (39, C)
  }
};

// Slow reference for which pairs survive: per expert, the routed (token, slot) pairs ordered by the
// policy (probs: descending probability, ties to the lower token; position: token order), first
// `cap` kept.
std::vector<std::vector<bool>> reference_kept(const RouterOutput& r0, int64_t E, int64_t cap,
                                              const std::string& policy) {
  const int64_t N = r0.top_idx.size(0), K = r0.top_idx.size(1);
  auto idx = r0.top_idx.contiguous();
  auto probs = r0.top_probs.to(torch::kDouble).contiguous();
  std::vector<std::vector<bool>> kept(N, std::vector<bool>(K, cap > N));
  if (cap > N) return kept;
  for (int64_t e = 0; e < E; ++e) {
    std::vector<std::tuple<double, int64_t, int64_t>> pairs;   // (prob, token, slot)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j)
        if (idx[n][j].item<int64_t>() == e) pairs.push_back({probs[n][j].item<double>(), n, j});
    std::sort(pairs.begin(), pairs.end(), [&](const auto& a, const auto& b) {
      if (policy == "probs" && std::get<0>(a) != std::get<0>(b)) return std::get<0>(a) > std::get<0>(b);
      return std::get<1>(a) < std::get<1>(b);
    });
    for (size_t i = 0; i < pairs.size() && int64_t(i) < cap; ++i)
      kept[std::get<1>(pairs[i])][std::get<2>(pairs[i])] = true;
  }
  return kept;
}

// Per-token combine: each expert runs its kept rows as one batch (token, slot order), a dropped
// pair contributes a zero row times weight 0, summed over slots in order.
torch::Tensor reference_output(MoELayer& moe, const torch::Tensor& x, const RouterOutput& dropless_routing,
                               const std::vector<std::vector<bool>>& kept) {
  const int64_t N = x.size(0), K = moe->top_k;
  auto idx = dropless_routing.top_idx.contiguous();
  std::vector<torch::Tensor> y(N * K, torch::zeros({x.size(1)}, x.options()));
  for (int64_t e = 0; e < moe->n_experts; ++e) {
    std::vector<int64_t> pairs;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j)
        if (kept[n][j] && idx[n][j].item<int64_t>() == e) pairs.push_back(n * K + j);
    if (pairs.empty()) continue;
    std::vector<torch::Tensor> rows;
    for (auto p : pairs) rows.push_back(x[p / K]);
    auto ye = moe->experts[e]->forward(torch::stack(rows));
    for (size_t i = 0; i < pairs.size(); ++i) y[pairs[i]] = ye[i];
  }
  std::vector<torch::Tensor> out;
  for (int64_t n = 0; n < N; ++n) {
    auto w = [&](int64_t j) {
      auto p = kept[n][j] ? dropless_routing.top_probs[n][j].to(torch::kFloat) : torch::zeros({}, torch::kFloat);
      return y[n * K + j].to(torch::kFloat) * p;
    };
    auto acc = w(0);
    for (int64_t j = 1; j < K; ++j) acc = acc + w(j);
    out.push_back(moe->num.act(acc));
  }
  return torch::stack(out);
}

TEST_P(TokenDropTest, KeptPairsAndOutputMatchPerTokenReferenceBitwise) {
  for (double factor : {0.5, 1.0, 4.0}) {   // 4.0: capacity 78 > 39 tokens, nothing dropped
    ModelConfig cfg = config();
    auto moe = make_layer(cfg, 11);
    auto x = input(moe, cfg.d_model);
    torch::NoGradGuard ng;
    auto dropless_routing = moe->route(x, nullptr);   // dropless: the routing before dropping
    moe->capacity_factor = factor;
    auto routing = moe->route(x, nullptr);
    const int64_t N = x.size(0), K = cfg.top_k, cap = expert_capacity(N * K, cfg.n_experts, factor);
    auto kept = reference_kept(dropless_routing, cfg.n_experts, cap, cfg.token_drop_policy);
    int64_t n_kept = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < K; ++j) {
        ASSERT_EQ(routing.kept[n][j].item<bool>(), kept[n][j]) << "factor " << factor << " pair " << n << "," << j;
        n_kept += kept[n][j];
      }
    EXPECT_TRUE(same_bits(routing.top_idx, dropless_routing.top_idx));
    EXPECT_TRUE(same_bits(routing.top_probs,
                          dropless_routing.top_probs * routing.kept.to(dropless_routing.top_probs.scalar_type())));
    EXPECT_LE(n_kept, cap * cfg.n_experts);
    if (factor == 4.0) {
      EXPECT_EQ(n_kept, N * K);
    } else {
      EXPECT_LT(n_kept, N * K) << "factor " << factor << " should drop something";
    }
    for (int64_t e = 0; e < cfg.n_experts; ++e) EXPECT_LE(routing.tokens_per_expert[e], cap);
    int64_t counted = 0;
    for (auto c : routing.tokens_per_expert) counted += c;
    EXPECT_EQ(counted, n_kept);
    auto got = moe->dispatch(x, routing), want = reference_output(moe, x, dropless_routing, kept);
    EXPECT_TRUE(same_bits(got, want)) << "factor " << factor << " max |diff| "
                                      << (got.to(torch::kFloat) - want.to(torch::kFloat)).abs().max().item<float>();
  }
}

// Two fresh layers, same seed and input: identical routing, output and gradients.
TEST_P(TokenDropTest, DroppingIsDeterministic) {
  ModelConfig cfg = config();
  cfg.capacity_factor = 0.5;
  std::vector<torch::Tensor> outs, grads, kept;
  for (int run = 0; run < 2; ++run) {
    auto moe = make_layer(cfg, 5);
    auto x = input(moe, cfg.d_model);
    auto [y, routing] = moe->forward(x, nullptr);
    (y.to(torch::kFloat).sum() + routing.aux_loss).backward();
    outs.push_back(y);
    grads.push_back(moe->router->weight.grad());
    kept.push_back(routing.kept);
  }
  EXPECT_TRUE(same_bits(outs[0], outs[1]));
  EXPECT_TRUE(same_bits(grads[0], grads[1]));
  EXPECT_TRUE(same_bits(kept[0], kept[1]));
  EXPECT_FALSE(kept[0].all().item<bool>());   // dropping really happened
}

// router.py routing calls _apply_expert_bias(routing_map) after apply_router_token_dropping: the
// aux-loss-free counter counts the kept pairs only.
TEST_P(TokenDropTest, ExpertBiasCounterCountsAfterDropping) {
  ModelConfig cfg = config();
  cfg.score_function = "sigmoid";
  cfg.enable_expert_bias = true;
  cfg.capacity_factor = 0.5;
  auto moe = make_layer(cfg, 7);
  moe->train();
  auto x = input(moe, cfg.d_model);
  auto routing = moe->route(x, nullptr);
  const auto counted = moe->local_tokens_per_expert.to(torch::kLong);
  auto want = torch::bincount(routing.top_idx.masked_select(routing.kept), {}, cfg.n_experts);
  EXPECT_TRUE(same_bits(counted, want));
  EXPECT_LT(counted.sum().item<int64_t>(), x.size(0) * cfg.top_k);
}

// --moe-pad-expert-input-to-capacity, slow reference: per expert, all N tokens ordered by the
// policy's key (probs: the token's routing probability for that expert, 0 when not routed there,
// descending, ties to the lower token; position: routed tokens first, then token order), the first
// `cap` taken in token order and run as one batch; a token's output sums, over its slots j in
// order, the expert's row for it times its probability when that pair is kept, else 0.
struct PaddedReference {
  std::vector<std::vector<bool>> processes;   // [e][n]: expert e runs token n
  torch::Tensor output;
};
PaddedReference padded_reference(MoELayer& moe, const torch::Tensor& x, const RouterOutput& dropless_routing,
                                 int64_t cap, const std::string& policy) {
  const int64_t N = x.size(0), K = moe->top_k, E = moe->n_experts;
  auto idx = dropless_routing.top_idx.contiguous();
  auto probs = dropless_routing.top_probs.to(torch::kDouble).contiguous();
  PaddedReference ref{std::vector<std::vector<bool>>(E, std::vector<bool>(N, false)), {}};
  std::vector<std::map<int64_t, torch::Tensor>> rows_out(E);   // [e][n] -> expert row
  for (int64_t e = 0; e < E; ++e) {
    std::vector<std::tuple<double, int64_t>> keyed;   // (key, token)
    for (int64_t n = 0; n < N; ++n) {
      double key = 0.0;
      for (int64_t j = 0; j < K; ++j)
        if (idx[n][j].item<int64_t>() == e) key = policy == "probs" ? probs[n][j].item<double>() : 1.0;
      keyed.push_back({key, n});
    }
    std::stable_sort(keyed.begin(), keyed.end(),
                     [](const auto& a, const auto& b) { return std::get<0>(a) > std::get<0>(b); });
    std::vector<int64_t> tokens;
    for (int64_t i = 0; i < std::min(cap, N); ++i) tokens.push_back(std::get<1>(keyed[i]));
    std::sort(tokens.begin(), tokens.end());
    if (cap > N) {
      tokens.clear();
      for (int64_t n = 0; n < N; ++n) tokens.push_back(n);
    }
    std::vector<torch::Tensor> rows;
    for (auto n : tokens) {
      rows.push_back(x[n]);
      ref.processes[e][n] = true;
    }
    if (rows.empty()) continue;
    auto ye = moe->experts[e]->forward(torch::stack(rows));
    for (size_t i = 0; i < tokens.size(); ++i) rows_out[e][tokens[i]] = ye[i];
  }
  std::vector<torch::Tensor> out;
  for (int64_t n = 0; n < N; ++n) {
    auto w = [&](int64_t j) {
      const int64_t e = idx[n][j].item<int64_t>();
      if (!ref.processes[e][n]) return torch::zeros({x.size(1)}, torch::kFloat);   // dropped
      return rows_out[e][n].to(torch::kFloat) * dropless_routing.top_probs[n][j].to(torch::kFloat);
    };
    auto acc = w(0);
    for (int64_t j = 1; j < K; ++j) acc = acc + w(j);
    out.push_back(moe->num.act(acc));
  }
  ref.output = torch::stack(out);
  return ref;
}

TEST_P(TokenDropTest, PadToCapacityRunsCapacityRowsPerExpertLikeTheReference) {
  for (double factor : {0.5, 1.0, 4.0}) {   // 4.0: capacity 78 > 39 tokens, every expert runs all
    ModelConfig cfg = config();
    auto moe = make_layer(cfg, 11);
    auto x = input(moe, cfg.d_model);
    torch::NoGradGuard ng;
    auto dropless_routing = moe->route(x, nullptr);   // dropless routing
    moe->capacity_factor = factor;
    auto unpadded = moe->route(x, nullptr);
    moe->pad_to_capacity = true;
    auto routing = moe->route(x, nullptr);
    const int64_t N = x.size(0), E = cfg.n_experts, cap = expert_capacity(N * cfg.top_k, E, factor);
    auto padded_ref = padded_reference(moe, x, dropless_routing, cap, cfg.token_drop_policy);
    ASSERT_TRUE(routing.padded_map.defined());
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_EQ(routing.tokens_per_expert[e], std::min(cap, N)) << "expert " << e << " factor " << factor;
      for (int64_t n = 0; n < N; ++n)
        ASSERT_EQ(routing.padded_map[n][e].item<bool>(), padded_ref.processes[e][n])
            << "token " << n << " expert " << e;
    }
    // The routed pairs kept, and their probabilities, are those of plain dropping.
    EXPECT_TRUE(same_bits(routing.kept, unpadded.kept));
    EXPECT_TRUE(same_bits(routing.top_probs, unpadded.top_probs));
    auto got = moe->dispatch(x, routing);
    EXPECT_TRUE(same_bits(got, padded_ref.output))
        << "factor " << factor << " max |diff| "
        << (got.to(torch::kFloat) - padded_ref.output.to(torch::kFloat)).abs().max().item<float>();
  }
}

// Upstream counts routing_map.sum(dim=0) after dropping, and with padding that map is the
// capacity mask: every expert counts `capacity`, so sign(mean - count) is 0 for all and the bias
// update leaves expert_bias unchanged; a padded expert the router never chose still gets a
// (zero) gradient, where without padding it is not run and gets none.
TEST_P(TokenDropTest, PadToCapacityCountsCapacityAndPadsUnchosenExperts) {
  ModelConfig cfg = config();
  cfg.score_function = "sigmoid";
  cfg.enable_expert_bias = true;
  cfg.capacity_factor = 0.5;
  cfg.pad_to_capacity = true;
  cfg.dead_expert = 1;
  auto moe = make_layer(cfg, 7);
  moe->train();
  auto x = input(moe, cfg.d_model);
  auto [y, r] = moe->forward(x, nullptr);
  const int64_t cap = expert_capacity(x.size(0) * cfg.top_k, cfg.n_experts, 0.5);
  EXPECT_TRUE(same_bits(moe->local_tokens_per_expert, torch::full({cfg.n_experts}, double(cap), torch::kFloat)));
  y.to(torch::kFloat).sum().backward();
  auto g = moe->experts[1]->fc1->weight.grad();
  ASSERT_TRUE(g.defined()) << "the dead expert runs its padded rows";
  EXPECT_EQ(g.abs().max().item<float>(), 0.0f);
}

INSTANTIATE_TEST_SUITE_P(Policies, TokenDropTest,
                         ::testing::Combine(::testing::Values("probs", "position"),
                                            ::testing::ValuesIn(numerics_cases())),
                         drop_case_name);

class RouterDtypeTest : public ::testing::TestWithParam<NumericsCase> {};

// fp32 and fp64 give logits (and probs) in that dtype; none (upstream's default) gives the input's
// dtype: fp32 with fp32 params, bf16 natively, and bf16 values in fp32 containers when emulating.
TEST_P(RouterDtypeTest, LogitsAndProbsTakeTheRouterDtype) {
  torch::set_num_threads(1);
  const auto& numerics_case = GetParam();
  std::map<std::string, torch::Tensor> logits;
  for (const std::string dt : {"fp32", "fp64", "none"}) {
    ModelConfig cfg = config_for(numerics_case);
    cfg.router_dtype = dt;
    auto moe = build(cfg, 3)->layers[0]->moe;
    auto g = cpu_gen(1);
    auto x = torch::randn({16, cfg.d_model}, g).to(moe->num.compute_dtype);
    auto routing = moe->route(x, nullptr);
    EXPECT_EQ(routing.top_probs.scalar_type(), routing.logits.scalar_type()) << dt;
    logits[dt] = routing.logits;
  }
  EXPECT_EQ(logits["fp32"].scalar_type(), torch::kFloat);
  EXPECT_EQ(logits["fp64"].scalar_type(), torch::kDouble);
  auto none = logits["none"];
  if (numerics_case.param_dtype == "fp32") {
    EXPECT_TRUE(same_bits(none, logits["fp32"]));
  } else {
    EXPECT_EQ(none.scalar_type(), numerics_case.compute == "native" ? torch::kBFloat16 : torch::kFloat);
    auto f = none.to(torch::kFloat);
    EXPECT_TRUE(same_bits(f, f.to(torch::kBFloat16).to(torch::kFloat)));   // bf16 values
    EXPECT_FALSE(same_bits(f, logits["fp32"]));                            // differs from the fp32 router
  }
}

INSTANTIATE_TEST_SUITE_P(Numerics, RouterDtypeTest, ::testing::ValuesIn(numerics_cases()), case_name);

TEST(TokenDropConfig, BadValuesNameTheField) {
  ModelConfig cfg;
  cfg.token_drop_policy = "random";
  EXPECT_THROW(validate_config(cfg), std::invalid_argument);
  cfg = ModelConfig();
  cfg.pad_to_capacity = true;   // without a capacity factor: upstream raises a ValueError
  try {
    validate_config(cfg);
    ADD_FAILURE() << "pad_to_capacity without a capacity factor accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("pad_to_capacity"), std::string::npos) << e.what();
  }
  cfg.capacity_factor = 1.0;
  EXPECT_NO_THROW(validate_config(cfg));
  cfg = ModelConfig();
  cfg.router_dtype = "bf16";
  try {
    validate_config(cfg);
    ADD_FAILURE() << "router_dtype bf16 accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("router_dtype"), std::string::npos) << e.what();
  }
}

}   // namespace
}   // namespace rh::models::testing
