// The Mixture-of-Experts feed-forward: a top-k router with Megatron's load-balancing and z-losses,
// SwiGLU experts, optional token dropping, and a deterministic dispatch. route() and dispatch() are public so the
// tests can check each against a slow reference.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "models/layers.h"

namespace rh::models {

// SwiGLU MLP: h = x W1^T (2F wide), y = (silu(h[:F]) * h[F:]) W2^T.
struct ExpertImpl : torch::nn::Module {
  ExpertImpl(int64_t d_model, int64_t ffn_hidden, const Numerics& num, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& x);   // (n, C) -> (n, C), compute dtype
  int64_t ffn_hidden;
  Numerics num;
  NoBiasLinear fc1{nullptr};   // weight (2F, C): rows [gate; up]
  NoBiasLinear fc2{nullptr};   // weight (C, F)
};
TORCH_MODULE(Expert);

// moe_utils.py get_capacity(num_tokens, num_experts, capacity_factor) as
// apply_router_token_dropping calls it (num_tokens = N*K, no min_capacity):
// ceil((num_tokens / num_experts) * capacity_factor) in double, as Python computes it.
int64_t expert_capacity(int64_t num_tokens, int64_t num_experts, double capacity_factor);

// Which token-expert pairs survive token dropping (moe_utils.py apply_router_token_dropping,
// without pad_to_capacity): (N, K) bool, pair (n, j) kept iff token n is among the first
// `capacity` tokens of expert top_idx[n, j] when that expert's column is ordered by key: "probs":
// routing_probs[n, e] descending; "position": routing_map[n, e] descending, i.e. routed tokens
// first. Upstream takes torch.topk(..., dim=0, sorted=False), whose order among equal keys is
// unspecified; here ties go to the lower token index (a stable descending sort), so "position"
// keeps the first `capacity` routed tokens in token order. capacity > N keeps everything, as
// upstream's `if expert_capacity > num_tokens`.
torch::Tensor capacity_keep_mask(const torch::Tensor& top_idx, const torch::Tensor& top_probs, int64_t n_experts,
                                 int64_t capacity, const std::string& policy);
// The capacity mask itself, (N, E) bool: column e marks the `capacity` tokens expert e keeps under
// the same key and tie rule (all N when capacity > N). With --moe-pad-expert-input-to-capacity
// this is the routing map (apply_router_token_dropping: `final_map = capacity_mask`): every
// expert processes exactly `capacity` tokens, those it was not routed with at probability 0.
torch::Tensor capacity_mask(const torch::Tensor& top_idx, const torch::Tensor& top_probs, int64_t n_experts,
                            int64_t capacity, const std::string& policy);

struct RouterOutput {
  torch::Tensor logits;                     // (N, E) in the router dtype (fp32, fp64, or the input's)
  torch::Tensor top_idx;                    // (N, K) int64, experts in descending logit order
  torch::Tensor top_probs;                  // (N, K) in the logits' dtype (router.py: probs.type_as
                                            // (logits)): softmax over the K chosen logits, or the K
                                            // sigmoid scores normalised to sum 1; 0 for a dropped pair
  torch::Tensor kept;                       // (N, K) bool: false for a pair token dropping removed
  torch::Tensor padded_map;                 // (N, E) bool, only with pad_to_capacity: the tokens
                                            // each expert processes (capacity_mask)
  torch::Tensor aux_loss;                   // () fp32: load-balancing + z-loss, coefficients applied
  std::vector<int64_t> tokens_per_expert;   // (E), kept token-expert pairs routed to each expert
                                            // (with pad_to_capacity: the rows each expert runs,
                                            // padded_map's column sums, as upstream's routing_map)
};

struct MoELayerImpl : torch::nn::Module {
  MoELayerImpl(const ModelConfig& cfg, const Numerics& num, const torch::Device& device);

  // x: (N, C). Router logits x W_r^T in fp32 (input jittered by U(1-j, 1+j) from gen when
  // training), then moe_utils.py topk_routing_with_score_function: softmax: top-k of the logits,
  // softmax over them; sigmoid: scores = sigmoid(logits), top-k of scores (+ expert_bias when
  // enabled: the bias picks the experts, the gate weights are the unbiased scores), probs =
  // scores / (sum + 1e-20) when K > 1. Losses (compute_routing_scores_for_aux_loss: aux scores
  // softmax(logits), or for sigmoid sigmoid(logits) / (sum + 1e-20) for every K; tokens_e counts
  // the top-k of those aux scores, so the expert bias never enters the loss):
  //   aux = E * aux_coeff / (K * N^2) * sum_e(sum_n score[n, e] * tokens_e)
  //       + z_coeff * mean_n(logsumexp(logits[n])^2)
  // With capacity_factor >= 0, token dropping follows (capacity_keep_mask on N*K pairs), after
  // the aux-loss counts are taken (upstream's aux loss uses its own pre-drop routing map) and
  // before the expert-bias counter (router.py routing: _apply_expert_bias(routing_map) runs on
  // the map after apply_router_token_dropping).
  RouterOutput route(const torch::Tensor& x, torch::Generator* gen);

  // Dispatch: kept token-expert pairs (flattened n*K + j) are stably sorted by expert, the
  // gathered rows of each expert form one contiguous slice run through that expert (experts with
  // no rows are not run, so their params get no grad), and the outputs are put back in pair order,
  // weighted by top_probs in fp32 and summed over j = 0..K-1 in that order. A dropped pair runs
  // through no expert: its output row is 0 (and its weight 0).
  // Every gather is by a permutation (never by an index with repeats) so that neither forward
  // nor backward needs an atomic index_add: run-to-run bit-identical on CUDA as on CPU.
  // With pad_to_capacity the pairs are all (token, expert) cells of padded_map instead (each
  // expert's rows in token order, as upstream's permute of the routing map); a padded row runs
  // through its expert, and its output is weighed by probability 0, i.e. not taken (it gets a
  // zero gradient); the routed pairs are combined over j as above.
  torch::Tensor dispatch(const torch::Tensor& x, const RouterOutput& routing);   // (N, C) -> (N, C)

  std::pair<torch::Tensor, RouterOutput> forward(const torch::Tensor& x, torch::Generator* gen) {
    auto r = route(x, gen);
    auto y = dispatch(x, r);
    return {y, std::move(r)};
  }

  int64_t n_experts, top_k, dead_expert;
  std::string score_function;
  bool enable_expert_bias;
  double capacity_factor;          // < 0: dropless
  std::string token_drop_policy;   // probs | position
  bool pad_to_capacity;            // --moe-pad-expert-input-to-capacity (needs capacity_factor >= 0)
  std::string router_dtype;        // none | fp32 | fp64
  // With expert bias: router->expert_bias (E) fp32 is a registered buffer; this counter (E) fp32
  // is not (Megatron: local_tokens_per_expert, persistent=False). route() adds each training
  // forward's token-expert pairs per expert to it (router.py routing: `if self.enable_expert_bias
  // and torch.is_grad_enabled(): self.local_tokens_per_expert += routing_map.sum(dim=0)`).
  torch::Tensor local_tokens_per_expert;
  torch::Tensor expert_bias;   // the registered buffer router.expert_bias (undefined without expert bias)
  double aux_loss_coeff, z_loss_coeff, router_jitter;
  Numerics num;
  NoBiasLinear router{nullptr};   // weight (E, C)
  torch::nn::ModuleList experts_list{nullptr};
  std::vector<Expert> experts;   // the same modules as experts_list, typed

 private:
  torch::Tensor router_logits(const torch::Tensor& x, torch::Generator* gen);   // (N, E)
  torch::Tensor z_loss(const torch::Tensor& logits) const;                      // in the logits' dtype, scalar
  torch::Tensor score_and_pick(RouterOutput& routing);   // fills top_idx, top_probs; returns aux scores
  void drop_tokens(RouterOutput& routing);               // fills kept (and padded_map), zeroes dropped probs
  torch::Tensor dispatch_padded(const torch::Tensor& x, const RouterOutput& routing);
};
TORCH_MODULE(MoELayer);

}   // namespace rh::models
