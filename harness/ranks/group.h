// Data parallelism over torch.distributed's own engine (c10d): the process group the distributed
// optimizer and the sharded checkpoints use, how a rank learns its place (torchrun's or SLURM's
// environment). The local launcher behind `train --nproc N` is in launcher.h.
//
// Backend: ProcessGroupGloo on CPU (LibTorch 1.13's Gloo has no bf16 collectives, so reductions
// are fp32 and gathers move bytes). Every collective and every rendezvous has a timeout: a rank
// that dies or hangs makes the others throw DistError within it, never hang.
#pragma once
#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "harness/optim/collectives.h"

namespace rh::dist {

struct DistError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Where this process sits. torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and
// MASTER_PORT; under SLURM (srun) SLURM_PROCID, SLURM_NTASKS and SLURM_LOCALID stand in for the
// first three when RANK is unset, and MASTER_ADDR / MASTER_PORT must still be exported.
struct Placement {
  int rank = 0, world_size = 1, local_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single process";   // "torchrun environment" | "SLURM environment" | ...
};
// Throws std::invalid_argument naming the variable when one is malformed or inconsistent.
Placement placement_from_environment();
bool launched_by_environment();   // WORLD_SIZE (or SLURM_NTASKS) is set

class Group final : public optim::Collectives {
 public:
  // Rendezvous through a c10d TCPStore served by rank 0 at master_addr:master_port, then a
  // ProcessGroupGloo. `timeout` bounds the rendezvous and every collective.
  Group(const Placement& place, std::chrono::milliseconds timeout);
  ~Group() override;
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  int rank() const override;
  int size() const override;
  void all_reduce_sum(torch::Tensor& t) override;
  void all_reduce_max(torch::Tensor& t) override;
  void all_gather_bytes(const torch::Tensor& in, torch::Tensor& out) override;
  std::vector<std::string> all_gather_strings(const std::string& mine) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}   // namespace rh::dist
