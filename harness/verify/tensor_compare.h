// Key-by-key comparison of two tensor maps (presence, dtype, shape, NaN/Inf, bits, |diff|, ULP):
// the one comparer behind state dumps (compare.h) and external trainers' checkpoints.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <utility>
#include <vector>

#include "harness/checkpoint/safetensors_format.h"
#include "harness/verify/compare.h"

namespace rh {

using TensorMap = std::map<std::string, std::pair<ckpt::StDtype, torch::Tensor>>;
// Sorted by key; keys in only one map are reported with the other dtype empty.
std::vector<TensorDiff> compare_tensor_maps(const TensorMap& a, const TensorMap& b);

}   // namespace rh
