// The Mixture-of-Experts feed-forward: a top-k router with Megatron's load-balancing and z-losses,
// SwiGLU experts, and a dropless, deterministic dispatch. route() and dispatch() are public so the
// tests can check each against a slow reference.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "models/layers.h"

namespace rh::models {

// SwiGLU MLP: h = x W1^T (2F wide), y = (silu(h[:F]) * h[F:]) W2^T.
struct ExpertImpl : torch::nn::Module {
  ExpertImpl(int64_t d_model, int64_t ffn_hidden, const Numerics& num, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& x);  // (n, C) -> (n, C), compute dtype
  int64_t ffn_hidden;
  Numerics num;
  NoBiasLinear fc1{nullptr};  // weight (2F, C): rows [gate; up]
  NoBiasLinear fc2{nullptr};  // weight (C, F)
};
TORCH_MODULE(Expert);

struct RouterOutput {
  torch::Tensor logits;                    // (N, E) fp32
  torch::Tensor top_idx;                   // (N, K) int64, experts in descending logit order
  torch::Tensor top_probs;                 // (N, K) fp32: softmax over the K chosen logits, or
                                           // the K sigmoid scores normalised to sum 1
  torch::Tensor aux_loss;                  // () fp32: load-balancing + z-loss, coefficients applied
  std::vector<int64_t> tokens_per_expert;  // (E), token-expert pairs routed to each expert
};

struct MoELayerImpl : torch::nn::Module {
  MoELayerImpl(const ModelConfig& cfg, const Numerics& num, const torch::Device& device);

  // x: (N, C). Router logits x W_r^T in fp32 (input jittered by U(1-j, 1+j) from gen when
  // training), then moe_utils.py topk_routing_with_score_function: softmax: top-k of the logits,
  // softmax over them; sigmoid: scores = sigmoid(logits), top-k of scores (+ expert_bias when
  // enabled: the bias picks the experts, the gate weights are the unbiased scores), probs =
  // scores / (sum + 1e-20) when K > 1. Losses (aux scores: softmax(logits), or for sigmoid the
  // sigmoid scores normalised the same way, compute_routing_scores_for_aux_loss):
  //   aux = E * aux_coeff / (K * N^2) * sum_e(sum_n score[n, e] * tokens_e)
  //       + z_coeff * mean_n(logsumexp(logits[n])^2)
  RouterOutput route(const torch::Tensor& x, torch::Generator* gen);

  // Dropless dispatch: token-expert pairs (flattened n*K + j) are stably sorted by expert, the
  // gathered rows of each expert form one contiguous slice run through that expert (experts with
  // no rows are not run, so their params get no grad), and the outputs are put back in pair order,
  // weighted by top_probs in fp32 and summed over j = 0..K-1 in that order.
  // Every gather is by a permutation (never by an index with repeats) so that neither forward
  // nor backward needs an atomic index_add: run-to-run bit-identical on CUDA as on CPU.
  torch::Tensor dispatch(const torch::Tensor& x, const RouterOutput& r);  // (N, C) -> (N, C)

  std::pair<torch::Tensor, RouterOutput> forward(const torch::Tensor& x, torch::Generator* gen) {
    auto r = route(x, gen);
    auto y = dispatch(x, r);
    return {y, std::move(r)};
  }

  int64_t n_experts, top_k, dead_expert;
  std::string score_function;
  bool enable_expert_bias;
  // With expert bias: router->expert_bias (E) fp32 is a registered buffer; this counter (E) fp32
  // is not (Megatron: local_tokens_per_expert, persistent=False). route() adds each training
  // forward's token-expert pairs per expert to it (router.py routing: `if self.enable_expert_bias
  // and torch.is_grad_enabled(): self.local_tokens_per_expert += routing_map.sum(dim=0)`).
  torch::Tensor local_tokens_per_expert;
  torch::Tensor expert_bias;   // the registered buffer router.expert_bias (undefined without expert bias)
  double aux_loss_coeff, z_loss_coeff, router_jitter;
  Numerics num;
  NoBiasLinear router{nullptr};  // weight (E, C)
  torch::nn::ModuleList experts_list{nullptr};
  std::vector<Expert> experts;  // the same modules as experts_list, typed
};
TORCH_MODULE(MoELayer);

}  // namespace rh::models
