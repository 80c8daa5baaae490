// The field table behind RunConfig: each field once, with its section, key, flag and help, from
// which the command-line flags, JSON and TOML forms are derived.
#include "harness/train/config.h"

#include "harness/base/suggest.h"
#include "harness/base/input.h"
#include "harness/train/schedule.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <fstream>
#include <cmath>
#include <charconv>
#include <limits>
#include <functional>
#include <map>
#include <tuple>
#include <sstream>
#include <stdexcept>
#include <variant>

namespace rh {
namespace {

using FieldPtr = std::variant<int64_t*, uint64_t*, double*, bool*, std::string*, optim::Dtype*>;

// A field's own valid range, whatever else is set: integers in [lo, hi], doubles finite and in
// [lo, hi] (hi = +inf: no upper bound). Every bound is an integer below 2^53, exact as a double.
// Files' values are checked against it when read (field_from_value), every value again by
// validate() (command-line flags too). Ranges that depend on another field stay in validate().
struct Range {
  bool bounded = false;
  double lo = 0, hi = 0;
};
constexpr double kNoUpper = std::numeric_limits<double>::infinity();
constexpr Range in(double lo, double hi) { return {true, lo, hi}; }

struct Field {
  const char* section;   // "model" | "optimizer" | "train"
  const char* key;       // JSON / TOML key
  const char* flag;      // command-line flag
  const char* help;      // "...: a | b | c" lists a string field's valid values (choices_of)
  FieldPtr ptr;
  Range range = {};   // numbers only; unset: any value of the type
};

std::vector<Field> fields(RunConfig& c) {
  auto& m = c.model;
  auto& o = c.optim;
  auto& t = c.train;
  return {
      {"model", "vocab_size", "--vocab-size", "vocabulary size V", &m.vocab_size, in(1, 1 << 20)},
      {"model", "seq_len", "--seq-length", "sequence length T", &m.seq_len, in(1, 1 << 16)},
      {"model", "d_model", "--hidden-size", "model width C", &m.d_model, in(1, 1 << 14)},
      {"model", "n_layers", "--num-layers", "transformer layers L", &m.n_layers, in(1, 256)},
      {"model", "n_heads", "--num-attention-heads", "attention heads H", &m.n_heads, in(1, 1 << 10)},
      {"model", "n_experts", "--num-experts", "experts per MoE layer E", &m.n_experts, in(1, 1 << 10)},
      {"model", "top_k", "--moe-router-topk", "experts per token K", &m.top_k},
      {"model", "dead_expert", "--moe-dead-expert",
       "not upstream: an expert the router never selects (-1 = none), a dead expert", &m.dead_expert},
      {"model", "score_function", "--moe-router-score-function", "router scores: softmax | sigmoid", &m.score_function},
      {"model", "enable_expert_bias", "--moe-router-enable-expert-bias",
       "aux-loss-free balancing: a per-router expert bias updated from token counts (sigmoid only)",
       &m.enable_expert_bias},
      {"model", "bias_update_rate", "--moe-router-bias-update-rate", "expert-bias update rate", &m.bias_update_rate},
      {"model", "capacity_factor", "--moe-expert-capacity-factor",
       "expert capacity factor; < 0 = none, no token dropping (upstream default None)", &m.capacity_factor},
      {"model", "token_drop_policy", "--moe-token-drop-policy",
       "which pairs an over-capacity expert keeps: probs | position", &m.token_drop_policy},
      {"model", "pad_to_capacity", "--moe-pad-expert-input-to-capacity",
       "every expert processes exactly its capacity of tokens (needs a capacity factor)", &m.pad_to_capacity},
      {"model", "router_dtype", "--moe-router-dtype",
       "router logits dtype (upstream default none = the input's dtype; ours fp32): none | fp32 | fp64",
       &m.router_dtype},
      {"model", "ffn_hidden", "--moe-ffn-hidden-size", "expert SwiGLU hidden size F", &m.ffn_hidden, in(1, 1 << 16)},
      {"model", "aux_loss_coeff", "--moe-aux-loss-coeff", "load-balancing loss coefficient", &m.aux_loss_coeff},
      {"model", "z_loss_coeff", "--moe-z-loss-coeff", "router z-loss coefficient (0 = off)", &m.z_loss_coeff},
      {"model", "dropout", "--dropout", "attention and hidden dropout", &m.dropout},
      {"model", "router_jitter", "--moe-input-jitter-eps", "router input jitter (0 = off)", &m.router_jitter},
      {"model", "rope_theta", "--rotary-base", "RoPE base", &m.rope_theta},
      {"model", "init_std", "--init-method-std", "init standard deviation", &m.init_std},
      {"model", "param_dtype", "--params-dtype", "parameter dtype: bf16 | fp32", &m.param_dtype},
      {"model", "compute", "--compute", "bf16 compute: auto | fp32 | native", &m.compute},
      {"optimizer", "use_precision_aware_optimizer", "--use-precision-aware-optimizer",
       "keep optimizer states in the dtypes below", &o.use_precision_aware_optimizer},
      {"optimizer", "main_grads_dtype", "--main-grads-dtype", "fp32 | bf16", &o.main_grads_dtype},
      {"optimizer", "main_params_dtype", "--main-params-dtype", "fp32 | fp16", &o.main_params_dtype},
      {"optimizer", "exp_avg_dtype", "--exp-avg-dtype", "fp32 | bf16 | fp16 | fp8", &o.exp_avg_dtype},
      {"optimizer", "exp_avg_sq_dtype", "--exp-avg-sq-dtype", "fp32 | bf16 | fp16 | fp8", &o.exp_avg_sq_dtype},
      {"optimizer", "store_param_remainders", "--store-param-remainders",
       "bf16 weight + int16 remainder instead of an fp32 master", &o.store_param_remainders},
      {"optimizer", "beta1", "--adam-beta1", "Adam beta1", &o.beta1},
      {"optimizer", "beta2", "--adam-beta2",
       "Adam beta2 (Megatron's default is 0.999; 0.95 is its GPT recipes' value, "
       "examples/gpt3/train_gpt3_175b_distributed.sh)",
       &o.beta2},
      {"optimizer", "eps", "--adam-eps", "Adam epsilon", &o.eps},
      {"optimizer", "weight_decay", "--weight-decay",
       "decoupled (AdamW) or L2 decay (Megatron's default is 0.01; 0.1 is its GPT recipes' value)",
       &o.weight_decay},
      {"optimizer", "adam_w_mode", "--adam-w-mode", "AdamW (true) or L2 decay (false)", &o.adam_w_mode},
      {"optimizer", "scale_zero_guard", "--scale-zero-guard",
       "not upstream: fp16/fp8 states whose scale has no finite reciprocal (all-zero) keep zeros "
       "instead of TE's 0 * inf = NaN fp8 codes",
       &o.scale_zero_guard},
      {"optimizer", "ddp_bucket_size", "--ddp-bucket-size",
       "data parallel: elements per bucket of Megatron's param/grad buffer (0 = one bucket, upstream's "
       "default without --overlap-grad-reduce)",
       &o.ddp_bucket_size},
      {"optimizer", "ddp_pad_buckets_for_high_nccl_busbw", "--ddp-pad-buckets-for-high-nccl-busbw",
       "data parallel: pad bucket ends to lcm(dp, 128, 2^16) instead of lcm(dp, 128)",
       &o.ddp_pad_buckets_for_high_nccl_busbw},
      {"optimizer", "shared_dp_scale", "--shared-dp-scale",
       "not upstream: ranks holding parts of one fp16/fp8 state share one scale (all-reduced amax) "
       "instead of TE's per-shard scale",
       &o.shared_dp_scale},
      {"train", "iterations", "--train-iters", "iterations N", &t.iterations, in(1, kMaxIterations)},
      {"train", "global_batch", "--global-batch-size", "samples per iteration", &t.global_batch, in(1, kMaxBatch)},
      {"train", "micro_batch", "--micro-batch-size", "samples per forward/backward", &t.micro_batch, in(1, kMaxBatch)},
      {"train", "lr", "--lr", "peak learning rate", &t.lr, in(0, kNoUpper)},
      {"train", "min_lr", "--min-lr", "cosine floor", &t.min_lr, in(0, kNoUpper)},
      {"train", "lr_warmup_iters", "--lr-warmup-iters", "linear warmup iterations", &t.lr_warmup_iters,
       in(0, kMaxIterations)},
      {"train", "lr_decay_iters", "--lr-decay-iters", "schedule length", &t.lr_decay_iters, in(1, kMaxIterations)},
      {"train", "lr_warmup_init", "--lr-warmup-init", "learning rate at the start of warmup", &t.lr_warmup_init,
       in(0, kNoUpper)},
      {"train", "lr_decay_style", "--lr-decay-style",
       "constant | linear | cosine | inverse-square-root | WSD (Megatron's default: linear)", &t.lr_decay_style},
      {"train", "lr_wsd_decay_style", "--lr-wsd-decay-style", "WSD anneal: exponential | linear | cosine | minus_sqrt",
       &t.lr_wsd_decay_style},
      {"train", "lr_wsd_decay_iters", "--lr-wsd-decay-iters", "WSD anneal iterations (-1 = unset)",
       &t.lr_wsd_decay_iters, in(-1, kMaxIterations)},
      {"train", "start_weight_decay", "--start-weight-decay",
       "weight decay at the start of its schedule (-1 = --weight-decay)", &t.start_weight_decay},
      {"train", "end_weight_decay", "--end-weight-decay",
       "weight decay at the end of its schedule (-1 = --weight-decay)", &t.end_weight_decay},
      {"train", "weight_decay_incr_style", "--weight-decay-incr-style", "constant | linear | cosine",
       &t.weight_decay_incr_style},
      {"train", "override_opt_param_scheduler", "--override-opt_param-scheduler",
       "on resume, use this run's scheduler values, not the checkpoint's", &t.override_opt_param_scheduler},
      {"train", "use_checkpoint_opt_param_scheduler", "--use-checkpoint-opt_param-scheduler",
       "on resume, use the checkpoint's scheduler values", &t.use_checkpoint_opt_param_scheduler},
      {"train", "clip_grad", "--clip-grad", "global-norm clip (0 = off)", &t.clip_grad, in(0, kNoUpper)},
      {"train", "seed", "--seed", "init and dropout seed", &t.seed},
      {"train", "data_seed", "--data-seed", "synthetic corpus seed", &t.data_seed},
      {"train", "threads", "--threads", "intra-op threads", &t.threads, in(1, kMaxThreads)},
      {"train", "device", "--device", "cpu | cuda", &t.device},
  };
}

nlohmann::json field_to_json(const FieldPtr& p) {
  return std::visit(
      [](auto* v) -> nlohmann::json {
        using T = std::remove_pointer_t<decltype(v)>;
        if constexpr (std::is_same_v<T, optim::Dtype>) {
          return optim::to_string(*v);
        } else {
          return *v;
        }
      },
      p);
}

// The valid values of a field, from its help text ("param dtype: bf16 | fp32" -> {bf16, fp32}), so
// the help shows them, the parser checks them, and the two never disagree. Empty: any value.
std::vector<std::string> choices_of(const std::string& help) {
  const auto colon = help.rfind(':');
  const std::string tail = colon == std::string::npos ? help : help.substr(colon + 1);
  if (tail.find(" | ") == std::string::npos) return {};
  std::vector<std::string> out;
  size_t pos = 0;
  while (pos <= tail.size()) {
    const auto bar = tail.find('|', pos);
    std::string w = tail.substr(pos, bar == std::string::npos ? std::string::npos : bar - pos);
    w.erase(0, w.find_first_not_of(' '));
    w.erase(w.find_last_not_of(' ') + 1);
    if (w.empty() || w.find_first_not_of("abcdefghijklmnopqrstuvwxyz0123456789_-") != std::string::npos) return {};
    out.push_back(w);
    if (bar == std::string::npos) break;
    pos = bar + 1;
  }
  return out;
}

std::string join(const std::vector<std::string>& names) {
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  return all;
}

// A double as short as reads back the same (0.1, not 0.10000000000000001); nan, inf as such:
// std::to_chars without a precision gives the shortest round-trip form.
std::string shortest(double v) {
  char buf[32];
  const auto end = std::to_chars(buf, buf + sizeof buf, v).ptr;
  return std::string(buf, end);
}

// A range as its messages say it: "in [1, 10000000]", or ">= 0" without an upper bound.
std::string range_text(const Range& r) {
  auto bound = [](double b) { return std::to_string(static_cast<int64_t>(b)); };
  if (r.hi == kNoUpper) return ">= " + bound(r.lo);
  return "in [" + bound(r.lo) + ", " + bound(r.hi) + "]";
}

bool in_range(const Range& r, int64_t v) {
  return !r.bounded || (v >= static_cast<int64_t>(r.lo) && (r.hi == kNoUpper || v <= static_cast<int64_t>(r.hi)));
}
bool in_range(const Range& r, double v) { return !r.bounded || (std::isfinite(v) && v >= r.lo && v <= r.hi); }

// Sets a field from a value a file gave, checked against the field's type and its range or choices
// in one step ("expected an integer in [1, 10000000], got 0"); messages name `where` and `key`
// ("section.key").
void field_from_value(const Field& f, const SettingValue& v, const std::string& where, const std::string& key) {
  auto fail = [&](const std::string& expected) {
    throw std::invalid_argument(where + ": key '" + key + "': expected " + expected + ", got " + v.shown);
  };
  const Range& r = f.range;
  std::visit(
      [&](auto* dst) {
        using T = std::remove_pointer_t<decltype(dst)>;
        if constexpr (std::is_same_v<T, bool>) {
          if (!std::holds_alternative<bool>(v.value)) fail("true or false");
          *dst = std::get<bool>(v.value);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          // 2^64-1 (JSON) is its own alternative: read as int64 it would wrap to -1 and the message show -1.
          const std::string expected =
              "an integer " + (r.bounded ? range_text(r) : std::string("in [-2^63, 2^63 - 1]"));
          const auto* i = std::get_if<int64_t>(&v.value);
          if (i == nullptr || !in_range(r, *i)) fail(expected);
          *dst = *i;
        } else if constexpr (std::is_same_v<T, uint64_t>) {
          if (const auto* u = std::get_if<uint64_t>(&v.value)) {
            *dst = *u;
          } else {
            const auto* i = std::get_if<int64_t>(&v.value);
            if (i == nullptr || *i < 0) fail("a non-negative integer");
            *dst = static_cast<uint64_t>(*i);
          }
        } else if constexpr (std::is_same_v<T, double>) {
          const std::string expected = r.bounded ? "a finite number " + range_text(r) : "a number";
          double d = 0;
          if (const auto* i = std::get_if<int64_t>(&v.value)) d = static_cast<double>(*i);
          else if (const auto* u = std::get_if<uint64_t>(&v.value)) d = static_cast<double>(*u);
          else if (const auto* x = std::get_if<double>(&v.value)) d = *x;
          else fail(expected);
          if (!in_range(r, d)) fail(expected);
          *dst = d;
        } else if constexpr (std::is_same_v<T, std::string>) {
          const auto valid = choices_of(f.help);
          const auto* s = std::get_if<std::string>(&v.value);
          if (s == nullptr) fail(valid.empty() ? "a string" : "one of " + join(valid));
          if (!valid.empty() && std::find(valid.begin(), valid.end(), *s) == valid.end()) fail("one of " + join(valid));
          *dst = *s;
        } else {
          if (!std::holds_alternative<std::string>(v.value)) fail("a dtype string (fp32, bf16, fp16, fp8)");
          *dst = optim::parse_dtype(std::get<std::string>(v.value), where + ": key '" + key + "'");
        }
      },
      f.ptr);
}

void require(bool ok, const std::string& msg) {
  if (!ok) throw std::invalid_argument(msg);
}

// Refuses `v` unless it is one of `names`, listing them: "<what> must be one of a, b, c, got 'v'".
// (The list is built before the message: an argument filled in by the condition itself was
// empty in the message, as GCC evaluates the message first.)
void require_one_of(const std::string& v, const std::vector<std::string>& names, const std::string& what) {
  if (std::find(names.begin(), names.end(), v) != names.end()) return;
  require(false, what + " must be one of " + join(names) + ", got '" + quote_text(v) + "'");
}

// The asserts of optimizer_param_scheduler.py OptimizerParamScheduler.__init__ / get_wd, and
// arguments.py's choices, as bad input.
void validate_scheduler(const RunConfig& c) {
  const auto& t = c.train;
  require_one_of(t.lr_decay_style, lr_decay_styles(), "train.lr_decay_style (--lr-decay-style)");
  require_one_of(t.lr_wsd_decay_style, lr_wsd_decay_styles(), "train.lr_wsd_decay_style (--lr-wsd-decay-style)");
  require_one_of(t.weight_decay_incr_style, wd_incr_styles(),
                 "train.weight_decay_incr_style (--weight-decay-incr-style)");
  require(t.lr_decay_style != "WSD" || t.lr_wsd_decay_iters >= 0,
          "train.lr_decay_style WSD needs train.lr_wsd_decay_iters (--lr-wsd-decay-iters) >= 0");
  require(t.lr_wsd_decay_iters >= -1 && t.lr_wsd_decay_iters <= t.lr_decay_iters,
          "train.lr_wsd_decay_iters must be -1 (unset) or in [0, train.lr_decay_iters]");
  require(std::isfinite(t.lr_warmup_init) && t.lr_warmup_init >= 0 && t.lr_warmup_init <= t.lr,
          "train.lr_warmup_init (--lr-warmup-init) must be in [0, train.lr]");
  for (auto [name, v] : {std::pair{"train.start_weight_decay", t.start_weight_decay},
                         std::pair{"train.end_weight_decay", t.end_weight_decay}})
    require(std::isfinite(v) && (v >= 0 || v == -1),
            std::string(name) + " must be >= 0 or -1 (= optimizer.weight_decay)");
  // arguments.py validate_args (NVIDIA/Megatron-LM main d98e8a6, lines 1393-1400): constant
  // asserts --start/--end-weight-decay are unset (it sets both to --weight-decay itself); linear
  // and cosine assert both are set.
  const bool start_set = t.start_weight_decay != -1, end_set = t.end_weight_decay != -1;
  if (t.weight_decay_incr_style == "constant")
    require(!start_set && !end_set,
            "train.weight_decay_incr_style constant: train.start_weight_decay and train.end_weight_decay "
            "(--start/--end-weight-decay) must be unset (upstream asserts it; the decay is --weight-decay)");
  else
    require(start_set && end_set,
            "train.weight_decay_incr_style " + t.weight_decay_incr_style +
                " needs both train.start_weight_decay and train.end_weight_decay (--start/--end-weight-decay; "
                "upstream asserts both are set)");
  const auto s = scheduler_from_config(c);
  require(s.end_wd >= s.start_wd,
          "train.end_weight_decay must be >= train.start_weight_decay (upstream asserts end_wd >= start_wd)");
  require(!(t.override_opt_param_scheduler && t.use_checkpoint_opt_param_scheduler),
          "train.override_opt_param_scheduler and train.use_checkpoint_opt_param_scheduler: both override and "
          "use-checkpoint are set.");
}

// Every field's own range and choices, from the table, in table order: "<section.key> (<flag>)
// must be in [lo, hi], got v", "... must be finite and >= 0, got nan", "... must be one of a, b,
// got 'v'".
void validate_fields(const RunConfig& c) {
  RunConfig copy = c;
  for (const auto& f : fields(copy)) {
    const std::string what = std::string(f.section) + "." + f.key + " (" + f.flag + ")";
    const Range& r = f.range;
    std::visit(
        [&](auto* v) {
          using T = std::remove_pointer_t<decltype(v)>;
          if constexpr (std::is_same_v<T, int64_t>) {
            require(in_range(r, *v), what + " must be " + range_text(r) + ", got " + std::to_string(*v));
          } else if constexpr (std::is_same_v<T, double>) {
            require(in_range(r, *v), what + " must be finite and " + range_text(r) + ", got " + shortest(*v));
          } else if constexpr (std::is_same_v<T, std::string>) {
            if (const auto valid = choices_of(f.help); !valid.empty()) require_one_of(*v, valid, what);
          }
        },
        f.ptr);
  }
}

}   // namespace

// Message order, decided once: validate() reports the first bad field in the field table's order
// (model, optimizer, train: the model's sizes before train.iterations), each against its own
// range or choices, and only then the rules that relate several fields (batch divisibility, the
// schedule's, the parameter count, the model's and optimizer's own rules). A file's bad value is
// refused earlier, when it is read, and there the first one the file gives is reported (in the
// order its reader keeps: a JSON object's and a TOML table's keys sorted by name).
void validate(const RunConfig& c) {
  validate_fields(c);
  const auto& t = c.train;
  require(t.global_batch % t.micro_batch == 0, "train.global_batch (" + std::to_string(t.global_batch) +
                                                   ") must be a multiple of train.micro_batch (" +
                                                   std::to_string(t.micro_batch) + ")");
  require(t.min_lr <= t.lr, "train.min_lr must be in [0, lr]");
  require(t.lr_decay_iters > t.lr_warmup_iters, "train.lr_decay_iters must be > train.lr_warmup_iters >= 0");
  validate_scheduler(c);
#ifndef RH_WITH_CUDA
  require(t.device != "cuda", "train.device (--device) cuda: this build has no CUDA (LibTorch without CUDA)");
#endif
  // The model's own rules (layers, heads dividing the width, top-k <= experts, dropout in
  // [0, 1)), then the parameter count estimated without overflow (each size is capped above).
  const auto& m = c.model;
  models::validate_config(c.model);
  const double params = double(m.vocab_size) * double(m.d_model) * 2 +
                        double(m.n_layers) * (4.0 * double(m.d_model) * double(m.d_model) +
                                              3.0 * double(m.n_experts) * double(m.d_model) * double(m.ffn_hidden));
  require(params <= kMaxParams, "the model would have about " + std::to_string(static_cast<int64_t>(params)) +
                                    " parameters, more than this tool's limit of " +
                                    std::to_string(static_cast<int64_t>(kMaxParams)));
  optim::validate(c.optim, c.model.param_dtype == "bf16" ? torch::kBFloat16 : torch::kFloat);
}

nlohmann::json to_json(const RunConfig& cfg) {
  RunConfig copy = cfg;
  nlohmann::json j = nlohmann::json::object();
  for (const auto& f : fields(copy)) j[f.section][f.key] = field_to_json(f.ptr);
  return j;
}

// A field's Megatron name: its flag without the dashes, '-' as '_' ("--train-iters" ->
// "train_iters"). Config and scenario files accept it beside the key; the key is the one name
// the tool writes (config.json, manifests, --print-config).
std::string megatron_name(const Field& f) {
  std::string n = std::string(f.flag).substr(2);
  for (char& c : n)
    if (c == '-') c = '_';
  return n;
}

// The field `key` names in `section` (its key or its Megatron name), or null.
const Field* find_field(const std::vector<Field>& fs, const std::string& section, const std::string& key) {
  for (const auto& f : fs)
    if (section == f.section && (key == f.key || key == megatron_name(f))) return &f;
  return nullptr;
}

SettingValue json_setting(const nlohmann::json& v) {
  SettingValue s;
  if (v.is_boolean()) s.value = v.get<bool>();
  else if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)) s.value = v.get<uint64_t>();
  else if (v.is_number_integer()) s.value = v.get<int64_t>();
  else if (v.is_number_float()) s.value = v.get<double>();
  else if (v.is_string()) s.value = v.get<std::string>();
  s.shown = quote_json(v);
  return s;
}

SectionSettings::SectionSettings(RunConfig& cfg, const std::string& section, const std::string& where)
    : cfg_(cfg), section_(section) {
  bool known_section = false;
  for (const auto& f : fields(cfg)) known_section = known_section || section == f.section;
  require(known_section, where + ": unknown section '" + section + "' (expected model, optimizer or train)");
}

void SectionSettings::set(const std::string& key, const SettingValue& value, const std::string& where) {
  const auto fs = fields(cfg_);
  const Field* hit = find_field(fs, section_, key);
  if (hit == nullptr) {
    std::vector<std::string> names;
    for (const auto& f : fs)
      if (section_ == f.section) names.insert(names.end(), {f.key, megatron_name(f)});
    require(false, where + ": unknown key '" + section_ + "." + key + "'" + did_you_mean(key, names));
  }
  const auto [first, fresh] = given_.emplace(hit->key, key);
  require(fresh, where + ": '" + section_ + "." + first->second + "' and '" + section_ + "." + key +
                     "' name one setting (" + hit->key + ", flag " + hit->flag + "): give it once");
  field_from_value(*hit, value, where, section_ + "." + hit->key);
}

void apply_json(RunConfig& cfg, const nlohmann::json& j, const std::string& where) {
  require(j.is_object(), where + ": expected a table of sections model/optimizer/train");
  for (const auto& [section, body] : j.items()) {
    SectionSettings settings(cfg, section, where);
    require(body.is_object(), where + ": section '" + section + "' must be a table");
    for (const auto& [key, value] : body.items()) settings.set(key, json_setting(value), where);
  }
}

RunConfig run_config_from_json(const nlohmann::json& j, const std::string& where) {
  RunConfig cfg;
  apply_json(cfg, j, where);
  return cfg;
}

RunConfig load_run_config_file(const std::string& path, std::set<std::string>* keys_given) {
  std::string text;
  try {
    text = read_regular_file(path, kMaxConfigBytes);   // no FIFO, no /dev/zero
  } catch (const InputError& e) {
    throw std::invalid_argument("run config " + std::string(e.what()));
  }
  // Depth-bounded (a file of 100k '[' must not overflow the parser's or dump()'s stack).
  const nlohmann::json j = parse_json_unique(text, path);
  RunConfig cfg = run_config_from_json(j, path);   // validates the shape before keys are listed
  if (keys_given) {                                // by their keys, whichever name the file used
    const auto fs = fields(cfg);
    for (const auto& [section, body] : j.items())
      for (const auto& [key, value] : body.items())
        if (const Field* f = find_field(fs, section, key)) keys_given->insert(section + "." + f->key);
  }
  return cfg;
}

std::vector<ConfigChange> adopt_saved_config(
    RunConfig& cfg, const nlohmann::json& saved,
    const std::function<bool(const std::string&, const std::string&, const std::string&)>& given,
    const std::string& where) {
  std::vector<ConfigChange> changes;
  if (!saved.is_object()) return changes;
  for (const auto& f : fields(cfg)) {
    if (!saved.contains(f.section) || !saved[f.section].is_object() || !saved[f.section].contains(f.key)) continue;
    const nlohmann::json& was = saved[f.section][f.key];
    if (!given(f.section, f.key, f.flag)) {
      field_from_value(f, json_setting(was), where, std::string(f.section) + "." + f.key);
      continue;
    }
    const nlohmann::json now = field_to_json(f.ptr);
    if (now != was) {
      auto text = [](const nlohmann::json& v) { return v.is_string() ? v.get<std::string>() : v.dump(); };
      changes.push_back({f.section, f.flag, text(was), text(now)});
    }
  }
  return changes;
}

namespace {

std::string default_text(const FieldPtr& p) {
  const nlohmann::json j = field_to_json(p);
  return j.is_string() ? j.get<std::string>() : j.dump();
}

}   // namespace

void add_run_options(CLI::App& app, RunConfig& cfg) {
  for (const auto& f : fields(cfg)) {
    const std::string group = std::string(f.section) + " options";
    const std::string def = default_text(f.ptr);
    std::visit(
        [&](auto* dst) {
          using T = std::remove_pointer_t<decltype(dst)>;
          if constexpr (std::is_same_v<T, bool>) {
            // Two plain flags instead of CLI11's "--x,!--no-x", whose help shows "{false}" for the
            // negation and reads as the default.
            const std::string help = std::string(f.help) + " (default: " + def + ")";
            app.add_flag_callback(
                   f.flag, [dst] { *dst = true; }, help)
                ->group(group);
            app.add_flag_callback(
                   std::string("--no-") + (f.flag + 2), [dst] { *dst = false; },
                   std::string("set ") + f.flag + " false")
                ->group(group);
          } else if constexpr (std::is_same_v<T, optim::Dtype>) {
            const auto valid = choices_of(f.help);
            app.add_option_function<std::string>(
                   f.flag,
                   [dst, flag = std::string(f.flag)](const std::string& s) { *dst = optim::parse_dtype(s, flag); },
                   f.help)
                ->check(CLI::IsMember(valid))
                ->default_str(def)
                ->group(group);
          } else {
            // A bounded number's help says its range; validate() checks it once the flags are parsed.
            std::string help = f.help;
            if (f.range.bounded)
              help += std::string(" (") + (std::is_same_v<T, double> ? "finite, " : "") + range_text(f.range) + ")";
            auto* opt = app.add_option(f.flag, *dst, help)->default_str(def)->group(group);
            if (const auto valid = choices_of(f.help); !valid.empty()) opt->check(CLI::IsMember(valid));
          }
        },
        f.ptr);
  }
}

std::string describe(const RunConfig& cfg) {
  RunConfig copy = cfg;
  std::ostringstream os;
  const char* section = "";
  for (const auto& f : fields(copy)) {
    if (std::string(section) != f.section) {
      section = f.section;
      os << "[" << section << "]\n";
    }
    os << "  " << f.key << " = " << field_to_json(f.ptr).dump() << "\n";
  }
  return os.str();
}

}   // namespace rh
