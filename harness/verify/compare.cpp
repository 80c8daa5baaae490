// State-dump and fingerprint comparison; see compare.h.
#include "harness/verify/compare.h"
#include "harness/verify/tensor_compare.h"

#include <torch/torch.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "harness/checkpoint/checkpoint.h"
#include "harness/optim/storage_codecs.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

torch::Tensor decode(ckpt::StDtype d, const torch::Tensor& t) {
  if (d == ckpt::StDtype::F8_E4M3) return optim::codec::fp8_decode(t.contiguous()).to(torch::kDouble);
  return t.to(torch::kDouble);
}

// Sign-magnitude bit patterns mapped to a monotonic integer line.
torch::Tensor ordered(ckpt::StDtype d, const torch::Tensor& t) {
  using ckpt::StDtype;
  auto sm = [](const torch::Tensor& bits, int64_t sign) {
    auto mag = torch::bitwise_and(bits, sign - 1);
    return torch::where(torch::bitwise_and(bits, sign).ne(0), -mag, mag);
  };
  switch (d) {
    case StDtype::F32:
      return sm(t.view(torch::kInt).to(torch::kLong).bitwise_and(static_cast<int64_t>(0xffffffff)), int64_t{1} << 31);
    case StDtype::F16:
    case StDtype::BF16:
      return sm(t.view(torch::kShort).to(torch::kLong).bitwise_and(int64_t{0xffff}), int64_t{1} << 15);
    case StDtype::F8_E4M3: return sm(t.to(torch::kLong), 1 << 7);
    default: return t.to(torch::kLong);
  }
}

torch::Tensor raw_bits(const torch::Tensor& t) {
  auto c = t.contiguous();
  switch (c.element_size()) {
    case 1: return c.view(torch::kByte).to(torch::kLong);
    case 2: return c.view(torch::kShort).to(torch::kLong);
    case 4: return c.view(torch::kInt).to(torch::kLong);
    default: return c.view(torch::kLong);
  }
}

}   // namespace

std::string key_kind(const std::string& key) {
  if (key.rfind("model/", 0) == 0) return "model";
  if (ckpt::is_scale_key(key)) return "scale";
  const auto slash = key.rfind('/');
  return slash == std::string::npos ? key : key.substr(slash + 1);
}

std::vector<TensorDiff> compare_state_dumps(const std::string& a, const std::string& b) {
  auto la = ckpt::read_joined_tensors(a), lb = ckpt::read_joined_tensors(b);
  return compare_tensor_maps(la.tensors, lb.tensors);
}

std::vector<TensorDiff> compare_tensor_maps(const TensorMap& ta_map, const TensorMap& tb_map) {
  struct {
    const TensorMap& tensors;
  } la{ta_map}, lb{tb_map};
  std::set<std::string> keys;
  for (const auto& [k, v] : la.tensors) keys.insert(k);
  for (const auto& [k, v] : lb.tensors) keys.insert(k);
  std::vector<TensorDiff> out;
  for (const auto& key : keys) {
    TensorDiff diff;
    diff.key = key;
    diff.kind = key_kind(key);
    auto ia = la.tensors.find(key), ib = lb.tensors.find(key);
    if (ia != la.tensors.end()) diff.dtype_a = ckpt::st_name(ia->second.first);
    if (ib != lb.tensors.end()) diff.dtype_b = ckpt::st_name(ib->second.first);
    if (ia == la.tensors.end() || ib == lb.tensors.end()) {
      diff.max_abs_diff = std::numeric_limits<double>::infinity();
      diff.max_ulp = std::numeric_limits<uint64_t>::max();
      out.push_back(diff);
      continue;
    }
    const auto& ta = ia->second.second;
    const auto& tb = ib->second.second;
    diff.numel = ta.numel();
    diff.shape_equal = ta.sizes() == tb.sizes();
    if (!diff.shape_equal) {
      diff.max_abs_diff = std::numeric_limits<double>::infinity();
      diff.max_ulp = std::numeric_limits<uint64_t>::max();
      out.push_back(diff);
      continue;
    }
    auto va = decode(ia->second.first, ta).flatten(), vb = decode(ib->second.first, tb).flatten();
    if (diff.numel == 0) {
      diff.bit_equal_fraction = 1.0;
      out.push_back(diff);
      continue;
    }
    if (diff.dtype_a == diff.dtype_b) {
      auto eq = raw_bits(ta).flatten().eq(raw_bits(tb).flatten());
      diff.bit_equal_fraction = eq.to(torch::kDouble).mean().item<double>();
      auto ulp =
          (ordered(ia->second.first, ta.contiguous()).flatten() - ordered(ib->second.first, tb.contiguous()).flatten())
              .abs();
      diff.max_ulp = static_cast<uint64_t>(ulp.max().item<int64_t>());
    } else {
      // Different dtypes: compare values in double; ULP in float32 terms.
      auto fa = va.to(torch::kFloat), fb = vb.to(torch::kFloat);
      diff.bit_equal_fraction = 0.0;
      auto ulp = (ordered(ckpt::StDtype::F32, fa).flatten() - ordered(ckpt::StDtype::F32, fb).flatten()).abs();
      diff.max_ulp = static_cast<uint64_t>(ulp.max().item<int64_t>());
    }
    auto finite_a = torch::isfinite(va), finite_b = torch::isfinite(vb);
    auto both_nan = torch::isnan(va).logical_and(torch::isnan(vb));
    auto same_nonfinite = va.eq(vb).logical_or(both_nan);
    auto bad = finite_a.logical_and(finite_b).logical_not().logical_and(same_nonfinite.logical_not());
    if (bad.any().item<bool>()) {
      diff.max_abs_diff = std::numeric_limits<double>::infinity();
    } else {
      auto mask = finite_a.logical_and(finite_b);
      auto abs_diff = (va - vb).abs().masked_fill(mask.logical_not(), 0.0);
      diff.max_abs_diff = abs_diff.max().item<double>();
    }
    out.push_back(diff);
  }
  return out;
}

Fingerprints read_fingerprints(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open fingerprints " + path);
  Fingerprints out;
  std::string line;
  std::getline(f, line);   // header
  int lineno = 1;
  while (std::getline(f, line)) {
    ++lineno;
    const auto c1 = line.find(','), c2 = line.rfind(',');
    if (c1 == std::string::npos || c2 == c1)
      throw std::runtime_error(path + ":" + std::to_string(lineno) + ": expected iteration,key,xxh3");
    out[std::stoll(line.substr(0, c1))].emplace_back(line.substr(c1 + 1, c2 - c1 - 1), line.substr(c2 + 1));
  }
  return out;
}

uint64_t ulp_distance(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return std::memcmp(&a, &b, 4) == 0 ? 0 : UINT64_MAX;
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  auto ord = [](int32_t i) -> int64_t { return i < 0 ? -static_cast<int64_t>(i & 0x7fffffff) : i; };
  const int64_t d = ord(ia) - ord(ib);
  return static_cast<uint64_t>(d < 0 ? -d : d);
}

uint64_t ulp_distance(double a, double b) {
  if (std::isnan(a) || std::isnan(b)) return std::memcmp(&a, &b, 8) == 0 ? 0 : UINT64_MAX;
  int64_t ia, ib;
  std::memcpy(&ia, &a, 8);
  std::memcpy(&ib, &b, 8);
  auto ord = [](int64_t i) -> __int128 {
    return i < 0 ? -static_cast<__int128>(i & 0x7fffffffffffffffLL) : static_cast<__int128>(i);
  };
  __int128 d = ord(ia) - ord(ib);
  if (d < 0) d = -d;
  return d > static_cast<__int128>(UINT64_MAX) ? UINT64_MAX : static_cast<uint64_t>(d);
}

}   // namespace rh
