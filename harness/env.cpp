// Runtime environment detection; see env.h. OpenBLAS is found by symbol, since Debian's LibTorch
// links libblas.so.3 and whichever alternative provides it is the BLAS that actually runs.
#include "harness/env.h"
#include "harness/version.h"

#include <dlfcn.h>
#include <torch/torch.h>

#include <cstdlib>

namespace rh {

void configure_determinism(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads")))
    fn(threads);
  torch::set_num_threads(threads);
  at::globalContext().setDeterministicAlgorithms(true, /*warn_only=*/false);
#ifdef RH_WITH_CUDA
  setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:8", /*overwrite=*/0);
  at::globalContext().setBenchmarkCuDNN(false);
  at::globalContext().setDeterministicCuDNN(true);
#endif
}

RuntimeInfo runtime_info() {
  RuntimeInfo r;
  r.harness_version = RH_VERSION;
  r.git_commit = rh::git_commit();
  r.torch_version = std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) +
                    "." + std::to_string(TORCH_VERSION_PATCH);
  using GetConfig = char* (*)();
  if (auto fn = reinterpret_cast<GetConfig>(dlsym(RTLD_DEFAULT, "openblas_get_config"))) {
    r.blas = std::string("OpenBLAS ") + fn();
    r.blas_is_openblas = true;
  } else {
    r.blas = "reference BLAS (slow: install libopenblas0-pthread)";
  }
#ifdef RH_WITH_CUDA
  r.cuda_compiled = true;
#endif
  r.cuda_available = torch::cuda::is_available();
  r.threads = torch::get_num_threads();
  return r;
}

std::string describe(const RuntimeInfo& r) {
  return "resume-harness " + r.harness_version + " (" + r.git_commit + "), LibTorch " +
         r.torch_version + ", BLAS: " + r.blas + ", threads: " + std::to_string(r.threads) +
         ", CUDA: " + (r.cuda_compiled ? (r.cuda_available ? "available" : "compiled, no device")
                                       : "not compiled");
}

}  // namespace rh
