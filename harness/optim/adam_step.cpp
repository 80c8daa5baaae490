// The fp32 Adam/AdamW update of one parameter, chunked so that the ~20 elementwise passes run on
// cache-resident slices instead of streaming the whole tensor from memory each time.
//
// The exact fp32 op sequence (each line one IEEE-754 fp32 operation, rounded to nearest even;
// no fused multiply-add, no double intermediates), which tests/optim_reference.h replays:
//   p = master value (fp32 / fp16 widened / joined bf16+remainder), g = main grad widened,
//   m, v = stored moments decoded (bf16 widened; fp16/fp8: decode(code) * scale).
//   L2 mode:   t = wd * p;          g = g + t
//              t1 = beta1 * m;      t2 = (1-beta1) * g;   m = t1 + t2
//              t1 = beta2 * v;      t2 = (1-beta2) * g;   t2 = t2 * g;   v = t1 + t2
//              d = v / bc2;         d = sqrt(d);          d = d + eps
//              u = m / bc1;         u = u / d
//   AdamW:     t = wd * p;          u = u + t
//              u = lr * u;          p = p - u
// This is TE's AdamFunctor / AdamFunctorMaster / AdamFunctorMasterParamRemainder
// (transformer_engine/common/multi_tensor/adam.cu @d0067d0 (TE main)) without the GPU's FMA contraction.
// The new fp32 m and v feed the update; storage is applied afterwards as FusedAdam.step() does
// (fused_adam.py @d0067d0, "Scaling" loop -> _apply_scale): bf16 by RNE cast, fp16/fp8 moments and
// an fp16 master by the whole tensor's Scaling (storage_codecs.h). The model param is written from
// the new fp32 master inside the kernel (`p[i] = static_cast<PARAM_T>(r_p[ii])`), for an fp16
// master too. NaN results are made the GPU's canonical NaN (storage_codecs.h, canonicalize_nan_).
// Scalars are fp32 values (StepScalars) passed as 0-dim fp32 tensors, so every op is fp32 op
// fp32 (and were a kernel to compute in double, double rounding is innocuous for + - * / sqrt
// of fp32 operands: double has more than 2*24+2 bits).
#include "harness/optim/adam_step.h"

#include <cmath>
#include <limits>

namespace rh::optim::detail {
namespace {

// 65536 fp32 = 256 KiB per buffer, ~2.5 MiB live: cache-resident, and large enough that the
// per-op dispatch cost of LibTorch (a few us) stays small. Measured best of 2^14..2^17 here.
constexpr int64_t kChunk = 1 << 16;

torch::Tensor flat(const torch::Tensor& t) { return t.view({-1}); }

// Decoded fp32 values of a state slice: a view when stored fp32, else decoded into `buf`
// (fp16: float(code) * scale; fp8: float(code) * scale_inv). NaN payloads are left as they are:
// every use feeds arithmetic whose results are canonicalized.
torch::Tensor load_state(const StoredState& state, int64_t start, int64_t len, const torch::Tensor& buf,
                         const torch::Tensor& idx_buf) {
  auto raw = flat(state.data).narrow(0, start, len);
  if (state.dtype == Dtype::fp32) return raw;
  auto out = buf.narrow(0, 0, len);
  if (state.dtype == Dtype::fp8) {
    codec::fp8_decode_into(raw, out, idx_buf.narrow(0, 0, len), state.decode_mult());
    return out;
  }
  out.copy_(raw);   // bf16 / fp16 widening is exact
  if (state.dtype == Dtype::fp16) out.mul_(torch::scalar_tensor(state.decode_mult(), torch::kFloat));
  return out;
}

// Where the new fp32 moment goes: into fp32 storage directly, a chunk buffer (bf16: cast after),
// or the full-length buffer (fp16/fp8: encoded once the whole tensor's amax is known).
torch::Tensor moment_dest(const StoredState& state, int64_t start, int64_t len, const torch::Tensor& buf,
                          const torch::Tensor& full) {
  if (state.dtype == Dtype::fp32) return flat(state.data).narrow(0, start, len);
  if (is_scaled(state.dtype)) return full.narrow(0, start, len);
  return buf.narrow(0, 0, len);
}

void track_amax(float& running_amax, const torch::Tensor& x) {
  const float amax = codec::abs_max(x);
  if (std::isnan(amax) || std::isnan(running_amax)) running_amax = std::numeric_limits<float>::quiet_NaN();
  else running_amax = std::max(running_amax, amax);
}

}   // namespace

// Scale from the whole tensor's amax, then encode chunk by chunk.
void store_scaled(StoredState& state, const torch::Tensor& full, float amax, bool guard, Workspace& ws) {
  ws.ensure(kChunk, 0);   // chunk buffers (a no-op inside adam_update, which ensured them)
  const bool fp8 = state.dtype == Dtype::fp8;
  const codec::Scaling scaling = codec::make_scaling(amax, fp8, guard);
  state.scale = scaling.scale;
  if (fp8) state.scale_inv = scaling.scale_inv;
  auto dst = flat(state.data);
  const int64_t n = dst.numel();
  for (int64_t start = 0; start < n; start += ws.chunk) {
    const int64_t len = std::min(ws.chunk, n - start);
    codec::encode_scaled_into(full.narrow(0, start, len), dst.narrow(0, start, len), fp8, scaling,
                              ws.t1.narrow(0, 0, len), ws.fp8, !std::isfinite(amax));
  }
}

StepScalars make_step_scalars(const OptimizerConfig& cfg, double group_weight_decay, double lr, int64_t step) {
  StepScalars scalars{};
  scalars.beta1 = static_cast<float>(cfg.beta1);
  scalars.one_minus_beta1 = 1.0f - scalars.beta1;
  scalars.beta2 = static_cast<float>(cfg.beta2);
  scalars.one_minus_beta2 = 1.0f - scalars.beta2;
  // adam.cu: `bias_correction1 = 1 - std::pow(beta1, step)` with `const float beta1` and
  // `const int step`: std::pow(float, int) promotes both to double.
  const double t = static_cast<double>(step);
  scalars.bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(scalars.beta1), t));
  scalars.bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(scalars.beta2), t));
  scalars.eps = static_cast<float>(cfg.eps);
  scalars.weight_decay = static_cast<float>(group_weight_decay);
  scalars.lr = static_cast<float>(lr);
  scalars.adam_w_mode = cfg.adam_w_mode;
  scalars.scale_zero_guard = cfg.scale_zero_guard;
  return scalars;
}

void Workspace::ensure(int64_t chunk_elems, int64_t full_elems) {
  if (chunk < chunk_elems) {
    chunk = chunk_elems;
    for (auto* t : {&p, &g, &m, &v, &t1, &t2}) *t = torch::empty({chunk}, torch::kFloat);
    bits = torch::empty({chunk}, torch::kInt);
    idx = torch::empty({chunk}, torch::kInt);
    fp8.ensure(chunk);
  }
  if (!m_full.defined() || m_full.numel() < full_elems) {
    m_full = torch::empty({full_elems}, torch::kFloat);
    v_full = torch::empty({full_elems}, torch::kFloat);
    p_full = torch::empty({full_elems}, torch::kFloat);
  }
}

void adam_update(ParamState& param_state, MasterMode mode, const StepScalars& scalars, Workspace& ws, Deferred* defer) {
  const int64_t n = param_state.end - param_state.begin;
  const bool m_scaled = is_scaled(param_state.exp_avg.dtype), v_scaled = is_scaled(param_state.exp_avg_sq.dtype);
  const bool p_scaled = mode == MasterMode::fp16;
  ws.ensure(kChunk, (m_scaled || v_scaled || p_scaled) && !defer ? n : 0);
  torch::Tensor m_full = ws.m_full, v_full = ws.v_full, p_full = ws.p_full;
  if (defer) {
    if (m_scaled) m_full = defer->m_full = torch::empty({n}, torch::kFloat);
    if (v_scaled) v_full = defer->v_full = torch::empty({n}, torch::kFloat);
    if (p_scaled) p_full = defer->p_full = torch::empty({n}, torch::kFloat);
  }
  // fp32 scalars as 0-dim fp32 tensors: exactly the fp32 values, and LibTorch 1.13's out= ops
  // are several times faster with a tensor operand than with a Scalar.
  auto fp32_tensor = [](float v) { return torch::scalar_tensor(v, torch::kFloat); };
  const auto beta1 = fp32_tensor(scalars.beta1), one_minus_beta1 = fp32_tensor(scalars.one_minus_beta1),
             beta2 = fp32_tensor(scalars.beta2), one_minus_beta2 = fp32_tensor(scalars.one_minus_beta2),
             bc1 = fp32_tensor(scalars.bc1), bc2 = fp32_tensor(scalars.bc2), eps = fp32_tensor(scalars.eps),
             wd = fp32_tensor(scalars.weight_decay), lr = fp32_tensor(scalars.lr);
  auto master = flat(param_state.master.data), weight = flat(param_state.param).narrow(0, param_state.begin, n),
       grad = flat(param_state.main_grad).narrow(0, param_state.begin, n);
  const bool bf16_weight = weight.scalar_type() == torch::kBFloat16;
  float m_amax = 0.0f, v_amax = 0.0f, p_amax = 0.0f;

  for (int64_t start = 0; start < n; start += ws.chunk) {
    const int64_t len = std::min(ws.chunk, n - start);
    auto cut = [&](const torch::Tensor& t) { return t.narrow(0, 0, len); };
    auto master_chunk = master.narrow(0, start, len), weight_chunk = weight.narrow(0, start, len);
    auto t1 = cut(ws.t1), t2 = cut(ws.t2);

    torch::Tensor p;   // fp32 master value of this slice
    if (mode == MasterMode::fp32) {
      p = master_chunk;
    } else if (mode == MasterMode::fp16) {   // get_unscaled_state: float(code) * scale
      p = load_state(param_state.master, start, len, ws.p, ws.idx);
    } else {   // join the bf16 weight and the remainder (see storage_codecs.h)
      auto bits = cut(ws.bits);
      codec::remainder_join_into(weight_chunk, master_chunk, bits);
      p = bits.view(torch::kFloat);
    }
    torch::Tensor g = grad.narrow(0, start, len);
    if (g.scalar_type() != torch::kFloat || !scalars.adam_w_mode) {
      auto g_fp32 = cut(ws.g);
      if (!scalars.adam_w_mode) {   // L2: g = g + wd * p (local; the main grad is left as it was)
        at::mul_out(t1, p, wd);
        at::add_out(g_fp32, g, t1);
      } else {
        g_fp32.copy_(g);
      }
      g = g_fp32;
    }
    auto m = load_state(param_state.exp_avg, start, len, ws.m, ws.idx);
    auto v = load_state(param_state.exp_avg_sq, start, len, ws.v, ws.idx);

    auto m_new = moment_dest(param_state.exp_avg, start, len, ws.m, m_full);
    at::mul_out(t1, m, beta1);
    at::mul_out(t2, g, one_minus_beta1);
    at::add_out(m_new, t1, t2);
    auto v_new = moment_dest(param_state.exp_avg_sq, start, len, ws.v, v_full);
    at::mul_out(t1, v, beta2);
    at::mul_out(t2, g, one_minus_beta2);
    at::mul_out(t2, t2, g);
    at::add_out(v_new, t1, t2);

    at::div_out(t1, v_new, bc2);
    at::sqrt_out(t1, t1);
    at::add_out(t1, t1, eps);
    at::div_out(t2, m_new, bc1);
    at::div_out(t2, t2, t1);
    if (scalars.adam_w_mode) {
      at::mul_out(t1, p, wd);
      at::add_out(t2, t2, t1);
    }
    at::mul_out(t2, t2, lr);

    // The new fp32 master: in its storage (fp32), the full-length buffer (fp16: scaled once the
    // whole tensor's amax is known), or the joined bits (remainders: split below).
    torch::Tensor p_new = mode == MasterMode::fp32   ? master_chunk
                          : mode == MasterMode::fp16 ? p_full.narrow(0, start, len)
                                                     : p;
    at::sub_out(p_new, p, t2);
    // A NaN anywhere in m, v or the update reaches p_new, so one check of p_new finds them all.
    const bool nan = codec::canonicalize_nan_(p_new);
    if (nan) {
      codec::canonicalize_nan_(m_new);
      codec::canonicalize_nan_(v_new);
    }
    if (mode == MasterMode::remainders) {   // split into the bf16 weight (ties away) and remainder
      codec::remainder_split_into(cut(ws.bits), weight_chunk, master_chunk, cut(ws.idx));
    } else {
      weight_chunk.copy_(p_new);   // bf16 params: RNE cast; fp32 params: copy
      if (nan && bf16_weight) codec::canonical_nan_16_(weight_chunk, p_new);
    }

    for (auto [state, val] :
         {std::pair<StoredState*, torch::Tensor*>{&param_state.exp_avg, &m_new}, {&param_state.exp_avg_sq, &v_new}})
      if (state->dtype == Dtype::bf16) {
        auto dst = flat(state->data).narrow(0, start, len);
        dst.copy_(*val);
        if (nan) codec::canonical_nan_16_(dst, *val);
      }
    if (m_scaled) track_amax(m_amax, m_new);
    if (v_scaled) track_amax(v_amax, v_new);
    if (p_scaled) track_amax(p_amax, p_new);
  }
  if (defer) {
    defer->m_amax = m_amax;
    defer->v_amax = v_amax;
    defer->p_amax = p_amax;
    return;
  }
  if (m_scaled) store_scaled(param_state.exp_avg, ws.m_full.narrow(0, 0, n), m_amax, scalars.scale_zero_guard, ws);
  if (v_scaled) store_scaled(param_state.exp_avg_sq, ws.v_full.narrow(0, 0, n), v_amax, scalars.scale_zero_guard, ws);
  if (p_scaled) store_scaled(param_state.master, ws.p_full.narrow(0, 0, n), p_amax, scalars.scale_zero_guard, ws);
}

}   // namespace rh::optim::detail
