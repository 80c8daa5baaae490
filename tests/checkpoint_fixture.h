// Shared by the checkpoint tests: a temp directory, a tiny named-parameter model, a
// PrecisionAdam over it in each storage mode, deterministic training steps, and bitwise state
// comparison. Header-only (inline), so test files compiled together may each include it.
#pragma once
#include <gtest/gtest.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/manifest_reader.h"
#include "tests/test_util.h"

namespace ckfix {

namespace fs = std::filesystem;

// The files of a checkpoint directory, and whole-file reads and writes for tests that damage them.
inline const char* kShard = "optim_rank_00000.safetensors";
inline const char* kModel = "model.safetensors";
using rh::testutil::slurp;
inline void spit(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary | std::ios::trunc) << s; }
inline nlohmann::json read_manifest(const fs::path& dir) { return nlohmann::json::parse(slurp(dir / "manifest.json")); }
// The manifest's checksum sidecar rewritten to match its bytes: a test that edits a manifest to
// reach a check behind the checksum plays an attacker who rewrites both.
inline void seal_manifest(const fs::path& dir) {
  spit(dir / rh::ckpt::detail::kManifestChecksumFile,
       rh::ckpt::detail::manifest_checksum_text(slurp(dir / "manifest.json")));
}
inline void write_manifest_text(const fs::path& dir, const std::string& text) {
  spit(dir / "manifest.json", text);
  seal_manifest(dir);
}
inline void write_manifest(const fs::path& dir, const nlohmann::json& m) { write_manifest_text(dir, m.dump(1)); }
using rh::optim::Dtype;
using rh::optim::OptimizerConfig;
using rh::optim::PrecisionAdam;
using rh::optim::StateKey;
using rh::optim::StoredState;

inline constexpr StateKey kKeys[] = {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq};

struct TmpDir {
  fs::path p;
  TmpDir() {
    std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    for (char& c : name)
      if (c == '/') c = '_';
    p = fs::temp_directory_path() / ("rh_ck_" + std::to_string(::getpid()) + "_" + name);
    fs::remove_all(p);
    fs::create_directories(p);
  }
  ~TmpDir() { fs::remove_all(p); }
  std::string str() const { return p.string(); }
  std::string file(const std::string& n) const { return (p / n).string(); }
};

// A storage mode: optimizer options plus the params' dtype.
struct Mode {
  std::string name;
  OptimizerConfig cfg;
  torch::ScalarType param_dtype;
};

inline Mode make_mode(const std::string& name, bool precision_aware, torch::ScalarType pdt, Dtype master,
                      bool remainders, Dtype m, Dtype v) {
  Mode md{name, {}, pdt};
  md.cfg.use_precision_aware_optimizer = precision_aware;
  md.cfg.main_params_dtype = master;
  md.cfg.store_param_remainders = remainders;
  md.cfg.exp_avg_dtype = m;
  md.cfg.exp_avg_sq_dtype = v;
  return md;
}

// Every master mode and moment dtype, including the two where the PR's per_key remainder rule
// misfires (store_param_remainders=true, bf16 params, but no remainders in effect).
inline std::vector<Mode> all_modes() {
  const auto f = torch::kFloat, b = torch::kBFloat16;
  return {make_mode("fp32params", false, f, Dtype::fp32, true, Dtype::fp32, Dtype::fp32),
          make_mode("plain_bf16", false, b, Dtype::fp32, true, Dtype::fp32, Dtype::fp32),
          make_mode("fp32master_bf16moments", true, b, Dtype::fp32, false, Dtype::bf16, Dtype::bf16),
          make_mode("remainders_fp32moments", true, b, Dtype::fp32, true, Dtype::fp32, Dtype::fp32),
          make_mode("remainders_bf16moments", true, b, Dtype::fp32, true, Dtype::bf16, Dtype::bf16),
          make_mode("remainders_fp16moments", true, b, Dtype::fp32, true, Dtype::fp16, Dtype::fp16),
          make_mode("remainders_fp8moments", true, b, Dtype::fp32, true, Dtype::fp8, Dtype::fp8),
          make_mode("fp16master_fp8_fp16", true, b, Dtype::fp16, true, Dtype::fp8, Dtype::fp16)};
}

// Named parameters of odd and aligned shapes, two groups (decay / no_decay).
struct Toy : torch::nn::Module {
  struct Layer : torch::nn::Module {
    torch::Tensor w, b;
    Layer(int64_t out, int64_t in, torch::ScalarType dt, torch::Generator& g) {
      w = register_parameter("w", (torch::randn({out, in}, g) * 0.5).to(dt));
      b = register_parameter("b", (torch::randn({out}, g) * 0.1).to(dt));
    }
  };
  torch::Tensor embed, norm;
  std::shared_ptr<Layer> l0, l1;
  Toy(torch::ScalarType dt, uint64_t seed, int64_t width = 16) {
    auto g = at::detail::createCPUGenerator(seed);
    embed = register_parameter("embed", (torch::randn({7, 5}, g) * 0.5).to(dt));
    l0 = register_module("l0", std::make_shared<Layer>(width, 5, dt, g));
    l1 = register_module("l1", std::make_shared<Layer>(3, width, dt, g));
    norm = register_parameter("norm", torch::ones({3}).to(dt));
  }
};

struct Rig {
  std::shared_ptr<Toy> model;
  std::unique_ptr<PrecisionAdam> opt;
  rh::ckpt::TrainState state;
};

inline Rig make_rig(const Mode& m, uint64_t seed, int64_t width = 16) {
  Rig r;
  r.model = std::make_shared<Toy>(m.param_dtype, seed, width);
  std::vector<rh::optim::ParamGroup> groups(2);
  groups[0].name = "decay";
  groups[0].weight_decay = 0.1;
  groups[1].name = "no_decay";
  for (const auto& p : r.model->named_parameters(true))
    groups[p.key().find(".b") != std::string::npos || p.key() == "norm" ? 1 : 0].params.emplace_back(p.key(),
                                                                                                     p.value());
  r.opt = std::make_unique<PrecisionAdam>(std::move(groups), m.cfg);
  r.state.opt_param_scheduler.max_lr = 1e-2;
  r.state.opt_param_scheduler.min_lr = 1e-3;
  r.state.opt_param_scheduler.lr_warmup_steps = 16;
  r.state.opt_param_scheduler.lr_decay_steps = 800;
  r.state.opt_param_scheduler.lr_decay_style = "WSD";
  r.state.opt_param_scheduler.start_wd = 0.0;
  r.state.opt_param_scheduler.end_wd = 0.1;
  r.state.opt_param_scheduler.wd_incr_style = "cosine";
  r.state.opt_param_scheduler.wd_incr_steps = 800;
  return r;
}

// A real CPU generator's state (load refuses a generator state of any other length).
inline std::vector<uint8_t> generator_state(uint64_t seed) {
  auto t = at::detail::createCPUGenerator(seed).get_state().contiguous();
  const auto* p = t.data_ptr<uint8_t>();
  return std::vector<uint8_t>(p, p + t.numel());
}

// Deterministic steps: gradients of magnitude ~1e-3 drawn from a generator seeded by the step,
// so two rigs in the same state take identical steps.
inline void train(Rig& r, int steps) {
  for (int s = 0; s < steps; ++s) {
    auto g = at::detail::createCPUGenerator(1000 + static_cast<uint64_t>(r.state.iteration));
    for (const auto& p : r.model->named_parameters(true))
      p.value().mutable_grad() = (torch::randn(p.value().sizes(), g) * 1e-3).to(p.value().scalar_type());
    r.opt->accumulate_grads();
    r.opt->step(1e-2);
    r.opt->zero_grads();
    r.state.iteration += 1;
    r.state.consumed_samples += 8;
    r.state.opt_param_scheduler.num_steps += 8;
  }
  r.state.rng_states["data"] = generator_state(static_cast<uint64_t>(r.state.iteration));
  r.state.rng_states["dropout"] = generator_state(0xdeadbeef);
}

inline bool bytes_equal(const torch::Tensor& a, const torch::Tensor& b) {
  if (a.scalar_type() != b.scalar_type() || a.sizes() != b.sizes()) return false;
  auto ac = a.contiguous(), bc = b.contiguous();
  return std::memcmp(ac.data_ptr(), bc.data_ptr(), ac.numel() * ac.element_size()) == 0;
}

inline bool same_scalar(const std::optional<float>& a, const std::optional<float>& b) {
  return a.has_value() == b.has_value() && (!a || std::memcmp(&*a, &*b, sizeof(float)) == 0);
}
inline bool stored_equal(const StoredState& a, const StoredState& b) {
  return a.dtype == b.dtype && same_scalar(a.scale, b.scale) && same_scalar(a.scale_inv, b.scale_inv) &&
         bytes_equal(a.data, b.data);
}
// Equal as values: the codes and what they decode with (fp8's kept `scale` is never decoded with).
inline bool decodes_equal(const StoredState& a, const StoredState& b) {
  if (a.dtype != b.dtype || !bytes_equal(a.data, b.data)) return false;
  return a.dtype == rh::optim::Dtype::fp8 ? same_scalar(a.scale_inv, b.scale_inv) : same_scalar(a.scale, b.scale);
}

// Model params, every stored state and the step counters, bit for bit.
inline ::testing::AssertionResult same_state(const Rig& a, const Rig& b) {
  auto pa = a.model->named_parameters(true), pb = b.model->named_parameters(true);
  for (size_t i = 0; i < pa.size(); ++i)
    if (!bytes_equal(pa[i].value(), pb[i].value()))
      return ::testing::AssertionFailure() << "model param " << pa[i].key();
  for (const auto& p : a.opt->param_names())
    for (StateKey k : kKeys)
      if (!stored_equal(a.opt->stored(p, k), b.opt->stored(p, k)))
        return ::testing::AssertionFailure() << "state " << p << "/" << rh::optim::key_name(k);
  for (size_t g = 0; g < a.opt->num_groups(); ++g)
    if (a.opt->step_count(g) != b.opt->step_count(g)) return ::testing::AssertionFailure() << "step of group " << g;
  return ::testing::AssertionSuccess();
}

inline rh::ckpt::SaveInput save_input(const Rig& r, rh::ckpt::SavePolicy pol = {}) {
  rh::ckpt::SaveInput in;
  in.model = r.model.get();
  in.optimizer = r.opt.get();
  in.state = &r.state;
  in.run_config = {{"model", {{"width", 16}}}, {"note", "test"}};
  in.policy = std::move(pol);
  return in;
}

}   // namespace ckfix
