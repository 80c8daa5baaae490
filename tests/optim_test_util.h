// Test glue shared by the optimizer tests: builds a PrecisionAdam and the scalar reference
// (tests/optim_reference.h) from one case, feeds both the same gradients, and compares every
// stored bit. Header-only, test-side only.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <string>
#include <vector>

#include "harness/optim/precision_adam.h"
#include "tests/optim_reference.h"

// Every optimizer test runs LibTorch on one thread, set once before any test runs.
inline const bool kTorchOnOneThread = (torch::set_num_threads(1), true);

namespace rh::optim::testutil {

namespace ref = rh::optim_ref;

struct Case {
  Dtype exp_avg = Dtype::fp32, exp_avg_sq = Dtype::fp32;
  MasterMode master = MasterMode::fp32;
  bool adam_w = true;
  Dtype main_grads = Dtype::fp32;
  bool bf16_params = true;

  std::string name() const {
    return "m_" + to_string(exp_avg) + "_v_" + to_string(exp_avg_sq) + "_master_" + to_string(master) +
           (adam_w ? "_adamw" : "_l2") + "_grads_" + to_string(main_grads) +
           (bf16_params ? "_bf16params" : "_fp32params");
  }
  OptimizerConfig config() const {
    OptimizerConfig c;
    c.use_precision_aware_optimizer = true;
    c.exp_avg_dtype = exp_avg;
    c.exp_avg_sq_dtype = exp_avg_sq;
    c.main_grads_dtype = main_grads;
    c.main_params_dtype = master == MasterMode::fp16 ? Dtype::fp16 : Dtype::fp32;
    c.store_param_remainders = master == MasterMode::remainders;
    c.adam_w_mode = adam_w;
    return c;
  }
  ref::Config ref_config() const {
    auto fmt = [](Dtype d) {
      return d == Dtype::bf16   ? ref::Fmt::bf16
             : d == Dtype::fp16 ? ref::Fmt::fp16
             : d == Dtype::fp8  ? ref::Fmt::fp8
                                : ref::Fmt::fp32;
    };
    ref::Config r;
    r.master = master == MasterMode::fp16         ? ref::Master::fp16
               : master == MasterMode::remainders ? ref::Master::remainders
                                                  : ref::Master::fp32;
    r.exp_avg = fmt(exp_avg);
    r.exp_avg_sq = fmt(exp_avg_sq);
    r.bf16_main_grads = main_grads == Dtype::bf16;
    r.bf16_params = bf16_params;
    r.adam_w = adam_w;
    return r;
  }
};

inline Eigen::ArrayXf to_eigen(const torch::Tensor& t) {
  auto f = t.detach().to(torch::kFloat).contiguous().view({-1});
  return Eigen::Map<const Eigen::ArrayXf>(f.data_ptr<float>(), f.numel());
}

// Raw bit patterns of a stored tensor, zero-extended to 32 bits.
inline std::vector<uint32_t> raw_bits(const torch::Tensor& t) {
  auto c = t.contiguous();
  std::vector<uint32_t> out(c.numel());
  const auto n = c.numel();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  const auto sz = c.element_size();
  for (int64_t i = 0; i < n; ++i) {
    uint32_t v = 0;
    std::memcpy(&v, p + i * sz, sz);   // little endian
    out[i] = v;
  }
  return out;
}

template <typename A>
std::vector<uint32_t> ref_bits(const A& a, size_t bytes) {
  std::vector<uint32_t> out(a.size());
  for (Eigen::Index i = 0; i < a.size(); ++i) {
    uint32_t v = 0;
    auto x = a[i];
    std::memcpy(&v, &x, bytes);
    out[i] = v;
  }
  return out;
}

// Index of the first differing element, or -1.
inline int64_t first_diff(const std::vector<uint32_t>& a, const std::vector<uint32_t>& b) {
  if (a.size() != b.size()) return 0;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) return static_cast<int64_t>(i);
  return -1;
}

// A small model: named params in two groups, some of which miss gradients on some steps.
struct Rig {
  struct Spec {
    std::string name;
    std::vector<int64_t> shape;
    int group;
    int every;
    int offset;
  };
  Case c;
  std::vector<Spec> specs;
  std::vector<torch::Tensor> params;
  std::unique_ptr<PrecisionAdam> opt;
  std::unique_ptr<ref::Adam> r;

  Rig(Case cs, std::vector<Spec> sp, uint64_t seed = 1) : c(cs), specs(std::move(sp)) {
    torch::manual_seed(seed);
    const std::vector<double> wd = {0.1, 0.0};
    std::vector<ParamGroup> groups = {{"decay", {}, wd[0]}, {"no_decay", {}, wd[1]}};
    r = std::make_unique<ref::Adam>(c.ref_config(), wd);
    for (const auto& s : specs) {
      auto p = torch::randn(s.shape).to(c.bf16_params ? torch::kBFloat16 : torch::kFloat);
      params.push_back(p);
      groups[s.group].params.push_back({s.name, p});
      r->add_param(s.group, to_eigen(p));
    }
    opt = std::make_unique<PrecisionAdam>(groups, c.config());
  }

  // Two micro-batches of random gradients for the params scheduled on this step, accumulated
  // into both optimizers; then one step. Magnitudes spread over ~3 decades: wide enough to hit
  // fp8/fp16 subnormals after scaling, narrow enough that fp8 exp_avg_sq (5.4 decades of range)
  // does not flush so many v to 0 that eps-sized denominators blow the run up to inf/NaN (then
  // the comparison would only compare NaNs, whose sign and payload IEEE leaves open).
  void step(int s, double lr) {
    opt->zero_grads();
    r->zero_grads();
    for (int micro = 0; micro < 2; ++micro) {
      for (size_t i = 0; i < specs.size(); ++i) {
        if ((s + specs[i].offset) % specs[i].every != 0) continue;
        auto g = torch::randn(specs[i].shape) * torch::exp(torch::randn(specs[i].shape));
        g = g.to(params[i].scalar_type());
        params[i].mutable_grad() = g;
        r->accumulate(i, to_eigen(g));
      }
      opt->accumulate_grads();
    }
    opt->step(lr);
    r->step(lr);
  }

  // Every stored bit, scales and model params against the reference.
  void expect_equal(int s) const {
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto& name = specs[i].name;
      const auto& rp = r->params[i];
      const std::string at = "step " + std::to_string(s) + " param " + name + " (" + c.name() + ")";
      int64_t d;
      d = first_diff(raw_bits(params[i]), c.bf16_params ? ref_bits(rp.weight, 2) : ref_bits(rp.weight32, 4));
      ASSERT_EQ(d, -1) << "model param differs at element " << d << ", " << at << ": 0x" << std::hex
                       << raw_bits(params[i])[d] << " vs reference 0x"
                       << (c.bf16_params ? ref_bits(rp.weight, 2) : ref_bits(rp.weight32, 4))[d];
      const auto& ms = opt->stored(name, StateKey::master_param);
      std::vector<uint32_t> want_master;
      if (c.master == MasterMode::fp32) want_master = ref_bits(rp.master32, 4);
      if (c.master == MasterMode::fp16) want_master = ref_bits(rp.half.raw, 4);
      if (c.master == MasterMode::remainders) want_master = ref_bits(rp.rem, 2);
      d = first_diff(raw_bits(ms.data), want_master);
      ASSERT_EQ(d, -1) << "master_param differs at element " << d << ", " << at;
      auto expect_scaling = [&](const StoredState& st, const ref::Stored& rs, const char* what) {
        if (rs.fmt != ref::Fmt::fp16 && rs.fmt != ref::Fmt::fp8) return;
        ASSERT_TRUE(st.scale.has_value()) << what << ", " << at;
        ASSERT_EQ(ref::f2u(*st.scale), ref::f2u(rs.scale)) << what << " scale, " << at;
        if (rs.fmt == ref::Fmt::fp8) {
          ASSERT_TRUE(st.scale_inv.has_value()) << what << ", " << at;
          ASSERT_EQ(ref::f2u(*st.scale_inv), ref::f2u(rs.scale_inv)) << what << " scale_inv, " << at;
        }
      };
      if (c.master == MasterMode::fp16) expect_scaling(ms, rp.half, "master_param");
      for (auto [key, rs] : {std::pair{StateKey::exp_avg, &rp.m}, std::pair{StateKey::exp_avg_sq, &rp.v}}) {
        const auto& st = opt->stored(name, key);
        d = first_diff(raw_bits(st.data), ref_bits(rs->raw, 4));
        ASSERT_EQ(d, -1) << key_name(key) << " differs at element " << d << ", " << at;
        expect_scaling(st, *rs, key_name(key));
      }
    }
    for (size_t g = 0; g < 2; ++g) ASSERT_EQ(opt->step_count(g), r->steps[g]);
  }

  // The run stayed finite, so the bitwise comparisons compared numbers.
  void expect_finite() const {
    for (size_t i = 0; i < specs.size(); ++i) {
      const auto& rp = r->params[i];
      for (Eigen::Index j = 0; j < rp.main_grad.size(); ++j) {
        ASSERT_TRUE(std::isfinite(r->master_value(rp, j)) && std::isfinite(rp.m.value(j)) &&
                    std::isfinite(rp.v.value(j)))
            << "reference state of " << specs[i].name << "[" << j << "] is not finite (" << c.name() << ")";
      }
    }
  }
};

// Params of odd sizes; "b" gets a gradient every third step only, "d" every fourth.
inline std::vector<Rig::Spec> small_specs() {
  return {{"a", {7, 13}, 0, 1, 0}, {"b", {300}, 0, 3, 1}, {"c", {1}, 1, 1, 0}, {"d", {41}, 1, 4, 2}};
}

}   // namespace rh::optim::testutil
