// Dtype names, Megatron's validation rules for the precision-aware optimizer options, and the
// master-weight mode those options put in effect. Messages name the option the way the command
// line spells it, so a refused run says which flag to change.
#include <stdexcept>
#include <string>

#include "harness/optim/optimizer_config.h"

namespace rh::optim {

std::string to_string(Dtype d) {
  switch (d) {
    case Dtype::fp32: return "fp32";
    case Dtype::bf16: return "bf16";
    case Dtype::fp16: return "fp16";
    case Dtype::fp8: return "fp8";
    case Dtype::int16: return "int16";
  }
  return "?";
}

Dtype parse_dtype(const std::string& s, const std::string& what) {
  if (s == "fp32") return Dtype::fp32;
  if (s == "bf16") return Dtype::bf16;
  if (s == "fp16") return Dtype::fp16;
  if (s == "fp8") return Dtype::fp8;
  if (s == "int16") return Dtype::int16;
  throw std::invalid_argument(what + ": unknown dtype '" + s + "' (expected one of fp32, bf16, fp16, fp8)");
}

torch::ScalarType storage_scalar_type(Dtype d) {
  switch (d) {
    case Dtype::fp32: return torch::kFloat;
    case Dtype::bf16: return torch::kBFloat16;
    case Dtype::fp16: return torch::kHalf;
    case Dtype::fp8: return torch::kByte;   // E4M3 bytes: LibTorch 1.13 has no fp8 dtype
    case Dtype::int16: return torch::kShort;
  }
  throw std::invalid_argument("storage_scalar_type: invalid Dtype");
}

int64_t itemsize(Dtype d) {
  switch (d) {
    case Dtype::fp32: return 4;
    case Dtype::bf16:
    case Dtype::fp16:
    case Dtype::int16: return 2;
    case Dtype::fp8: return 1;
  }
  throw std::invalid_argument("itemsize: invalid Dtype");
}

std::string to_string(MasterMode m) {
  switch (m) {
    case MasterMode::fp32: return "fp32";
    case MasterMode::fp16: return "fp16";
    case MasterMode::remainders: return "remainders";
  }
  return "?";
}

const char* key_name(StateKey k) {
  switch (k) {
    case StateKey::master_param: return "master_param";
    case StateKey::exp_avg: return "exp_avg";
    case StateKey::exp_avg_sq: return "exp_avg_sq";
  }
  return "?";
}

namespace {

[[noreturn]] void refuse(const std::string& msg) { throw std::invalid_argument("optimizer config: " + msg); }

void check_allowed(Dtype d, const char* flag, std::initializer_list<Dtype> allowed, const char* allowed_text) {
  for (Dtype a : allowed)
    if (d == a) return;
  refuse(std::string(flag) + " " + to_string(d) + " is not supported (allowed: " + allowed_text + ")");
}

}   // namespace

void validate(const OptimizerConfig& cfg, torch::ScalarType param_dtype) {
  if (param_dtype != torch::kFloat && param_dtype != torch::kBFloat16)
    refuse(std::string("model params must be fp32 or bf16, got ") + c10::toString(param_dtype));
  if (cfg.ddp_bucket_size < 0)
    refuse("--ddp-bucket-size must be >= 0 (0: one bucket), got " + std::to_string(cfg.ddp_bucket_size));
  if (!cfg.use_precision_aware_optimizer) {
    // Megatron: without the precision-aware optimizer every state dtype must be fp32.
    const std::pair<const char*, Dtype> fields[] = {{"--main-grads-dtype", cfg.main_grads_dtype},
                                                    {"--main-params-dtype", cfg.main_params_dtype},
                                                    {"--exp-avg-dtype", cfg.exp_avg_dtype},
                                                    {"--exp-avg-sq-dtype", cfg.exp_avg_sq_dtype}};
    for (const auto& [flag, dtype] : fields)
      if (dtype != Dtype::fp32)
        refuse(std::string(flag) +
               " can only be fp32 when not using precision-aware optimizer"
               " (got " +
               to_string(dtype) + "); HINT: add --use-precision-aware-optimizer");
  }
  check_allowed(cfg.main_grads_dtype, "--main-grads-dtype", {Dtype::fp32, Dtype::bf16}, "fp32, bf16");
  // TransformerEngine's FusedAdam takes fp32 or fp16 master weights only.
  check_allowed(cfg.main_params_dtype, "--main-params-dtype", {Dtype::fp32, Dtype::fp16}, "fp32, fp16");
  check_allowed(cfg.exp_avg_dtype, "--exp-avg-dtype", {Dtype::fp32, Dtype::bf16, Dtype::fp16, Dtype::fp8},
                "fp32, bf16, fp16, fp8");
  check_allowed(cfg.exp_avg_sq_dtype, "--exp-avg-sq-dtype", {Dtype::fp32, Dtype::bf16, Dtype::fp16, Dtype::fp8},
                "fp32, bf16, fp16, fp8");
  if (!(cfg.beta1 >= 0.0 && cfg.beta1 < 1.0)) refuse("beta1 must be in [0, 1)");
  if (!(cfg.beta2 >= 0.0 && cfg.beta2 < 1.0)) refuse("beta2 must be in [0, 1)");
  if (!(cfg.eps > 0.0)) refuse("eps must be > 0");
  if (!(cfg.weight_decay >= 0.0)) refuse("weight_decay must be >= 0");
}

MasterMode effective_master_mode(const OptimizerConfig& cfg, torch::ScalarType param_dtype) {
  if (!cfg.use_precision_aware_optimizer) return MasterMode::fp32;
  if (cfg.main_params_dtype == Dtype::fp16) return MasterMode::fp16;
  // As upstream: remainders replace the fp32 master only for bf16 params.
  if (cfg.store_param_remainders && param_dtype == torch::kBFloat16) return MasterMode::remainders;
  return MasterMode::fp32;
}

}   // namespace rh::optim
