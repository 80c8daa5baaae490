// What the optimizer needs from its data-parallel group: a few blocking collectives on CPU
// tensors. harness/dist.h implements it over torch.distributed (c10d ProcessGroupGloo); a
// PrecisionAdam without one is a group of one. Every rank must make the same calls in the same
// order; an implementation throws (never hangs past its timeout) when a peer fails.
#pragma once
#include <torch/torch.h>

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
};

}  // namespace rh::optim
