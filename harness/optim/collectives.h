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

}  // namespace rh::optim
