// One optimizer state exactly as PrecisionAdam holds it in memory (its storage dtype and, for
// fp16/fp8, its scale), apart from the class: the Adam step and the checkpoint codecs handle it.
#pragma once
#include <torch/torch.h>

#include <optional>

#include "harness/optim/optimizer_config.h"

namespace rh::optim {

// One state exactly as held in memory.
struct StoredState {
  torch::Tensor data;   // shape of the param (1-D of the owned part when the param is
                        // split across data-parallel ranks, see shard_range); kFloat,
                        // kBFloat16, kHalf, kByte (fp8 E4M3 bytes) or kShort (remainder)
  Dtype dtype = Dtype::fp32;
  // fp16 / fp8 states (moments, and an fp16 master) only, as TE's FusedAdam keeps them
  // (storage_codecs.h, Scaling): `scale` = amax / range (self._scales); fp16 decodes as
  // float(code) * scale. fp8 decodes as float(code) * scale_inv (the Float8Tensor's _scale_inv).
  std::optional<float> scale;
  std::optional<float> scale_inv;   // fp8 only
  float decode_mult() const { return dtype == Dtype::fp8 ? scale_inv.value_or(1.0f) : scale.value_or(1.0f); }
};

}   // namespace rh::optim
