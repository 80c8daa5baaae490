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
  ParamState& param_state = I.at(param);
  const StoredState& state = I.state(param_state, key);
  // fused_adam.py get_unscaled_state: the int16 remainder as it is (asserted int16 upstream);
  // fp16: float() * scale; fp8: the Float8Tensor's dequantize (code * scale_inv); bf16 widened.
  if (key == StateKey::master_param && I.mode == MasterMode::remainders) return state.data.clone();
  if (is_scaled(state.dtype)) return codec::scaled_decode(state.data, state.dtype == Dtype::fp8, state.decode_mult());
  return state.data.to(torch::kFloat, /*non_blocking=*/false, /*copy=*/true);
}

void PrecisionAdam::set_scaled_state(const std::string& param, StateKey key, const torch::Tensor& value) {
  torch::NoGradGuard no_grad;
  Impl& I = *impl_;
  ParamState& param_state = I.at(param);
  StoredState& state = I.state(param_state, key);
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
  const bool whole = value.sizes() == param_state.param.sizes();
  if (!(whole || value.sizes() == state.data.sizes()))
    throw std::invalid_argument(
        "set_scaled_state: " + where(param, key) + " expects shape " + c10::str(param_state.param.sizes()) +
        (state.data.sizes() != param_state.param.sizes() ? " or " + c10::str(state.data.sizes()) : "") + ", got " +
        c10::str(value.sizes()));
  auto full = value.detach().contiguous();
  // The owned part, shaped like the state (a no-op unless the param is split).
  auto owned = whole ? owned_part(param_state, full).reshape(state.data.sizes()) : full;
  if (is_scaled(state.dtype)) {
    const bool shared = I.cfg.shared_dp_scale;
    if (shared && !whole && param_state.end - param_state.begin != param_state.param.numel())
      throw std::invalid_argument("set_scaled_state: " + where(param, key) +
                                  " is scaled by the whole tensor's amax "
                                  "(shared_dp_scale); give the whole param's value");
    store_value_scaled(state, full, whole ? param_state.begin : 0, whole ? param_state.end : full.numel(),
                       I.cfg.scale_zero_guard, shared, I.ws);
  } else {
    state.data.copy_(owned);   // fp32 copy, bf16 RNE, or the int16 remainder
    if (state.dtype == Dtype::bf16) codec::canonical_nan_16_(state.data, owned);
  }
}

const StoredState& PrecisionAdam::stored(const std::string& param, StateKey key) const {
  Impl& I = *impl_;
  return I.state(I.at(param), key);
}

void PrecisionAdam::check_stored(const std::string& param, StateKey key, const StoredState& incoming) const {
  const Impl& I = *impl_;
  const StoredState& held = Impl::state(I.at(param), key);
  const std::string prefix = "set_stored: " + where(param, key);
  if (incoming.dtype != held.dtype)
    throw std::invalid_argument(prefix + " is held as " + to_string(held.dtype) + ", got " + to_string(incoming.dtype) +
                                " (master mode " + to_string(I.mode) + ")");
  if (!incoming.data.defined() || incoming.data.scalar_type() != held.data.scalar_type())
    throw std::invalid_argument(prefix + " expects data of type " + c10::toString(held.data.scalar_type()) + ", got " +
                                (incoming.data.defined() ? c10::toString(incoming.data.scalar_type()) : "undefined"));
  if (incoming.data.sizes() != held.data.sizes())
    throw std::invalid_argument(prefix + " expects shape " + c10::str(held.data.sizes()) + ", got " +
                                c10::str(incoming.data.sizes()));
  const bool scaled = is_scaled(held.dtype), fp8 = held.dtype == Dtype::fp8;
  if (scaled != incoming.scale.has_value())
    throw std::invalid_argument(
        prefix + (scaled ? " needs a scale (" + to_string(held.dtype) + " state)" : std::string(" takes no scale")));
  if (fp8 != incoming.scale_inv.has_value())
    throw std::invalid_argument(prefix + (fp8 ? " needs a scale_inv (fp8 state)" : std::string(" takes no scale_inv")));
  if (!scaled) return;
  // scale = amax / range: >= 0, +inf, or NaN; never negative.
  if (std::signbit(*incoming.scale) && !std::isnan(*incoming.scale))
    throw std::invalid_argument(prefix + ": scale " + std::to_string(*incoming.scale) +
                                " is negative (scale = amax / range)");
  if (fp8) {
    // scale_inv = frcp(1 / scale), with or without the zero guard: any other pair cannot come from TE.
    auto same = [](float a, float b) { return (std::isnan(a) && std::isnan(b)) || std::memcmp(&a, &b, 4) == 0; };
    const float plain = codec::scaling_from_scale(*incoming.scale, true, false).scale_inv;
    const float guarded = codec::scaling_from_scale(*incoming.scale, true, true).scale_inv;
    if (!same(*incoming.scale_inv, plain) && !same(*incoming.scale_inv, guarded))
      throw std::invalid_argument(
          prefix + ": scale_inv " + std::to_string(*incoming.scale_inv) + " does not belong to scale " +
          std::to_string(*incoming.scale) + " (expected 1/(1/scale) = " + std::to_string(plain) +
          (same(plain, guarded) ? std::string() : ", or " + std::to_string(guarded) + " with scale_zero_guard") + ")");
  }
}

void PrecisionAdam::set_stored(const std::string& param, StateKey key, const StoredState& incoming) {
  check_stored(param, key, incoming);
  StoredState& held = impl_->state(impl_->at(param), key);
  held.data.copy_(incoming.data);   // same dtype: a bitwise copy
  held.scale = incoming.scale;
  held.scale_inv = incoming.scale_inv;
}

void PrecisionAdam::adopt_stored(const std::string& param, StateKey key, StoredState incoming) {
  check_stored(param, key, incoming);
  StoredState& held = impl_->state(impl_->at(param), key);
  held.data = incoming.data.is_contiguous() ? std::move(incoming.data) : incoming.data.contiguous();
  held.scale = incoming.scale;
  held.scale_inv = incoming.scale_inv;
}

}   // namespace rh::optim
