// The process environment a run depends on: which BLAS is loaded, thread counts, deterministic
// algorithms, LibTorch version. Printed at start and stored in reports so runs can be compared.
#pragma once
#include <string>

namespace rh {

struct RuntimeInfo {
  std::string harness_version;   // RH_VERSION
  std::string git_commit;        // RH_GIT_COMMIT at build time
  std::string torch_version;
  std::string blas;   // e.g. "OpenBLAS 0.3.21 ... (pthread)" or "reference BLAS"
  bool blas_is_openblas = false;
  bool cuda_compiled = false;   // CUDA code paths compiled in (CUDA LibTorch found)
  bool cuda_available = false;
  int threads = 1;
};

// Fixes intra-op (and OpenBLAS) threads and switches deterministic algorithms on. Call once at
// start, before any tensor work. On CUDA also requires CUBLAS_WORKSPACE_CONFIG=:4096:8.
void configure_determinism(int threads);

RuntimeInfo runtime_info();
std::string describe(const RuntimeInfo& info);   // one line

// Same inputs, same bits, on every x86-64 machine: OpenBLAS picks its kernels (and their
// blocking, so the order of a GEMM's sums) by CPU model, and ATen its vector width, so the same
// binary gives different low bits on an AVX-512 EPYC and an AVX2 one (measured: the golden
// metrics of one do not reproduce on the other). Called first in main(): unless already done,
// sets OPENBLAS_CORETYPE=Haswell and ATEN_CPU_CAPABILITY=avx2 (each only where the user has not
// set it, and only on a CPU with AVX2 and FMA) and re-executes the process, since OpenBLAS reads
// its variable when it is loaded. Returns only if no re-exec was needed (or it failed).
void pin_cross_machine_numerics(char** argv);

}   // namespace rh
