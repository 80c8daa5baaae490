// Benchmark: wall time of the default 20-iteration run (bf16 parameters computed in
// fp32 with bf16-rounded outputs) beside the same run with plain fp32 parameters and compute,
// and the native bf16 compute path for reference. Prints times and ratios; never fails on time.
#include <chrono>
#include <cstdio>

#include "harness/train/env.h"
#include "harness/train/trainer.h"

namespace {

double run_seconds(const rh::RunConfig& cfg) {
  rh::Trainer t(cfg);
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < cfg.train.iterations; ++i) t.train_iteration();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double best_of(const rh::RunConfig& cfg, int reps) {
  double best = 1e30;
  for (int r = 0; r < reps; ++r) best = std::min(best, run_seconds(cfg));
  return best;
}

}   // namespace

int main() {
  rh::configure_determinism(1);
  std::printf("%s\n", rh::describe(rh::runtime_info()).c_str());
  rh::RunConfig def;   // the default run: bf16 params, compute = auto (fp32 on CPU)
  def.optim.use_precision_aware_optimizer = true;
  def.optim.exp_avg_dtype = rh::optim::Dtype::bf16;
  def.optim.exp_avg_sq_dtype = rh::optim::Dtype::bf16;
  rh::RunConfig fp32 = def;   // the bf16 path replaced by plain fp32 compute
  fp32.model.param_dtype = "fp32";
  fp32.optim = rh::optim::OptimizerConfig{};
  rh::RunConfig native = def;   // bf16 ops (what a GPU runs)
  native.model.compute = "native";
  const int reps = 2;
  const double t_def = best_of(def, reps), t_fp32 = best_of(fp32, reps);
  const double t_native = run_seconds(native);
  std::printf("default 20-iteration run (bf16 params, fp32 compute): %.3f s\n", t_def);
  std::printf("same run, fp32 params and compute:                  %.3f s\n", t_fp32);
  std::printf("same run, native bf16 compute:                      %.3f s\n", t_native);
  std::printf("ratio default / fp32 = %.3f (target <= 1.5)\n", t_def / t_fp32);
  std::printf("ratio native bf16 / fp32 = %.3f\n", t_native / t_fp32);
  return 0;
}
