// Router, SwiGLU experts and the deterministic dropless dispatch: see moe.h. Shapes: N tokens,
// C d_model, E experts, K top-k, F expert hidden size.
#include "models/moe.h"

#include <cmath>
#include <limits>
#include <stdexcept>

namespace rh::models {

ExpertImpl::ExpertImpl(int64_t d_model, int64_t f, const Numerics& n, const torch::Device& device)
    : ffn_hidden(f), num(n) {
  fc1 = register_module("fc1", NoBiasLinear(d_model, 2 * ffn_hidden, num, device));
  fc2 = register_module("fc2", NoBiasLinear(ffn_hidden, d_model, num, device));
}

torch::Tensor ExpertImpl::forward(const torch::Tensor& x) {
  auto h = fc1(x);   // (n, 2F)
  auto gate = h.narrow(-1, 0, ffn_hidden), up = h.narrow(-1, ffn_hidden, ffn_hidden);
  // Each op's output rounded as a bf16 model would hold it.
  return fc2(num.act(num.act(torch::silu(gate)) * up));   // (n, C)
}

MoELayerImpl::MoELayerImpl(const ModelConfig& cfg, const Numerics& n, const torch::Device& device)
    : n_experts(cfg.n_experts),
      top_k(cfg.top_k),
      dead_expert(cfg.dead_expert),
      score_function(cfg.score_function),
      enable_expert_bias(cfg.enable_expert_bias),
      capacity_factor(cfg.capacity_factor),
      token_drop_policy(cfg.token_drop_policy),
      pad_to_capacity(cfg.pad_to_capacity),
      router_dtype(cfg.router_dtype),
      aux_loss_coeff(cfg.aux_loss_coeff),
      z_loss_coeff(cfg.z_loss_coeff),
      router_jitter(cfg.router_jitter),
      num(n) {
  router = register_module("router", NoBiasLinear(cfg.d_model, cfg.n_experts, num, device));
  if (enable_expert_bias) {   // router.py TopKRouter.__init__: both fp32 zeros
    auto f32 = torch::TensorOptions().dtype(torch::kFloat).device(device);
    expert_bias = router->register_buffer("expert_bias", torch::zeros({n_experts}, f32));
    local_tokens_per_expert = torch::zeros({n_experts}, f32);
  }
  experts_list = register_module("experts", torch::nn::ModuleList());
  for (int64_t e = 0; e < n_experts; ++e) {
    experts.push_back(Expert(cfg.d_model, cfg.ffn_hidden, num, device));
    experts_list->push_back(experts.back());
  }
}

int64_t expert_capacity(int64_t num_tokens, int64_t num_experts, double capacity_factor) {
  // moe_utils.py get_capacity: math.ceil((num_tokens / num_experts) * capacity_factor); the
  // min_capacity rule does not apply (apply_router_token_dropping passes none).
  return static_cast<int64_t>(std::ceil((double(num_tokens) / double(num_experts)) * capacity_factor));
}

torch::Tensor capacity_mask(const torch::Tensor& top_idx, const torch::Tensor& top_probs, int64_t n_experts,
                            int64_t capacity, const std::string& policy) {
  const int64_t N = top_idx.size(0);
  auto bool_opts = top_idx.options().dtype(torch::kBool);
  // moe_utils.py apply_router_token_dropping: `if expert_capacity > num_tokens`: no dropping.
  if (capacity > N) return torch::ones({N, n_experts}, bool_opts);
  auto dense = torch::zeros({N, n_experts}, top_probs.options().requires_grad(false));
  // probs: topk of routing_probs over tokens; position: topk of routing_map.int() (routed first).
  auto key =
      policy == "probs" ? dense.scatter(1, top_idx, top_probs.detach()) : dense.to(torch::kInt).scatter(1, top_idx, 1);
  // Stable descending: equal keys keep token order (upstream's topk tie order is unspecified).
  auto order = std::get<1>(torch::sort(key, /*stable=*/c10::optional<bool>(true), /*dim=*/0,
                                       /*descending=*/true));   // (N, E) token indices
  return torch::zeros({N, n_experts}, top_idx.options().dtype(torch::kInt))
      .scatter(0, order.narrow(0, 0, capacity), 1)
      .to(torch::kBool);
}

torch::Tensor capacity_keep_mask(const torch::Tensor& top_idx, const torch::Tensor& top_probs, int64_t n_experts,
                                 int64_t capacity, const std::string& policy) {
  // final_map = routing_map AND capacity_mask, read at each token's chosen experts.
  return capacity_mask(top_idx, top_probs, n_experts, capacity, policy).gather(1, top_idx);   // (N, K)
}

torch::Tensor MoELayerImpl::router_logits(const torch::Tensor& x, torch::Generator* gen) {
  auto router_input = x.to(torch::kFloat);
  const bool jitter = is_training() && router_jitter > 0.0;
  if (jitter) {
    if (gen == nullptr) throw std::invalid_argument("MoELayer: router_jitter > 0 in training needs a torch::Generator");
    auto noise = torch::empty(router_input.sizes(), torch::TensorOptions().dtype(torch::kFloat).device(gen->device()));
    noise.uniform_(1.0 - router_jitter, 1.0 + router_jitter, *gen);
    router_input = router_input * noise.to(router_input.device());
  }
  // router.py TopKRouter.gating: router_dtype = input.dtype unless --moe-router-dtype is fp32 or
  // fp64. "none": the router linear runs as every other linear of this model (num.linear: in
  // the compute dtype, output held as a bf16 model holds it).
  if (router_dtype == "none") return num.linear(jitter ? num.act(router_input) : x, router->weight);
  const auto dtype = router_dtype == "fp64" ? torch::kDouble : torch::kFloat;
  return torch::linear(router_input.to(dtype), router->weight.to(dtype));   // (N, E)
}

torch::Tensor MoELayerImpl::z_loss(const torch::Tensor& logits) const {
  // moe_utils.py z_loss_func (NVIDIA/Megatron-LM main d98e8a6, lines 153-182):
  // `torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * z_loss_coeff`, in the logits'
  // own dtype: router.py TopKRouter.gating (lines 106-111) makes them `input.dtype` (bf16 in a
  // bf16 model) unless --moe-router-dtype is fp32 or fp64.
  // Each op as CUDA computes it on that dtype: elementwise ops in fp32 (fp64 for fp64) rounded to
  // the dtype; reductions accumulate in fp32 and round once; logsumexp is ATen's composite
  // (amax, sub, exp, sum, log, add: ReduceOps.cpp logsumexp_out_impl); mean is the CUDA
  // mean_kernel_impl, sum * (1 / n) in the accumulation type. A bf16 value is held here in fp32
  // and rounded by `hold` (CPU bf16 kernels differ: 1.13's CPU mean divides). The backward runs
  // through these fp32 ops, not bf16 ones.
  const bool bf16 = router_dtype == "none" && num.param_dtype == torch::kBFloat16;
  const auto work = router_dtype == "fp64" ? torch::kDouble : torch::kFloat;
  auto hold = [&](const torch::Tensor& t) { return bf16 ? t.to(torch::kBFloat16).to(work) : t; };
  const auto x = hold(logits.to(work));
  auto m = std::get<0>(x.detach().max(-1, /*keepdim=*/true));
  m.masked_fill_(m.abs() == std::numeric_limits<double>::infinity(), 0.0);
  const auto e = hold(hold(x - m).exp());
  const auto lse = hold(hold(hold(e.sum(-1)).log()) + m.squeeze(-1));
  const auto sq = hold(lse.square());
  const double inv_n = 1.0 / static_cast<double>(sq.numel());
  const auto factor = work == torch::kDouble ? inv_n : static_cast<double>(static_cast<float>(inv_n));
  return hold(hold(sq.sum() * factor) * z_loss_coeff);
}

torch::Tensor MoELayerImpl::score_and_pick(RouterOutput& routing) {
  // moe_utils.py topk_routing_with_score_function: scores in fp32, then
  // `probs = probs.type_as(logits)` (here: rounded as the model holds a logits-dtype tensor).
  auto as_logits = [&](const torch::Tensor& p) {
    if (router_dtype == "none") return num.act(p);
    return router_dtype == "fp64" ? p.to(torch::kDouble) : p;
  };
  const auto logits_fp32 = routing.logits.to(torch::kFloat);
  if (score_function == "sigmoid") {
    auto scores = torch::sigmoid(logits_fp32);   // (N, E); a dead expert's -inf logit scores 0
    auto for_routing = scores;
    if (enable_expert_bias) for_routing = scores + expert_bias;
    if (dead_expert >= 0)   // still never chosen, whatever its bias
      for_routing = for_routing.index_fill(1, torch::tensor({dead_expert}, torch::kLong).to(scores.device()),
                                           -std::numeric_limits<float>::infinity());
    routing.top_idx = std::get<1>(for_routing.topk(top_k, -1));   // (N, K)
    auto top_scores = scores.gather(1, routing.top_idx);
    routing.top_probs = as_logits(top_k > 1 ? top_scores / (top_scores.sum(-1, /*keepdim=*/true) + 1e-20) : top_scores);
    // moe_utils.py compute_routing_scores_for_aux_loss: sigmoid scores normalised whatever K
    // (unlike the gate weights above, which are normalised only when K > 1).
    return scores / (scores.sum(-1, true) + 1e-20);
  }
  // softmax without pre-softmax: top-k of the logits in their dtype, softmax in fp32.
  auto [top_logits, top_idx] = routing.logits.topk(top_k, -1);   // (N, K) each, descending
  routing.top_idx = top_idx;
  routing.top_probs = as_logits(torch::softmax(top_logits.to(torch::kFloat), -1));
  return torch::softmax(logits_fp32, -1);
}

void MoELayerImpl::drop_tokens(RouterOutput& routing) {
  if (capacity_factor < 0.0) {   // dropless (upstream: moe_expert_capacity_factor None)
    routing.kept = torch::ones(routing.top_idx.sizes(), routing.top_idx.options().dtype(torch::kBool));
    return;
  }
  // router.py routing -> moe_utils.py apply_router_token_dropping(num_tokens * topk pairs).
  const int64_t capacity = expert_capacity(routing.top_idx.numel(), n_experts, capacity_factor);
  auto mask = capacity_mask(routing.top_idx, routing.top_probs, n_experts, capacity, token_drop_policy);
  routing.kept = mask.gather(1, routing.top_idx);
  // pad_to_capacity: `final_map = capacity_mask`; final_probs = routing_probs * final_map is 0 at
  // every padded cell (routing_probs is 0 off the routing map), so the routed pairs' probs are the
  // same as without padding.
  if (pad_to_capacity) routing.padded_map = mask;
  routing.top_probs =
      routing.top_probs * routing.kept.to(routing.top_probs.scalar_type());   // final_probs = probs * final_map
}

RouterOutput MoELayerImpl::route(const torch::Tensor& x, torch::Generator* gen) {
  TORCH_CHECK(x.dim() == 2, "MoELayer::route expects (N, C), got ", x.sizes());
  const int64_t N = x.size(0);
  RouterOutput routing;
  routing.logits = router_logits(x, gen);
  if (dead_expert >= 0)   // never chosen: its logit is -inf (softmax probability exactly 0)
    routing.logits =
        routing.logits.index_fill(1, torch::tensor({dead_expert}, torch::kLong).to(routing.logits.device()),
                                  -std::numeric_limits<float>::infinity());
  auto aux_scores = score_and_pick(routing);   // (N, E) the scores the load-balancing loss weighs
  // The aux loss counts its own routing map (moe_utils.py compute_routing_scores_for_aux_loss:
  // `_, top_indices = torch.topk(scores, k=topk, dim=1)` over the aux scores): before dropping
  // and without the expert bias, which steers only the routing itself.
  auto counts = torch::bincount(std::get<1>(aux_scores.topk(top_k, -1)).reshape(-1), {}, n_experts);   // (E)
  auto routed_counts = torch::bincount(routing.top_idx.reshape(-1), {}, n_experts);   // the routing's own
  drop_tokens(routing);
  // The counts after dropping: upstream's routing_map.sum(dim=0), which with padding is the
  // capacity mask's, `capacity` for every expert (so the expert-bias update sign(mean - count)
  // is 0 and the bias stays where it is while every expert is padded to capacity).
  auto kept_counts = capacity_factor < 0.0 ? routed_counts
                     : routing.padded_map.defined()
                         ? routing.padded_map.sum(0).to(torch::kLong)
                         : torch::bincount(routing.top_idx.masked_select(routing.kept), {}, n_experts);
  auto counts_cpu = kept_counts.to(torch::kCPU);
  routing.tokens_per_expert.assign(counts_cpu.data_ptr<int64_t>(), counts_cpu.data_ptr<int64_t>() + n_experts);
  // router.py _apply_expert_bias(routing_map): the map after token dropping.
  if (enable_expert_bias && is_training() && torch::GradMode::is_enabled()) {
    torch::NoGradGuard no_grad;
    local_tokens_per_expert += kept_counts.to(torch::kFloat);
  }

  routing.aux_loss = torch::zeros({}, routing.logits.options().dtype(torch::kFloat));
  if (aux_loss_coeff > 0.0) {
    // Megatron's switch_load_balancing_loss_func; tokens_e carries no gradient.
    auto prob_per_expert = aux_scores.sum(0);   // (E)
    const double scale = double(n_experts) * aux_loss_coeff / (double(top_k) * double(N) * double(N));
    routing.aux_loss = routing.aux_loss + (prob_per_expert * counts.to(torch::kFloat)).sum() * scale;
  }
  if (z_loss_coeff > 0.0) routing.aux_loss = routing.aux_loss + z_loss(routing.logits).to(torch::kFloat);
  return routing;
}

torch::Tensor MoELayerImpl::dispatch(const torch::Tensor& x, const RouterOutput& routing) {
  if (routing.padded_map.defined()) return dispatch_padded(x, routing);
  const int64_t N = x.size(0), C = x.size(1), NK = N * top_k;
  auto pair_expert = routing.top_idx.reshape({NK});   // pair p = n*K + j -> expert
  int64_t n_dropped = 0;   // dropped pairs sort after every expert's (as expert E) and run nowhere
  if (routing.kept.defined()) {
    pair_expert = pair_expert.masked_fill(routing.kept.reshape({NK}).logical_not(), n_experts);
    n_dropped = NK - routing.kept.sum().item<int64_t>();
  }
  // Stable: within an expert, pairs stay in (token, slot) order.
  auto perm = std::get<1>(torch::sort(pair_expert, /*stable=*/c10::optional<bool>(true),
                                      /*dim=*/0));   // sorted pos -> pair
  auto inv_perm = torch::empty_like(perm).scatter_(0, perm, torch::arange(NK, perm.options()));

  // Each token's row repeated K times (pair order), then permuted: no repeated gather index.
  auto x_pairs = x.unsqueeze(1).expand({N, top_k, C}).reshape({NK, C});
  auto x_sorted = x_pairs.index_select(0, perm);   // (NK, C), grouped by expert
  auto sizes = routing.tokens_per_expert;
  sizes.push_back(n_dropped);
  auto slices = x_sorted.split_with_sizes(sizes, 0);
  std::vector<torch::Tensor> outs;
  outs.reserve(slices.size());
  for (int64_t e = 0; e < n_experts; ++e) {
    if (routing.tokens_per_expert[e] == 0) continue;   // not run: no grad for its params
    outs.push_back(experts[e]->forward(slices[e]));
  }
  if (n_dropped > 0) outs.push_back(torch::zeros({n_dropped, C}, x.options()));   // dropped: output 0
  auto y_pairs = torch::cat(outs, 0).index_select(0, inv_perm);                   // (NK, C), pair order
  auto weighted =
      (y_pairs.to(torch::kFloat) * routing.top_probs.to(torch::kFloat).reshape({NK, 1})).view({N, top_k, C});
  auto combined = weighted.select(1, 0);
  for (int64_t j = 1; j < top_k; ++j) combined = combined + weighted.select(1, j);
  return num.act(combined);   // (N, C)
}

// token_dispatcher.py with moe_pad_expert_input_to_capacity: each expert's input is its column of
// the routing map (= the capacity mask), `capacity` rows in token order. Cells (n, e), p = n*E + e.
torch::Tensor MoELayerImpl::dispatch_padded(const torch::Tensor& x, const RouterOutput& routing) {
  const int64_t N = x.size(0), C = x.size(1), E = n_experts, NE = N * E;
  auto cell_expert = torch::arange(E, routing.top_idx.options()).repeat({N});                 // p -> e
  cell_expert = cell_expert.masked_fill(routing.padded_map.reshape({NE}).logical_not(), E);   // outside: last
  int64_t n_outside = NE;
  for (auto count : routing.tokens_per_expert) n_outside -= count;
  auto perm = std::get<1>(torch::sort(cell_expert, /*stable=*/c10::optional<bool>(true), /*dim=*/0));
  auto inv_perm = torch::empty_like(perm).scatter_(0, perm, torch::arange(NE, perm.options()));
  auto x_cells = x.unsqueeze(1).expand({N, E, C}).reshape({NE, C});
  auto sizes = routing.tokens_per_expert;
  sizes.push_back(n_outside);
  auto slices = x_cells.index_select(0, perm).split_with_sizes(sizes, 0);
  std::vector<torch::Tensor> outs;
  for (int64_t e = 0; e < E; ++e)
    if (routing.tokens_per_expert[e] > 0) outs.push_back(experts[e]->forward(slices[e]));
  if (n_outside > 0) outs.push_back(torch::zeros({n_outside, C}, x.options()));
  auto y_cells = torch::cat(outs, 0).index_select(0, inv_perm).view({N, E, C});
  // The routed pairs (n, top_idx[n, j]): a kept one is a computed row, a dropped one a zero row
  // with weight 0; padded rows are not taken (upstream multiplies them by probability 0).
  auto y_pairs = y_cells.gather(1, routing.top_idx.unsqueeze(-1).expand({N, top_k, C}));   // (N, K, C)
  auto weighted = y_pairs.to(torch::kFloat) * routing.top_probs.to(torch::kFloat).unsqueeze(-1);
  auto combined = weighted.select(1, 0);
  for (int64_t j = 1; j < top_k; ++j) combined = combined + weighted.select(1, j);
  return num.act(combined);   // (N, C)
}

}   // namespace rh::models
