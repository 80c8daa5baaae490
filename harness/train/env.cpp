// Runtime environment detection; see env.h. OpenBLAS is found by symbol, since Debian's LibTorch
// links libblas.so.3 and whichever alternative provides it is the BLAS that actually runs.
#include "harness/train/env.h"
#include "harness/base/version.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <cstdlib>
#include <unistd.h>
#include <utility>

namespace rh {

void configure_determinism(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
  torch::set_num_threads(threads);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
#ifdef RH_WITH_CUDA
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(true);
#endif
}

RuntimeInfo runtime_info() {
  RuntimeInfo info;
  info.harness_version = RH_VERSION;
  info.git_commit = rh::git_commit();
  info.torch_version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
                       std::to_string(TORCH_VERSION_PATCH);
  using GetConfig = char* (*)();
  if (auto fn = reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    info.blas = fn();   // "OpenBLAS 0.3.21 ..."
    info.blas_is_openblas = true;
    if (auto core = reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_corename")))
      info.blas += std::string(" core ") + core();
  }
  {
    const char* cap = std::getenv("ATEN_CPU_CAPABILITY");
    info.blas += std::string(", ATen CPU capability: ") + (cap && *cap ? cap : "auto");
  }
  if (!info.blas_is_openblas) info.blas = "reference BLAS (slow: install libopenblas0-pthread)" + info.blas;
#ifdef RH_WITH_CUDA
  info.cuda_compiled = true;
#endif
  info.cuda_available = torch::cuda::is_available();
  info.threads = torch::get_num_threads();
  return info;
}

void pin_cross_machine_numerics(char** argv) {
  if (std::getenv("RH_NUMERICS_PINNED")) return;
  setenv("RH_NUMERICS_PINNED", "1", 1);
  __builtin_cpu_init();
  if (!__builtin_cpu_supports("avx2") || !__builtin_cpu_supports("fma")) return;
  bool changed = false;
  for (const auto& [name, value] :
       {std::pair<const char*, const char*>{"OPENBLAS_CORETYPE", "Haswell"}, {"ATEN_CPU_CAPABILITY", "avx2"}}) {
    const char* cur = std::getenv(name);
    if (cur && *cur) continue;
    setenv(name, value, 1);
    changed = true;
  }
  if (changed) execv("/proc/self/exe", argv);   // on failure: go on unpinned
}

std::string describe(const RuntimeInfo& info) {
  return "resume-harness " + info.harness_version + " (" + info.git_commit + "), LibTorch " + info.torch_version +
         ", BLAS: " + info.blas + ", threads: " + std::to_string(info.threads) + ", CUDA: " +
         (info.cuda_compiled ? (info.cuda_available ? "available" : "compiled, no device") : "not compiled");
}

}   // namespace rh
