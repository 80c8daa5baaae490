// The dense building blocks of the MoE transformer: a bias-free linear weight, RMSNorm, RoPE and
// causal multi-head self-attention. Parameters are created uninitialized here; the model fills
// every one of them from its seeded generator in registration order (moe_transformer.cpp).
#pragma once
#include <torch/torch.h>

#include "models/model.h"
#include "models/numerics.h"

namespace rh::models {

// Holds one (out, in) matrix registered as "weight", so parameter names read "<owner>.weight"
// like Megatron's. No bias; torch::nn::Linear is avoided because its constructor draws its own
// init from the global generator.
struct NoBiasLinearImpl : torch::nn::Module {
  NoBiasLinearImpl(int64_t in_features, int64_t out_features, const Numerics& num, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& x) { return num.linear(x, weight); }   // (.., in) -> (.., out)
  Numerics num;
  torch::Tensor weight;   // (out, in) in num.param_dtype
};
TORCH_MODULE(NoBiasLinear);

// Token embedding table registered as "weight" (V, C). The lookup reads an fp32 view of the table
// so that the gradient of a token seen many times accumulates in fp32 and is rounded to the param
// dtype once (a bf16 lookup would accumulate in bf16).
struct TokenEmbeddingImpl : torch::nn::Module {
  TokenEmbeddingImpl(int64_t vocab_size, int64_t d_model, const Numerics& num, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& tokens);   // (B, T) int64 -> (B, T, C) compute dtype
  Numerics num;
  torch::Tensor weight;   // (V, C)
};
TORCH_MODULE(TokenEmbedding);

// y = x / sqrt(mean(x^2) + eps) * weight, statistics in fp32; weight (C) starts at ones.
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps, const Numerics& num, const torch::Device& device);
  torch::Tensor forward(const torch::Tensor& x);   // (.., C) -> (.., C) in the compute dtype
  double eps;
  Numerics num;
  torch::Tensor weight;   // (C)
};
TORCH_MODULE(RMSNorm);

// RoPE tables, rotate-half layout (Megatron/GPT-NeoX): dims i and i + D/2 form a pair rotated by
// angle t * theta^(-2i/D). Computed in double on the CPU and rounded to fp32, so every device gets
// the same bits. Both (max_len, D/2) fp32 on `device`.
struct RopeTables {
  torch::Tensor cos, sin;
};
RopeTables make_rope_tables(int64_t max_len, int64_t head_dim, double theta, const torch::Device& device);
// x: (B, H, T, D) any float dtype, T <= tables' max_len. Returns fp32 (B, H, T, D):
// out[i] = x[i] cos - x[i+D/2] sin, out[i+D/2] = x[i+D/2] cos + x[i] sin.
torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& rope);

// Pre-norm causal self-attention branch: qkv projection, RoPE on q and k, softmax(q k^T / sqrt(D))
// with a causal mask, dropout on the probabilities, output projection. The residual add and the
// hidden-state dropout belong to the block.
struct CausalSelfAttentionImpl : torch::nn::Module {
  CausalSelfAttentionImpl(const ModelConfig& cfg, const Numerics& num, const torch::Device& device);
  // x: (B, T, C) compute dtype -> (B, T, C) compute dtype. gen: drawn from when training.
  torch::Tensor forward(const torch::Tensor& x, torch::Generator* gen);
  int64_t n_heads, head_dim;
  double attn_dropout;
  Numerics num;
  NoBiasLinear qkv{nullptr};    // weight (3C, C): rows [q; k; v], each head-major (H, D)
  NoBiasLinear proj{nullptr};   // weight (C, C)
  RopeTables rope;              // not parameters: derived from the config
  torch::Tensor causal_mask;    // (seq_len, seq_len) bool, true where a key lies in the future
};
TORCH_MODULE(CausalSelfAttention);

}   // namespace rh::models
