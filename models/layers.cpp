// Dense layers of the MoE transformer: see layers.h. Shapes: B batch, T sequence, C d_model,
// H heads, D head dim.
#include "models/layers.h"

#include <cmath>
#include <limits>

namespace rh::models {
namespace {

torch::TensorOptions param_options(const Numerics& num, const torch::Device& device) {
  return torch::TensorOptions().dtype(num.param_dtype).device(device);
}

}   // namespace

NoBiasLinearImpl::NoBiasLinearImpl(int64_t in_features, int64_t out_features, const Numerics& n,
                                   const torch::Device& device)
    : num(n) {
  weight = register_parameter("weight", torch::empty({out_features, in_features}, param_options(num, device)));
}

TokenEmbeddingImpl::TokenEmbeddingImpl(int64_t vocab_size, int64_t d_model, const Numerics& n,
                                       const torch::Device& device)
    : num(n) {
  weight = register_parameter("weight", torch::empty({vocab_size, d_model}, param_options(num, device)));
}

torch::Tensor TokenEmbeddingImpl::forward(const torch::Tensor& tokens) {
  return num.act(torch::embedding(weight.to(torch::kFloat), tokens));
}

RMSNormImpl::RMSNormImpl(int64_t dim, double e, const Numerics& n, const torch::Device& device) : eps(e), num(n) {
  weight = register_parameter("weight", torch::empty({dim}, param_options(num, device)));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  auto xf = x.to(torch::kFloat);
  auto inv_rms = torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return num.act(xf * inv_rms * weight.to(torch::kFloat));
}

RopeTables make_rope_tables(int64_t max_len, int64_t head_dim, double theta, const torch::Device& device) {
  auto f64 = torch::TensorOptions().dtype(torch::kDouble);
  auto inv_freq = torch::pow(theta, -torch::arange(0, head_dim, 2, f64) / double(head_dim));   // (D/2)
  auto angles = torch::outer(torch::arange(max_len, f64), inv_freq);                           // (T, D/2)
  return {angles.cos().to(torch::kFloat).to(device), angles.sin().to(torch::kFloat).to(device)};
}

torch::Tensor apply_rope(const torch::Tensor& x, const RopeTables& rope) {
  const int64_t T = x.size(-2), half = x.size(-1) / 2;
  TORCH_CHECK(T <= rope.cos.size(0), "apply_rope: sequence length ", T, " exceeds the RoPE table (", rope.cos.size(0),
              ")");
  TORCH_CHECK(half == rope.cos.size(1), "apply_rope: head dim ", x.size(-1), " does not match the table");
  auto xf = x.to(torch::kFloat);
  auto x1 = xf.narrow(-1, 0, half), x2 = xf.narrow(-1, half, half);   // (B, H, T, D/2)
  auto c = rope.cos.narrow(0, 0, T), s = rope.sin.narrow(0, 0, T);    // (T, D/2)
  return torch::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1);
}

CausalSelfAttentionImpl::CausalSelfAttentionImpl(const ModelConfig& cfg, const Numerics& n, const torch::Device& device)
    : n_heads(cfg.n_heads), head_dim(cfg.d_model / cfg.n_heads), attn_dropout(cfg.dropout), num(n) {
  qkv = register_module("qkv", NoBiasLinear(cfg.d_model, 3 * cfg.d_model, num, device));
  proj = register_module("proj", NoBiasLinear(cfg.d_model, cfg.d_model, num, device));
  rope = make_rope_tables(cfg.seq_len, head_dim, cfg.rope_theta, device);
  causal_mask =
      torch::ones({cfg.seq_len, cfg.seq_len}, torch::TensorOptions().dtype(torch::kBool).device(device)).triu(1);
}

torch::Tensor CausalSelfAttentionImpl::forward(const torch::Tensor& x, torch::Generator* gen) {
  const int64_t B = x.size(0), T = x.size(1), C = x.size(2);
  // (B, T, 3C) -> (3, B, H, T, D)
  auto qkv_out = qkv(x).view({B, T, 3, n_heads, head_dim}).permute({2, 0, 3, 1, 4});
  auto q = num.act(apply_rope(qkv_out[0], rope));   // (B, H, T, D)
  auto k = num.act(apply_rope(qkv_out[1], rope));
  auto v = qkv_out[2];
  // Scores are a matmul output (bf16 in a bf16 model); scale, mask and softmax run in fp32.
  auto scores = num.act(torch::matmul(q, k.transpose(-2, -1))).to(torch::kFloat);   // (B, H, T, T)
  scores = (scores * (1.0 / std::sqrt(double(head_dim))))
               .masked_fill(causal_mask.narrow(0, 0, T).narrow(1, 0, T), -std::numeric_limits<float>::infinity());
  auto probs = num.act(dropout_fp32(torch::softmax(scores, -1), attn_dropout, is_training(), gen));
  auto ctx = num.act(torch::matmul(probs, v));           // (B, H, T, D)
  return proj(ctx.transpose(1, 2).reshape({B, T, C}));   // (B, T, C)
}

}   // namespace rh::models
