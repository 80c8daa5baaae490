// Tensor-by-tensor comparison of two state dumps (native-policy checkpoints written by the
// baseline and the resumed run), and of per-iteration fingerprints. A comparison checks presence,
// dtype and shape first, then NaN/Inf, then bits, absolute difference and ULP distance.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rh {

struct TensorDiff {
  std::string key;                // "model/<param>" or "<param>/exp_avg" ...
  std::string kind;               // model | master_param | remainder | exp_avg | exp_avg_sq | scale
  std::string dtype_a, dtype_b;   // safetensors dtype names ("" if absent)
  int64_t numel = 0;
  bool shape_equal = false;
  double bit_equal_fraction = 0;   // elements whose bit patterns are equal
  double max_abs_diff = 0;         // over decoded values (inf if a NaN/Inf differs)
  uint64_t max_ulp = 0;            // distance in representable values of the dtype
  bool identical() const { return shape_equal && dtype_a == dtype_b && bit_equal_fraction == 1.0; }
};

// The kind of a state key ("layers.0.wq/exp_avg.scale" -> "scale").
std::string key_kind(const std::string& key);

// Compares every tensor of the checkpoint roots (or iter_ dirs) a and b; keys in only one of them
// are reported with the other dtype empty. Sorted by key.
std::vector<TensorDiff> compare_state_dumps(const std::string& a, const std::string& b);

// fingerprints.csv: iteration -> (key -> xxh3 hex), insertion order kept per iteration.
using Fingerprints = std::map<int64_t, std::vector<std::pair<std::string, std::string>>>;
Fingerprints read_fingerprints(const std::string& path);

// ULP distance between two float32 values (0 if bit-equal; huge for NaN vs number).
uint64_t ulp_distance(float a, float b);
uint64_t ulp_distance(double a, double b);

}   // namespace rh
