// PrecisionAdam's state as checkpoints exchange it: upstream's get_unscaled_state and
// set_scaled_state (fp32 values, re-scaled on the way in), and the raw stored form (dtype, scales)
// with the checks a lossless restore needs. The optimizer itself is precision_adam.cpp.
#include <stdexcept>
#include <string>

#include "harness/optim/adam_step.h"
#include "harness/optim/precision_adam.h"
#include "harness/optim/precision_adam_impl.h"
#include "harness/optim/storage_codecs.h"

namespace rh::optim {

using detail::ParamState;

namespace {

using detail::is_scaled;
using detail::owned_part;
using detail::store_value_scaled;

std::string where(const std::string& param, StateKey key) {
  return "param '" + param + "' state '" + key_name(key) + "'";
}

}   // namespace

torch::Tensor PrecisionAdam::get_unscaled_state(const std::string& param, StateKey key) const {
  Impl& I = *impl_;
  ParamState& ps = I.at(param);
  const StoredState& st = I.state(ps, key);
  // fused_adam.py get_unscaled_state: the int16 remainder as it is (asserted int16 upstream);
  // fp16: float() * scale; fp8: the Float8Tensor's dequantize (code * scale_inv); bf16 widened.
  if (key == StateKey::master_param && I.mode == MasterMode::remainders) return st.data.clone();
  if (is_scaled(st.dtype)) return codec::scaled_decode(st.data, st.dtype == Dtype::fp8, st.decode_mult());
  return st.data.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

void PrecisionAdam::set_scaled_state(const std::string& param, StateKey key, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  Impl& I = *impl_;
  ParamState& ps = I.at(param);
  StoredState& st = I.state(ps, key);
  // fused_adam.py set_scaled_state: `assert unscaled_state.dtype == torch.int16` for master_param
  // under remainders, `== torch.float32` for everything else.
  const bool remainder = key == StateKey::master_param && I.mode == MasterMode::remainders;
  const auto want = remainder ? torch::kShort : torch::kFloat;
  if (!value.defined() || value.scalar_type() != want)
    throw std::invalid_argument("set_scaled_state: " + where(param, key) + " takes " +
                                (remainder ? "the int16 remainder" : std::string("an fp32 value")) + ", got " +
                                (value.defined() ? c10::toString(value.scalar_type()) : "undefined") +
                                " (upstream TransformerEngine fails an assertion here: FusedAdam.set_scaled_state "
                                "asserts unscaled_state.dtype == " +
                                (remainder ? "torch.int16" : "torch.float32") + ")");
  const bool whole = value.sizes() == ps.param.sizes();
  if (!(whole || value.sizes() == st.data.sizes()))
    throw std::invalid_argument("set_scaled_state: " + where(param, key) + " expects shape " +
                                c10::str(ps.param.sizes()) +
                                (st.data.sizes() != ps.param.sizes() ? " or " + c10::str(st.data.sizes()) : "") +
                                ", got " + c10::str(value.sizes()));
  auto full = value.detach().contiguous();
  // The owned part, shaped like the state (a no-op unless the param is split).
  auto v = whole ? owned_part(ps, full).reshape(st.data.sizes()) : full;
  if (is_scaled(st.dtype)) {
    const bool shared = I.cfg.shared_dp_scale;
    if (shared && !whole && ps.end - ps.begin != ps.param.numel())
      throw std::invalid_argument("set_scaled_state: " + where(param, key) +
                                  " is scaled by the whole tensor's amax "
                                  "(shared_dp_scale); give the whole param's value");
    store_value_scaled(st, full, whole ? ps.begin : 0, whole ? ps.end : full.numel(), I.cfg.scale_zero_guard, shared,
                       I.ws);
  } else {
    st.data.copy_(v);   // fp32 copy, bf16 RNE, or the int16 remainder
    if (st.dtype == Dtype::bf16) codec::canonical_nan_16_(st.data, v);
  }
}

const StoredState& PrecisionAdam::stored(const std::string& param, StateKey key) const {
  Impl& I = *impl_;
  return I.state(I.at(param), key);
}

void PrecisionAdam::check_stored(const std::string& param, StateKey key, const StoredState& s) const {
  const Impl& I = *impl_;
  const StoredState& st = Impl::state(I.at(param), key);
  const std::string w = "set_stored: " + where(param, key);
  if (s.dtype != st.dtype)
    throw std::invalid_argument(w + " is held as " + to_string(st.dtype) + ", got " + to_string(s.dtype) +
                                " (master mode " + to_string(I.mode) + ")");
  if (!s.data.defined() || s.data.scalar_type() != st.data.scalar_type())
    throw std::invalid_argument(w + " expects data of type " + c10::toString(st.data.scalar_type()) + ", got " +
                                (s.data.defined() ? c10::toString(s.data.scalar_type()) : "undefined"));
  if (s.data.sizes() != st.data.sizes())
    throw std::invalid_argument(w + " expects shape " + c10::str(st.data.sizes()) + ", got " +
                                c10::str(s.data.sizes()));
  const bool scaled = is_scaled(st.dtype), fp8 = st.dtype == Dtype::fp8;
  if (scaled != s.scale.has_value())
    throw std::invalid_argument(
        w + (scaled ? " needs a scale (" + to_string(st.dtype) + " state)" : std::string(" takes no scale")));
  if (fp8 != s.scale_inv.has_value())
    throw std::invalid_argument(w + (fp8 ? " needs a scale_inv (fp8 state)" : std::string(" takes no scale_inv")));
  if (!scaled) return;
  // scale = amax / range: >= 0, +inf, or NaN; never negative.
  if (std::signbit(*s.scale) && !std::isnan(*s.scale))
    throw std::invalid_argument(w + ": scale " + std::to_string(*s.scale) + " is negative (scale = amax / range)");
  if (fp8) {
    // scale_inv = frcp(1 / scale), with or without the zero guard: any other pair cannot come from TE.
    auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; };
    const float plain = codec::scaling_from_scale(*s.scale, true, false).scale_inv;
    const float guarded = codec::scaling_from_scale(*s.scale, true, true).scale_inv;
    if (!same(*s.scale_inv, plain) && !same(*s.scale_inv, guarded))
      throw std::invalid_argument(
          w + ": scale_inv " + std::to_string(*s.scale_inv) + " does not belong to scale " + std::to_string(*s.scale) +
          " (expected 1/(1/scale) = " + std::to_string(plain) +
          (same(plain, guarded) ? std::string() : ", or " + std::to_string(guarded) + " with scale_zero_guard") + ")");
  }
}

void PrecisionAdam::set_stored(const std::string& param, StateKey key, const StoredState& s) {
  check_stored(param, key, s);
  StoredState& st = impl_->state(impl_->at(param), key);
  st.data.copy_(s.data);   // same dtype: a bitwise copy
  st.scale = s.scale;
  st.scale_inv = s.scale_inv;
}

void PrecisionAdam::adopt_stored(const std::string& param, StateKey key, StoredState s) {
  check_stored(param, key, s);
  StoredState& st = impl_->state(impl_->at(param), key);
  st.data = s.data.is_contiguous() ? std::move(s.data) : s.data.contiguous();
  st.scale = s.scale;
  st.scale_inv = s.scale_inv;
}

}   // namespace rh::optim
