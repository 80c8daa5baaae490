// Scalar reference of the precision-aware Adam (test oracle). Independent of LibTorch: Eigen
// arrays of fp32 values and raw bit patterns, its own bf16 rounding, fp16 through Eigen::half,
// its own E4M3 codec (a search over the format's values, not bit tricks) and its own remainder
// split/join written literally from the rule. Same fp32 op order as harness/optim/adam_step.cpp;
// the build has no FMA contraction (x86-64 baseline, no -march), so each line rounds once.
// The rules it follows, each written from the upstream source (TransformerEngine):
//  - bias correction: adam.cu, multi_tensor_adam*_cuda: 1 - std::pow(float beta, int step), i.e.
//    pow in double of the fp32 beta, rounded once to fp32;
//  - scaling: fused_adam.py FusedAdam._apply_scale / get_unscaled_state: scale = amax / range;
//    fp16 code = fp16(x * (scale > 0 ? 1/scale : 0)), value = code * scale; fp8 quantizer scale
//    1/scale, code = E4M3(x * qscale) (vectorized_pointwise.h unary_kernel), scale_inv =
//    1/qscale (utils.cuh reciprocal<float>), value = code * scale_inv (dequantize_fp8.cuh);
//  - fp16 master: scaled like an fp16 moment; the model weight is the new fp32 master cast
//    (adam.cu AdamFunctorMaster: p[i] = static_cast<PARAM_T>(r_p[ii]));
//  - GPU NaN: every NaN result is 0x7FFFFFFF, cast to 0x7FFF (bf16, fp16) or 0x7F (E4M3).
#pragma once
#include <Eigen/Core>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace rh::optim_ref {

inline uint32_t f2u(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float u2f(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// --- bf16 ---
inline uint16_t bf16_rne(float f) {
  const uint32_t u = f2u(f);
  if (std::isnan(f)) return 0x7FFF;   // __float2bfloat16: canonical NaN
  return static_cast<uint16_t>((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_f(uint16_t b) { return u2f(static_cast<uint32_t>(b) << 16); }
// Round to bf16, nearest with ties away from zero, by comparing distances in double.
inline uint16_t bf16_ties_away(float f) {
  const uint32_t u = f2u(f);
  const uint16_t lo = static_cast<uint16_t>(u >> 16), hi = static_cast<uint16_t>(lo + 1);
  const double x = std::fabs(static_cast<double>(f));
  const double dlo = x - std::fabs(static_cast<double>(bf16_to_f(lo)));
  // Past the largest finite bf16 the next step up is 2^128 (which rounds to inf).
  const double hv = (hi & 0x7FFF) == 0x7F80 ? std::ldexp(1.0, 128) : std::fabs(static_cast<double>(bf16_to_f(hi)));
  const double dhi = hv - x;
  return dlo < dhi ? lo : hi;   // tie -> hi, the larger magnitude
}

// --- fp16 (Eigen::half converts with round-to-nearest-even) ---
inline uint16_t fp16_rne(float f) {
  if (std::isnan(f)) return 0x7FFF;   // __float2half: canonical NaN
  return Eigen::numext::bit_cast<uint16_t>(Eigen::half(f));
}
// The GPU's NaN result of fp32 arithmetic.
inline float canon(float f) { return std::isnan(f) ? u2f(0x7FFFFFFFu) : f; }
inline float fp16_to_f(uint16_t b) { return static_cast<float>(Eigen::numext::bit_cast<Eigen::half>(b)); }

// --- E4M3 (FN: no inf, 0x7F/0xFF NaN, max 448) ---
inline float e4m3_decode(uint8_t c) {
  const int sign = c >> 7, exp = (c >> 3) & 15, man = c & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  const double mag = exp == 0 ? (man / 8.0) * std::pow(2.0, -6) : (1.0 + man / 8.0) * std::pow(2.0, exp - 7);
  return static_cast<float>(sign ? -mag : mag);
}
// Nearest of the 127 non-negative finite values (codes 0..0x7E are increasing), ties to the
// even code; beyond 448 saturate; NaN -> 0x7F; sign bit copied.
inline uint8_t e4m3_encode(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return 0x7F | sign;
  const double a = std::fabs(static_cast<double>(x));
  if (a >= 448.0) return 0x7E | sign;
  int lo = 0, hi = 0x7E;   // largest code with value <= a
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (e4m3_decode(static_cast<uint8_t>(mid)) <= a) lo = mid;
    else hi = mid - 1;
  }
  const double dlo = a - e4m3_decode(static_cast<uint8_t>(lo));
  const double dhi = e4m3_decode(static_cast<uint8_t>(lo + 1)) - a;
  int c = dlo < dhi ? lo : dhi < dlo ? lo + 1 : (lo % 2 == 0 ? lo : lo + 1);
  return static_cast<uint8_t>(c) | sign;
}

// --- remainder split / join, literally as the rule reads ---
inline void split(float master, uint16_t& weight, int16_t& rem) {
  const uint32_t u = f2u(master);
  weight = static_cast<uint16_t>(u >> 16);
  rem = static_cast<int16_t>(static_cast<uint16_t>(u & 0xFFFFu));
  if (rem < 0) weight = static_cast<uint16_t>(weight + 1);
}
inline float join(uint16_t weight, int16_t rem) {
  if (rem < 0) weight = static_cast<uint16_t>(weight - 1);
  return u2f((static_cast<uint32_t>(weight) << 16) | static_cast<uint16_t>(rem));
}

// --- the optimizer ---
enum class Fmt { fp32, bf16, fp16, fp8 };
enum class Master { fp32, fp16, remainders };

// One stored tensor: raw bit patterns zero-extended to 32 bits, plus TE's scale / scale_inv.
struct Stored {
  Fmt fmt = Fmt::fp32;
  Eigen::Array<uint32_t, Eigen::Dynamic, 1> raw;
  float scale = 1.0f, scale_inv = 1.0f;   // _initialize_state: ones
  bool guard = false;                     // scale_zero_guard
  float value(Eigen::Index i) const {
    switch (fmt) {
      case Fmt::fp32: return u2f(raw[i]);
      case Fmt::bf16: return bf16_to_f(static_cast<uint16_t>(raw[i]));
      case Fmt::fp16: return canon(fp16_to_f(static_cast<uint16_t>(raw[i])) * scale);
      case Fmt::fp8: return canon(e4m3_decode(static_cast<uint8_t>(raw[i])) * scale_inv);
    }
    return 0.0f;
  }
  void store(const Eigen::ArrayXf& x) {
    raw.resize(x.size());
    float mult = 1.0f;
    if (fmt == Fmt::fp16 || fmt == Fmt::fp8) {
      bool nan = false;
      float amax = 0.0f;
      for (Eigen::Index i = 0; i < x.size(); ++i) {
        nan |= std::isnan(x[i]);
        amax = std::max(amax, std::fabs(x[i]));
      }
      if (nan) amax = std::numeric_limits<float>::quiet_NaN();
      scale = canon(amax / (fmt == Fmt::fp16 ? 32752.0f : 448.0f));
      const float r = 1.0f / scale;
      const bool unusable = !std::isfinite(r);
      if (fmt == Fmt::fp16) {
        mult = (scale > 0.0f && !(guard && unusable)) ? r : 0.0f;
        scale_inv = scale;
      } else {
        mult = canon((guard && unusable && !std::isnan(scale)) ? 1.0f : r);
        scale_inv = canon(1.0f / mult);
      }
    }
    for (Eigen::Index i = 0; i < x.size(); ++i) {
      switch (fmt) {
        case Fmt::fp32: raw[i] = f2u(x[i]); break;
        case Fmt::bf16: raw[i] = bf16_rne(x[i]); break;
        case Fmt::fp16: raw[i] = fp16_rne(canon(x[i] * mult)); break;
        case Fmt::fp8: raw[i] = e4m3_encode(canon(x[i] * mult)); break;
      }
    }
  }
};

struct Config {
  Master master = Master::fp32;
  Fmt exp_avg = Fmt::fp32, exp_avg_sq = Fmt::fp32;
  bool bf16_main_grads = false, bf16_params = true, adam_w = true;
  bool scale_zero_guard = false;
  double beta1 = 0.9, beta2 = 0.95, eps = 1e-8;
};

struct Param {
  int group = 0;
  Eigen::ArrayXf master32;                            // Master::fp32
  Stored half;                                        // Master::fp16: scaled fp16 codes
  Eigen::Array<uint16_t, Eigen::Dynamic, 1> weight;   // bf16 model param bits (bf16 params)
  Eigen::ArrayXf weight32;                            // fp32 model param (fp32 params)
  Eigen::Array<int16_t, Eigen::Dynamic, 1> rem;       // Master::remainders
  Stored m, v;
  Eigen::ArrayXf main_grad;   // fp32 values (bf16-exact in bf16 mode)
  bool has_grad = false;
  Eigen::ArrayXf last_m, last_v;   // fp32 moments of the last update
};

class Adam {
 public:
  Config cfg;
  std::vector<double> group_wd;
  std::vector<int64_t> steps;
  std::vector<Param> params;

  Adam(Config c, std::vector<double> wd) : cfg(c), group_wd(wd), steps(wd.size(), 0) {}

  // `init` are fp32 values (bf16-exact when params are bf16).
  void add_param(int group, const Eigen::ArrayXf& init) {
    Param p;
    p.group = group;
    const auto n = init.size();
    if (cfg.bf16_params) p.weight = init.unaryExpr([](float f) { return bf16_rne(f); });
    else p.weight32 = init;
    if (cfg.master == Master::fp32) p.master32 = init;
    p.half.fmt = Fmt::fp16;
    p.half.guard = p.m.guard = p.v.guard = cfg.scale_zero_guard;
    if (cfg.master == Master::fp16) p.half.store(init);   // set_scaled_state(param.float())
    if (cfg.master == Master::remainders) p.rem = Eigen::Array<int16_t, Eigen::Dynamic, 1>::Zero(n);
    p.m.fmt = cfg.exp_avg;
    p.v.fmt = cfg.exp_avg_sq;
    // Zeros with the initial scale 1 (not through store(): a fresh state is not _apply_scale'd).
    p.m.raw = p.v.raw = Eigen::Array<uint32_t, Eigen::Dynamic, 1>::Zero(n);
    p.main_grad = Eigen::ArrayXf::Zero(n);
    params.push_back(std::move(p));
  }
  void zero_grads() {
    for (auto& p : params) p.main_grad.setZero(), p.has_grad = false;
  }
  // `grad` holds the values of param.grad (bf16-exact for bf16 params).
  void accumulate(size_t i, const Eigen::ArrayXf& grad) {
    auto& p = params[i];
    for (Eigen::Index j = 0; j < grad.size(); ++j) {
      const float s = p.main_grad[j] + grad[j];
      p.main_grad[j] = cfg.bf16_main_grads ? bf16_to_f(bf16_rne(s)) : s;
    }
    p.has_grad = true;
  }
  float master_value(const Param& p, Eigen::Index j) const {
    switch (cfg.master) {
      case Master::fp32: return p.master32[j];
      case Master::fp16: return p.half.value(j);
      case Master::remainders: return join(p.weight[j], p.rem[j]);
    }
    return 0.0f;
  }
  void step(double lr_d) {
    for (auto& s : steps) ++s;
    const float b1 = static_cast<float>(cfg.beta1), b2 = static_cast<float>(cfg.beta2);
    const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;
    const float eps = static_cast<float>(cfg.eps), lr = static_cast<float>(lr_d);
    for (auto& p : params) {
      if (!p.has_grad) continue;
      const double t = static_cast<double>(steps[p.group]);
      const float bc1 = static_cast<float>(1.0 - std::pow(static_cast<double>(b1), t));
      const float bc2 = static_cast<float>(1.0 - std::pow(static_cast<double>(b2), t));
      const float wd = static_cast<float>(group_wd[p.group]);
      const auto n = p.main_grad.size();
      Eigen::ArrayXf nm(n), nv(n), nw(n);
      for (Eigen::Index j = 0; j < n; ++j) {
        float w = master_value(p, j), g = p.main_grad[j];
        float m = p.m.value(j), v = p.v.value(j);
        if (!cfg.adam_w) {
          const float d = wd * w;
          g = g + d;
        }
        {
          const float a = b1 * m;
          const float b = omb1 * g;
          m = a + b;
        }
        {
          const float a = b2 * v;
          float b = omb2 * g;
          b = b * g;
          v = a + b;
        }
        float den = v / bc2;
        den = std::sqrt(den);
        den = den + eps;
        float u = m / bc1;
        u = u / den;
        if (cfg.adam_w) {
          const float d = wd * w;
          u = u + d;
        }
        u = lr * u;
        w = w - u;
        nm[j] = canon(m);
        nv[j] = canon(v);
        nw[j] = canon(w);
        write_master(p, j, nw[j]);
      }
      if (cfg.master == Master::fp16) p.half.store(nw);
      p.m.store(nm);
      p.v.store(nv);
      p.last_m = nm;
      p.last_v = nv;
    }
  }

 private:
  void write_master(Param& p, Eigen::Index j, float w) {
    switch (cfg.master) {
      case Master::fp32: p.master32[j] = w; break;
      case Master::fp16: break;   // stored with the whole tensor's scale after the loop
      case Master::remainders: split(w, p.weight[j], p.rem[j]); return;
    }
    if (cfg.bf16_params) p.weight[j] = bf16_rne(w);   // from the new fp32 master
    else p.weight32[j] = w;
  }
};

}   // namespace rh::optim_ref
