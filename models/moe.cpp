// Router, SwiGLU experts and the deterministic dropless dispatch: see moe.h. Shapes: N tokens,
// C d_model, E experts, K top-k, F expert hidden size.
#include "models/moe.h"

#include <limits>
#include <stdexcept>

namespace rh::models {

ExpertImpl::ExpertImpl(int64_t d_model, int64_t f, const Numerics& n, const torch::Device& device)
    : ffn_hidden(f), num(n) {
  fc1 = register_module("fc1", NoBiasLinear(d_model, 2 * ffn_hidden, num, device));
  fc2 = register_module("fc2", NoBiasLinear(ffn_hidden, d_model, num, device));
}

torch::Tensor ExpertImpl::forward(const torch::Tensor& x) {
  auto h = fc1(x);  // (n, 2F)
  auto gate = h.narrow(-1, 0, ffn_hidden), up = h.narrow(-1, ffn_hidden, ffn_hidden);
  // Each op's output rounded as a bf16 model would hold it.
  return fc2(num.act(num.act(torch::silu(gate)) * up));  // (n, C)
}

MoELayerImpl::MoELayerImpl(const ModelConfig& cfg, const Numerics& n, const torch::Device& device)
    : n_experts(cfg.n_experts),
      top_k(cfg.top_k),
      dead_expert(cfg.dead_expert),
      score_function(cfg.score_function),
      enable_expert_bias(cfg.enable_expert_bias),
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

RouterOutput MoELayerImpl::route(const torch::Tensor& x, torch::Generator* gen) {
  TORCH_CHECK(x.dim() == 2, "MoELayer::route expects (N, C), got ", x.sizes());
  const int64_t N = x.size(0);
  auto xr = x.to(torch::kFloat);
  if (is_training() && router_jitter > 0.0) {
    if (gen == nullptr)
      throw std::invalid_argument(
          "MoELayer: router_jitter > 0 in training needs a torch::Generator");
    auto noise =
        torch::empty(xr.sizes(), torch::TensorOptions().dtype(torch::kFloat).device(gen->device()));
    noise.uniform_(1.0 - router_jitter, 1.0 + router_jitter, *gen);
    xr = xr * noise.to(xr.device());
  }
  RouterOutput r;
  // Logits in fp32 whatever the compute mode: routing decisions are precision-sensitive.
  r.logits = torch::linear(xr, router->weight.to(torch::kFloat));  // (N, E)
  if (dead_expert >= 0)   // never chosen: its logit is -inf (softmax probability exactly 0)
    r.logits = r.logits.index_fill(1, torch::tensor({dead_expert}, torch::kLong).to(r.logits.device()),
                                   -std::numeric_limits<float>::infinity());
  torch::Tensor aux_scores;   // (N, E) the scores the load-balancing loss weighs
  if (score_function == "sigmoid") {
    auto scores = torch::sigmoid(r.logits);   // (N, E); a dead expert's -inf logit scores 0
    auto for_routing = scores;
    if (enable_expert_bias) for_routing = scores + expert_bias;
    if (dead_expert >= 0)   // still never chosen, whatever its bias
      for_routing = for_routing.index_fill(1, torch::tensor({dead_expert}, torch::kLong).to(scores.device()),
                                           -std::numeric_limits<float>::infinity());
    r.top_idx = std::get<1>(for_routing.topk(top_k, -1));   // (N, K)
    auto top = scores.gather(1, r.top_idx);
    r.top_probs = top_k > 1 ? top / (top.sum(-1, /*keepdim=*/true) + 1e-20) : top;
    aux_scores = top_k > 1 ? scores / (scores.sum(-1, true) + 1e-20) : scores;
  } else {
    auto [top_logits, top_idx] = r.logits.topk(top_k, -1);           // (N, K) each, descending
    r.top_idx = top_idx;
    r.top_probs = torch::softmax(top_logits, -1);
    aux_scores = torch::softmax(r.logits, -1);
  }
  auto counts = torch::bincount(r.top_idx.reshape(-1), {}, n_experts);  // (E) int64
  auto counts_cpu = counts.to(torch::kCPU);
  r.tokens_per_expert.assign(counts_cpu.data_ptr<int64_t>(),
                             counts_cpu.data_ptr<int64_t>() + n_experts);
  if (enable_expert_bias && is_training() && torch::GradMode::is_enabled()) {
    torch::NoGradGuard no_grad;
    local_tokens_per_expert += counts.to(torch::kFloat);
  }

  r.aux_loss = torch::zeros({}, r.logits.options());
  if (aux_loss_coeff > 0.0) {
    // Megatron's switch_load_balancing_loss_func; tokens_e carries no gradient.
    auto prob_per_expert = aux_scores.sum(0);  // (E)
    const double scale =
        double(n_experts) * aux_loss_coeff / (double(top_k) * double(N) * double(N));
    r.aux_loss = r.aux_loss + (prob_per_expert * counts.to(torch::kFloat)).sum() * scale;
  }
  if (z_loss_coeff > 0.0) {
    r.aux_loss = r.aux_loss + torch::logsumexp(r.logits, -1).pow(2).mean() * z_loss_coeff;
  }
  return r;
}

torch::Tensor MoELayerImpl::dispatch(const torch::Tensor& x, const RouterOutput& r) {
  const int64_t N = x.size(0), C = x.size(1), NK = N * top_k;
  auto pair_expert = r.top_idx.reshape({NK});  // pair p = n*K + j -> expert
  // Stable: within an expert, pairs stay in (token, slot) order.
  auto perm = std::get<1>(torch::sort(pair_expert, /*stable=*/c10::optional<bool>(true),
                                      /*dim=*/0));  // sorted pos -> pair
  auto inv_perm = torch::empty_like(perm).scatter_(0, perm, torch::arange(NK, perm.options()));

  // Each token's row repeated K times (pair order), then permuted: no repeated gather index.
  auto x_pairs = x.unsqueeze(1).expand({N, top_k, C}).reshape({NK, C});
  auto x_sorted = x_pairs.index_select(0, perm);  // (NK, C), grouped by expert
  auto slices = x_sorted.split_with_sizes(r.tokens_per_expert, 0);
  std::vector<torch::Tensor> outs;
  outs.reserve(slices.size());
  for (int64_t e = 0; e < n_experts; ++e) {
    if (r.tokens_per_expert[e] == 0) continue;  // not run: no grad for its params
    outs.push_back(experts[e]->forward(slices[e]));
  }
  auto y_pairs = torch::cat(outs, 0).index_select(0, inv_perm);  // (NK, C), pair order
  auto weighted = (y_pairs.to(torch::kFloat) * r.top_probs.reshape({NK, 1})).view({N, top_k, C});
  auto combined = weighted.select(1, 0);
  for (int64_t j = 1; j < top_k; ++j) combined = combined + weighted.select(1, j);
  return num.act(combined);  // (N, C)
}

}  // namespace rh::models
