// Internal to the checkpoint room: how a save policy turns one optimizer state into tensors on
// disk, and how load turns those tensors back into values. The conversion names below are what
// the manifest records per tensor, so load interprets bytes by what produced them, not by guess.
//
//   stored                 the in-memory representation, bit for bit (+ ".scale" tensor if scaled,
//                          + ".scale_inv" for fp8: TE decodes fp8 with scale_inv, fp16 with scale)
//   unscaled_fp32          get_unscaled_state(): fp32 value (upstream state_dict)
//   cast_bf16 / cast_f16   the fp32 value cast round-to-nearest-even, no scale (per_key fp16 and
//                          overrides: lossy, may overflow to inf or flush to zero)
//   value_copy_u8          the fp32 value converted to uint8 like x86 PyTorch's copy_: truncate
//                          toward zero, keep the low 8 bits (per_key fp8; non-finite -> 0, where
//                          upstream is undefined)
//   cast_f8_e4m3           the fp32 value encoded as E4M3 without a scale (override fp8)
//   remainder_widened_f32  the int16 remainder's values in an fp32 container (per_key param, and
//                          dp_zero / fully_reshardable: Megatron's fp32 world buffers)
#pragma once
#include <torch/torch.h>

#include <optional>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/safetensors.h"

namespace rh::ckpt::detail {

struct EncodedTensor {
  std::string key;    // "<param>/exp_avg", "<param>/exp_avg.scale", ".scale_inv", "<param>/remainder"
  std::string kind;   // master_param | remainder | exp_avg | exp_avg_sq | scale
  torch::Tensor data;
  StDtype dtype;
  std::string policy;       // native | dp_reshardable | fully_reshardable | dp_zero | per_key | override
  std::string conversion;   // see above
  bool exact = true;        // decodes back to the in-memory value bit for bit
};

StDtype st_of(optim::Dtype d);
using ckpt::is_scale_key;   // public in checkpoint.h; detail:: callers keep working
// The fp32 value of a state: get_unscaled_state, except for the master in remainder mode, where
// upstream returns the raw int16 remainder; this returns the joined fp32 master (bf16 weight +
// remainder) of the owned part, the value the harness's overrides and exactness checks need.
torch::Tensor unscaled(const optim::PrecisionAdam& opt, const std::string& param, optim::StateKey k);
// The field name of a state on disk: "remainder" for master_param in remainder mode.
std::string field_name(const optim::PrecisionAdam& opt, optim::StateKey k);

// The tensors the policy writes for one state of one parameter (one, or two with a scale).
// Throws CheckpointError on an unusable override.
std::vector<EncodedTensor> encode_state(const optim::PrecisionAdam& opt, const std::string& param, optim::StateKey key,
                                        const SavePolicy& policy);

// The fp32 value a value-type conversion's bytes stand for (every conversion except stored
// I16 remainders and remainder_widened_f32). `decode_mult`: what a stored fp16/fp8 state decodes
// with (fp16: its scale, fp8: its scale_inv); absent for everything unscaled.
torch::Tensor decode_value(const torch::Tensor& data, StDtype dtype, const std::string& conversion,
                           std::optional<float> decode_mult);

// Float -> uint8 as x86 PyTorch copies it (see value_copy_u8 above).
torch::Tensor value_copy_u8(const torch::Tensor& x);

// Bitwise equality of two fp32 tensors (NaN payloads and signed zeros count).
bool bits_equal(const torch::Tensor& a, const torch::Tensor& b);
int64_t count_bits_differ(const torch::Tensor& a, const torch::Tensor& b);

}   // namespace rh::ckpt::detail
