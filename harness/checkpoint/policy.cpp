// Save policies: native, Megatron's dp_reshardable / fully_reshardable / dp_zero, per_key
// (Megatron PR 2790, weak spots included) plus per-key dtype overrides, and the inverse value
// decoding used on load (see policy.h and checkpoint.h).
#include "harness/checkpoint/policy.h"

#include "harness/optim/storage_codecs.h"

namespace rh::ckpt {

bool is_scale_key(const std::string& key) {
  auto ends = [&](const std::string& suf) {
    return key.size() > suf.size() && key.compare(key.size() - suf.size(), suf.size(), suf) == 0;
  };
  return ends(".scale") || ends(".scale_inv");
}

namespace detail {

using optim::Dtype;
using optim::StateKey;

StDtype st_of(Dtype d) {
  switch (d) {
    case Dtype::fp32: return StDtype::F32;
    case Dtype::bf16: return StDtype::BF16;
    case Dtype::fp16: return StDtype::F16;
    case Dtype::fp8: return StDtype::F8_E4M3;
    case Dtype::int16: return StDtype::I16;
  }
  throw std::logic_error("st_of: invalid Dtype");
}

torch::Tensor unscaled(const optim::PrecisionAdam& opt, const std::string& param, StateKey k) {
  if (k == StateKey::master_param && opt.master_mode() == optim::MasterMode::remainders) {
    const auto [b, e] = opt.shard_range(param);
    const auto& s = opt.stored(param, k);
    torch::Tensor w = opt.param(param).detach().reshape({-1}).narrow(0, b, e - b).reshape(s.data.sizes());
    return optim::codec::remainder_join(w.contiguous(), s.data.contiguous());
  }
  return opt.get_unscaled_state(param, k);
}

std::string field_name(const optim::PrecisionAdam& opt, StateKey k) {
  if (k == StateKey::master_param && opt.master_mode() == optim::MasterMode::remainders) return "remainder";
  return optim::key_name(k);
}

bool bits_equal(const torch::Tensor& a, const torch::Tensor& b) {
  return a.sizes() == b.sizes() && torch::equal(a.contiguous().view(torch::kInt), b.contiguous().view(torch::kInt));
}

int64_t count_bits_differ(const torch::Tensor& a, const torch::Tensor& b) {
  return a.contiguous().view(torch::kInt).ne(b.contiguous().view(torch::kInt)).sum().item<int64_t>();
}

torch::Tensor value_copy_u8(const torch::Tensor& x) {
  // Truncate toward zero in int64 and keep the low byte: what cvttss2si + a byte store (x86
  // PyTorch's float->uint8 copy) gives for |x| < 2^31. Non-finite and huge values are pinned
  // first so the result is defined (upstream's is not).
  torch::Tensor f = torch::nan_to_num(x.to(torch::kFloat), 0.0, 0.0, 0.0).clamp(-2147483648.0, 2147483520.0);
  return f.trunc().to(torch::kLong).bitwise_and(255).to(torch::kByte);
}

torch::Tensor decode_value(const torch::Tensor& data, StDtype dtype, const std::string& conversion,
                           std::optional<float> decode_mult) {
  if (conversion == "cast_f8_e4m3") return optim::codec::fp8_decode(data.contiguous());
  if (conversion == "stored" && decode_mult && (dtype == StDtype::F16 || dtype == StDtype::F8_E4M3))
    return optim::codec::scaled_decode(data.contiguous(), dtype == StDtype::F8_E4M3, *decode_mult);
  // unscaled_fp32, cast_bf16, cast_f16, value_copy_u8 (the PR's "upcast to fp32"), stored
  // fp32/bf16: a plain widening.
  return data.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

namespace {

// The fp32 value cast to a value dtype (no scale), with its conversion name.
EncodedTensor cast_value(const torch::Tensor& u, Dtype to, bool per_key_fp8, const std::string& what) {
  EncodedTensor e;
  switch (to) {
    case Dtype::fp32:
      e.data = u;
      e.dtype = StDtype::F32;
      e.conversion = "unscaled_fp32";
      break;
    case Dtype::bf16:
      e.data = u.to(torch::kBFloat16);
      e.dtype = StDtype::BF16;
      e.conversion = "cast_bf16";
      break;
    case Dtype::fp16:
      e.data = u.to(torch::kHalf);
      e.dtype = StDtype::F16;
      e.conversion = "cast_f16";
      break;
    case Dtype::fp8:
      if (per_key_fp8) {
        e.data = value_copy_u8(u);
        e.dtype = StDtype::U8;
        e.conversion = "value_copy_u8";
      } else {
        e.data = optim::codec::fp8_encode(u.contiguous());
        e.dtype = StDtype::F8_E4M3;
        e.conversion = "cast_f8_e4m3";
      }
      break;
    case Dtype::int16: throw CheckpointError(what + ": int16 is not a value dtype (only remainders are int16)");
  }
  e.exact = bits_equal(decode_value(e.data, e.dtype, e.conversion, std::nullopt), u);
  return e;
}

}   // namespace

std::vector<EncodedTensor> encode_state(const optim::PrecisionAdam& opt, const std::string& param, StateKey key,
                                        const SavePolicy& policy) {
  const std::string kname = optim::key_name(key);
  const std::string field = field_name(opt, key);
  const bool remainder = field == "remainder";
  const optim::StoredState& s = opt.stored(param, key);

  auto ov = policy.overrides.find(kname);
  if (ov != policy.overrides.end()) {
    EncodedTensor e =
        cast_value(unscaled(opt, param, key), ov->second, false, "override of '" + kname + "' for " + param);
    e.key = param + "/" + kname;
    e.kind = kname;
    e.policy = "override";
    return {e};
  }

  if (policy.kind == SavePolicyKind::native || (remainder && policy.kind == SavePolicyKind::dp_reshardable)) {
    std::vector<EncodedTensor> out;
    EncodedTensor e{param + "/" + field, field, s.data, st_of(s.dtype), to_string(policy.kind), "stored", true};
    out.push_back(e);
    for (const auto& [suffix, v] : {std::pair{".scale", s.scale}, std::pair{".scale_inv", s.scale_inv}})
      if (v)
        out.push_back(EncodedTensor{param + "/" + field + suffix, "scale", torch::scalar_tensor(*v, torch::kFloat),
                                    StDtype::F32, to_string(policy.kind), "stored", true});
    return out;
  }
  if (policy.kind == SavePolicyKind::dp_reshardable) {
    return {EncodedTensor{param + "/" + field, field, unscaled(opt, param, key), StDtype::F32, to_string(policy.kind),
                          "unscaled_fp32", true}};
  }
  if (policy.kind == SavePolicyKind::fully_reshardable || policy.kind == SavePolicyKind::dp_zero) {
    // get_parameter_state_dp_zero: `local_shards[key][...].data.copy_(tensors[key])` into
    // torch.float32 buffers for every key: get_unscaled_state's fp32 values, and the int16
    // remainder's values widened (exact: every int16 is an fp32).
    if (remainder)
      return {EncodedTensor{param + "/remainder", "remainder", s.data.to(torch::kFloat), StDtype::F32,
                            to_string(policy.kind), "remainder_widened_f32", true}};
    return {EncodedTensor{param + "/" + field, field, opt.get_unscaled_state(param, key), StDtype::F32,
                          to_string(policy.kind), "unscaled_fp32", true}};
  }
  // per_key: the PR. param -> fp32 container; moments -> their configured dtype, from the
  // unscaled fp32 value (no scale is written: fp16 unscaled, fp8 by value copy into uint8).
  if (key == StateKey::master_param) {
    if (remainder)
      return {EncodedTensor{param + "/remainder", "remainder", s.data.to(torch::kFloat), StDtype::F32, "per_key",
                            "remainder_widened_f32", true}};
    return {EncodedTensor{param + "/master_param", "master_param", unscaled(opt, param, key), StDtype::F32, "per_key",
                          "unscaled_fp32", true}};
  }
  const Dtype configured = key == StateKey::exp_avg ? opt.config().exp_avg_dtype : opt.config().exp_avg_sq_dtype;
  EncodedTensor e = cast_value(unscaled(opt, param, key), configured, true, param + "/" + kname);
  e.key = param + "/" + kname;
  e.kind = kname;
  e.policy = "per_key";
  return {e};
}

}   // namespace detail
}   // namespace rh::ckpt
