// The one collectives interface of a data-parallel group: what the optimizer needs (a few blocking
// collectives on CPU tensors) and what a sharded save needs (every rank's string, to agree before
// publishing). harness/ranks/group.h implements it over torch.distributed (c10d ProcessGroupGloo); a
// PrecisionAdam or a save without one is a group of one. Every rank must make the same calls in the
// same order; an implementation throws (never hangs past its timeout) when a peer fails.
#pragma once
#include <torch/torch.h>

#include <string>
#include <vector>

namespace rh::optim {

class Collectives {
 public:
  virtual ~Collectives() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual void all_reduce_sum(torch::Tensor& t) = 0;   // kFloat, contiguous, in place
  virtual void all_reduce_max(torch::Tensor& t) = 0;   // kFloat, contiguous, in place
  // kByte: `in` has n bytes on every rank; out (size * n bytes) receives them in rank order.
  virtual void all_gather_bytes(const torch::Tensor& in, torch::Tensor& out) = 0;
  // Every rank passes its string and receives every rank's, in rank order.
  virtual std::vector<std::string> all_gather_strings(const std::string& mine) = 0;
};

// One rank's outcome of a phase every rank goes through (a save's step, a load): success with a
// payload for the others, or a failure with its message and one flag that travels with it (a
// load: whether the checkpoint is damaged).
struct RankOutcome {
  bool ok = true;
  std::string payload;   // with success
  std::string error;     // with failure
  bool flag = false;     // with failure
};

// What every rank learns: every rank's payload when all succeeded, else the first failure in
// rank order.
struct Agreement {
  std::vector<std::string> payloads;   // in rank order; only when ok()
  int failed_rank = -1;
  std::string error;
  bool flag = false;
  bool ok() const { return failed_rank < 0; }
  std::string failure() const { return "rank " + std::to_string(failed_rank) + ": " + error; }
};

// Every rank passes its outcome and all receive the same Agreement (one all_gather_strings). A
// null group is a process of its own: its outcome, nothing sent.
Agreement agree(Collectives* group, const RankOutcome& mine);

}   // namespace rh::optim
