// Optimizer step time of PrecisionAdam in each storage mode on 10 M parameters (4 x 2.5 M), as a
// ratio to torch::optim::AdamW's step on the same parameter count (fp32, LibTorch's own). One
// thread. Prints a table; never passes or fails on time (target: every ratio <= 2).
//   usage: bench_optim [steps=7]
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "harness/optim/precision_adam.h"

using namespace rh::optim;

namespace {

constexpr int64_t kTensors = 4, kNumel = 2'500'000;   // 10 M parameters

template <typename F>
double median_ms(int steps, F&& f) {
  f();   // warm-up: allocates workspaces, faults pages in
  std::vector<double> t;
  for (int i = 0; i < steps; ++i) {
    auto a = std::chrono::steady_clock::now();
    f();
    t.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - a).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

struct Mode {
  const char* name;
  Dtype m, v;
  MasterMode master;
};

double time_mode(const Mode& mode, int steps) {
  OptimizerConfig c;
  c.use_precision_aware_optimizer = true;
  c.exp_avg_dtype = mode.m;
  c.exp_avg_sq_dtype = mode.v;
  c.main_params_dtype = mode.master == MasterMode::fp16 ? Dtype::fp16 : Dtype::fp32;
  c.store_param_remainders = mode.master == MasterMode::remainders;
  std::vector<ParamGroup> groups = {{"decay", {}, 0.1}};
  std::vector<torch::Tensor> ps;
  for (int64_t i = 0; i < kTensors; ++i) {
    ps.push_back(torch::randn({kNumel}).to(torch::kBFloat16));   // bf16 model params
    groups[0].params.push_back({"w" + std::to_string(i), ps.back()});
  }
  PrecisionAdam opt(groups, c);
  if (opt.master_mode() != mode.master) {
    std::fprintf(stderr, "bench_optim: mode %s did not take effect: %s\n", mode.name, opt.describe().c_str());
    std::exit(1);
  }
  for (auto& p : ps) p.mutable_grad() = torch::randn({kNumel}).to(torch::kBFloat16) * 1e-2;
  opt.accumulate_grads();   // the main grads stay set across steps
  return median_ms(steps, [&] { opt.step(1e-4); });
}

double time_adamw(int steps) {
  std::vector<torch::Tensor> ps;
  for (int64_t i = 0; i < kTensors; ++i) {
    ps.push_back(torch::randn({kNumel}).requires_grad_(true));
    ps.back().mutable_grad() = torch::randn({kNumel}) * 1e-2;
  }
  torch::optim::AdamW opt(ps, torch::optim::AdamWOptions(1e-4).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  return median_ms(steps, [&] { opt.step(); });
}

}  // namespace

int main(int argc, char** argv) {
  const int steps = argc > 1 ? std::max(1, std::atoi(argv[1])) : 7;
  torch::set_num_threads(1);
  torch::NoGradGuard no_grad;
  const double base = time_adamw(steps);
  std::printf("optimizer step, %lld x %lld params, 1 thread, median of %d steps\n",
              static_cast<long long>(kTensors), static_cast<long long>(kNumel), steps);
  std::printf("%-34s %10s %8s\n", "mode", "ms/step", "ratio");
  std::printf("%-34s %10.1f %8.2f\n", "torch::optim::AdamW (fp32)", base, 1.0);
  const Mode modes[] = {
      {"fp32 states (fp32 master)", Dtype::fp32, Dtype::fp32, MasterMode::fp32},
      {"bf16 states (fp32 master)", Dtype::bf16, Dtype::bf16, MasterMode::fp32},
      {"fp16 states (fp32 master)", Dtype::fp16, Dtype::fp16, MasterMode::fp32},
      {"fp8 states (fp32 master)", Dtype::fp8, Dtype::fp8, MasterMode::fp32},
      {"remainders, fp32 states", Dtype::fp32, Dtype::fp32, MasterMode::remainders},
      {"remainders, bf16 states", Dtype::bf16, Dtype::bf16, MasterMode::remainders},
      {"fp16 master, bf16 states", Dtype::bf16, Dtype::bf16, MasterMode::fp16},
  };
  double worst = 0;
  for (const auto& m : modes) {
    const double t = time_mode(m, steps);
    worst = std::max(worst, t / base);
    std::printf("%-34s %10.1f %8.2f\n", m.name, t, t / base);
  }
  std::printf("worst ratio %.2f (target <= 2.00)\n", worst);
  return 0;
}
