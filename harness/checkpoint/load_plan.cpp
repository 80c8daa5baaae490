// Phase 2 of load_checkpoint (load_phases.h): for every state this rank restores, what the
// checkpoint holds, what the optimizer holds, and the conversion between them. Reads the optimizer
// and changes nothing; every refusal that does not need the optimizer's re-storage is made here.
//
// Conversion rules (upstream Megatron + TransformerEngine, Megatron PR 2790 for per_key):
//  - stored states whose dtype the optimizer still holds: set_stored, bit for bit, with scales,
//    when the saved shard's piece is exactly the range this rank owns. A stored fp16/fp8 state
//    laid out otherwise (resharded, another bucket size) is decoded piece by piece, each with its
//    own shard's scale, and re-stored by set_scaled_state (this rank's scale; exactness checked);
//  - remainders into a remainder optimizer: set_stored (per_key's fp32 container back to int16);
//  - master-mode changes (int16 remainder <-> fp32/fp16 master) and a widened fp32 remainder
//    (dp_zero, fully_reshardable) into a remainder optimizer: upstream hands the tensor to
//    set_scaled_state, whose dtype assertion fails (TransformerEngine fused_adam.py
//    FusedAdam.set_scaled_state @d0067d0da6cb01811b8072a7d304f0e00344ce2b: `assert
//    unscaled_state.dtype == torch.int16` under remainders, `torch.float32` otherwise; Megatron-LM
//    distrib_optimizer.py _set_main_param_and_optimizer_states @d98e8a64ddf34856e74b24714e3bedb2f5a39553
//    passes every tensor straight to it). Refused, saying so, unless
//    LoadOptions::exact_master_conversion: then joined/split/narrowed exactly;
//  - everything else: upcast to fp32 and set_scaled_state (re-storage, scales recomputed).
//  - per_key only: the PR decides "param is int16" from store_param_remainders && bf16 params,
//    not from what the optimizer holds, and only with the precision-aware optimizer on (the PR
//    adds its int16 cast inside Megatron-LM megatron/core/optimizer/distrib_optimizer.py
//    _set_main_param_and_optimizer_states, which on main @d98e8a6 sends every key through
//    set_scaled_state with it on, and without it copies into the fp32 main param
//    (`dst_tensors[key].copy_(tensors[key])`), no int16 branch). Where that disagrees with the
//    checkpoint the PR misfires; load
//    refuses, or with allow_lossy reproduces the misfire as upstream would. With an fp16 master
//    the PR hands an int16 tensor to set_scaled_state, whose `assert unscaled_state.dtype ==
//    torch.float32` fails upstream (TE turns remainders off for fp16 masters): always refused.
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/load_phases.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/policy.h"
#include "harness/optim/storage_codecs.h"

namespace rh::ckpt::detail {

using optim::StateKey;

namespace {

constexpr StateKey kKeys[] = {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq};

// Plan, first: this rank's generators. train_state holds rank 0's, rank_states every rank's. A
// rank the checkpoint had no counterpart for (resharding to more ranks) gets rank 0's.
void choose_generators(const VerifiedLoad& checkpoint, int my_rank, LoadPlan& plan) {
  if (my_rank == 0) return;
  const nlohmann::json& manifest = checkpoint.v.manifest;
  const RankGenerators* mine = nullptr;
  for (const auto& rs : checkpoint.v.saved.rank_states)
    if (rs.dp_rank == my_rank) mine = &rs;
  if (mine) {
    plan.train_state.rng_states = mine->rng_states;
  } else {   // the trainer's ranks share one generator stream: rank 0's is theirs too
    plan.notes.push_back("rank " + std::to_string(my_rank) + ": the checkpoint (dp_size " +
                         manifest.value("dp_size", nlohmann::json(1)).dump() +
                         ") has no generator state for it; rank 0's is used");
  }
}

// Plan, second: the manifest's entry of every state key (tensor key -> entry). A state split
// over shards is listed once per shard: those entries must agree. A state written lossily is
// refused without allow_lossy, and noted with it.
using Entries = std::map<std::string, const nlohmann::json*>;
Entries index_entries(const VerifiedLoad& checkpoint, const LoadOptions& opts, std::vector<std::string>& notes) {
  Entries entries;
  for (const auto& entry : checkpoint.v.manifest["tensors"]) {
    const std::string key = entry["key"].get<std::string>();
    if (entries.count(key)) {   // the same state in several shards: one description
      const nlohmann::json& first = *entries[key];
      for (const char* field : {"kind", "dtype", "policy", "conversion", "exact"})
        if (first[field] != entry[field])
          throw CheckpointError(checkpoint.mpath + ": shards disagree on '" + key + "': " + field + " " +
                                first[field].dump() + " in " + first["file"].get<std::string>() + ", " +
                                entry[field].dump() + " in " + entry["file"].get<std::string>());
      continue;
    }
    entries[key] = &entry;
    if (!entry["exact"].get<bool>()) {
      const std::string w = where(checkpoint.v, entry["file"], entry["key"]);
      if (!opts.allow_lossy)
        throw CheckpointError(w + " was written lossily (policy " + entry["policy"].get<std::string>() +
                              ", conversion " + entry["conversion"].get<std::string>() +
                              "); refusing to load without allow_lossy");
      notes.push_back(entry["key"].get<std::string>() + ": lossy on save (" + entry["conversion"].get<std::string>() +
                      ")");
    }
  }
  return entries;
}

// Int16 values out of a per_key fp32 container; every value must be an exact int16.
torch::Tensor container_to_int16(const torch::Tensor& container, const std::string& w) {
  torch::Tensor ok = container.eq(container.trunc()).logical_and(container.ge(-32768)).logical_and(container.le(32767));
  if (!ok.all().item<bool>()) throw CheckpointError(w + ": fp32 container does not hold int16 remainder values");
  return container.to(torch::kShort);
}

// One F32 scalar of a stored state's scaling ("<key>.scale" / ".scale_inv") in shard `file`, if
// present.
std::optional<float> read_scalar(const Verified& v, const ShardIndex&, const std::string&, const std::string& key,
                                 const std::string& file) {
  const SafetensorsFile& shard_file = v.files.at(file);
  if (!shard_file.find(key)) return std::nullopt;
  torch::Tensor scalar = shard_file.tensor(key);
  if (scalar.scalar_type() != torch::kFloat || scalar.numel() != 1)
    throw CheckpointError(where(v, file, key) + ": expected a single F32 value");
  return scalar.reshape({}).item<float>();
}

// One state as the checkpoint holds it, located for this rank.
struct Source {
  std::string param, skey, file, conv, kind, policy;   // skey: the tensor, "<param>/exp_avg"
  std::string w;                                       // where(): how messages name the tensor
  StateKey key = StateKey::master_param;
  StDtype dt = StDtype::F32;
  int64_t ob = 0, oe = 0;             // the owned range, flat within the param
  std::vector<int64_t> owned_shape;   // the optimizer's state shape for that range
  torch::Tensor data;                 // the owned part, as stored
  // A stored fp16/fp8 state's scaling: fp16 decodes with `scale`, fp8 with `scale_inv`.
  std::optional<float> scale, scale_inv, decode_mult;
  // A stored fp16/fp8 state whose saved pieces are not exactly this rank's range: its value is
  // decoded piece by piece, each piece with its own shard's scale.
  bool repieced = false;
};

// Plan, third: one Action per state, by the rules at the top of this file.
class StatePlanner {
 public:
  StatePlanner(const VerifiedLoad& checkpoint, const optim::PrecisionAdam& opt, const LoadOptions& opts,
               const Entries& entries, std::vector<std::string>& notes)
      : vl_(checkpoint),
        opt_(opt),
        opts_(opts),
        entries_(entries),
        notes_(notes),
        mf_(checkpoint.v.files.at(kModelFile)) {
    bf16_params_ = !opt.param_names().empty() && opt.param(opt.param_names()[0]).scalar_type() == torch::kBFloat16;
    const bool pao = opt.config().use_precision_aware_optimizer;
    pr_int16_ = pao && opt.config().store_param_remainders && bf16_params_;   // the PR's condition
    tgt_rem_ = opt.master_mode() == optim::MasterMode::remainders;
  }

  // Nothing when the state is skipped (LoadOptions::skip_keys) or another rank holds it.
  std::optional<Action> plan(const std::string& param, StateKey key) {
    std::optional<Source> source = locate(param, key);
    if (!source) return std::nullopt;
    Action action;
    action.param = param;
    action.file = source->file;
    action.tkey = source->skey;
    action.key = key;
    if (key == StateKey::master_param && (plan_pr_misfire(*source, action) || plan_saved_remainder(*source, action)))
      return action;
    plan_conversion(*source, action);
    return action;
  }

 private:
  std::optional<Source> locate(const std::string& param, StateKey key);
  void read_scales(Source& source) const;
  bool plan_pr_misfire(const Source& source, Action& action);
  bool plan_saved_remainder(const Source& source, Action& action);
  void plan_conversion(const Source& source, Action& action);

  // The whole param's state as stored (set_scaled_state takes the whole value and keeps this
  // rank's part), and this rank's part of such a tensor.
  torch::Tensor full(const Source& source) const {
    return gather_state(vl_.v, vl_.ix, source.param, source.skey, 0, opt_.param(source.param).numel())
        .reshape(opt_.param(source.param).sizes());
  }
  // The whole param's fp32 value: a stored fp16/fp8 state decoded piece by piece with each
  // shard's own scale, anything else by its conversion.
  torch::Tensor full_value(const Source& source) const;
  std::string master_conversion_refusal(const Source& source, const std::string& what,
                                        const std::string& option_does, bool widened_remainder) const;
  torch::Tensor owned(const Source& source, const torch::Tensor& t) const {
    return t.reshape({-1}).narrow(0, source.ob, source.oe - source.ob).reshape(source.owned_shape);
  }
  // The state goes through set_scaled_state with this whole-param value.
  void set_value(const Source& source, Action& action, torch::Tensor value, const std::string& note) {
    action.use_stored = false;
    action.value_owned = owned(source, value);
    action.value = std::move(value);
    if (!note.empty()) notes_.push_back(source.skey + ": " + note);
  }

  const VerifiedLoad& vl_;
  const optim::PrecisionAdam& opt_;
  const LoadOptions& opts_;
  const Entries& entries_;
  std::vector<std::string>& notes_;
  const SafetensorsFile& mf_;
  bool bf16_params_ = false, pr_int16_ = false, tgt_rem_ = false;
};

// The tensor a state is restored from, checked against the param's shape, and this rank's part of
// it (stored bit for bit).
std::optional<Source> StatePlanner::locate(const std::string& param, StateKey key) {
  const std::string kname = optim::key_name(key), tfield = field_name(opt_, key);
  if (opts_.skip_keys.count(kname) || opts_.skip_keys.count(tfield)) return std::nullopt;
  Source source;
  source.param = param;
  source.key = key;
  source.skey = param + "/" + kname;
  if (key == StateKey::master_param && !entries_.count(source.skey)) source.skey = param + "/remainder";
  if (!entries_.count(source.skey))
    throw CheckpointError("checkpoint " + vl_.v.dir + ": no saved state for '" + param + "/" + kname + "'");
  const nlohmann::json& entry = *entries_.at(source.skey);
  source.file = entry["file"].get<std::string>();
  source.conv = entry["conversion"].get<std::string>();
  source.kind = entry["kind"].get<std::string>();
  source.policy = entry["policy"].get<std::string>();
  source.dt = vl_.v.files.at(source.file).info(source.skey).dtype;
  source.w = where(vl_.v, source.file, source.skey);
  if (vl_.ix.shape.at(param) != opt_.param(param).sizes().vec())
    throw CheckpointError(source.w + ": the parameter was saved with shape " +
                          c10::str(c10::IntArrayRef(vl_.ix.shape.at(param))) + ", the parameter has " +
                          c10::str(opt_.param(param).sizes()));
  const auto range = opt_.shard_range(param);
  source.ob = range.first;
  source.oe = range.second;
  if (source.ob == source.oe) return std::nullopt;   // another rank holds this param's state
  source.owned_shape = opt_.stored(param, key).data.sizes().vec();
  source.data = gather_state(vl_.v, vl_.ix, param, source.skey, source.ob, source.oe).reshape(source.owned_shape);
  read_scales(source);
  return source;
}

// A stored fp16/fp8 state's scaling: fp16 decodes with `scale`, fp8 with `scale_inv`. Scales are
// per shard (TE holds one per rank's piece), so only a piece that is exactly this rank's range
// is restored with its scale; otherwise the state is repieced (full_value).
void StatePlanner::read_scales(Source& source) const {
  if (source.conv != "stored" || (source.dt != StDtype::F16 && source.dt != StDtype::F8_E4M3)) return;
  const Piece* mine = nullptr;
  int covering = 0;
  for (const Piece& piece : vl_.ix.pieces.at(source.param))
    if (piece.begin < source.oe && piece.end > source.ob) {
      ++covering;
      if (piece.begin == source.ob && piece.end == source.oe) mine = &piece;
    }
  if (covering != 1 || !mine) {
    source.repieced = true;
    return;
  }
  source.file = mine->file;
  source.scale = read_scalar(vl_.v, vl_.ix, source.param, source.skey + ".scale", source.file);
  if (!source.scale)
    throw CheckpointError(where(vl_.v, source.file, source.skey + ".scale") + ": missing (a stored " +
                          st_name(source.dt) + " state needs its scale)");
  if (source.dt == StDtype::F8_E4M3) {
    source.scale_inv = read_scalar(vl_.v, vl_.ix, source.param, source.skey + ".scale_inv", source.file);
    if (!source.scale_inv)
      throw CheckpointError(where(vl_.v, source.file, source.skey + ".scale_inv") +
                            ": missing (an fp8 state decodes with its scale_inv)");
  }
  source.decode_mult = source.dt == StDtype::F8_E4M3 ? source.scale_inv : source.scale;
}

torch::Tensor StatePlanner::full_value(const Source& source) const {
  if (!(source.conv == "stored" && (source.dt == StDtype::F16 || source.dt == StDtype::F8_E4M3)))
    return decode_value(full(source), source.dt, source.conv, source.decode_mult);
  const bool fp8 = source.dt == StDtype::F8_E4M3;
  std::vector<torch::Tensor> parts;
  for (const Piece& piece : vl_.ix.pieces.at(source.param)) {
    const std::string key = source.skey + (fp8 ? ".scale_inv" : ".scale");
    const std::optional<float> mult = read_scalar(vl_.v, vl_.ix, source.param, key, piece.file);
    if (!mult)
      throw CheckpointError(where(vl_.v, piece.file, key) + ": missing (a stored " + st_name(source.dt) +
                            " state decodes with it)");
    if (std::signbit(*mult) && !std::isnan(*mult))
      throw CheckpointError(where(vl_.v, piece.file, key) + ": " + std::to_string(*mult) +
                            " is negative (a scale is amax / range)");
    torch::Tensor data = gather_state(vl_.v, vl_.ix, source.param, source.skey, piece.begin, piece.end);
    parts.push_back(decode_value(data.contiguous(), source.dt, source.conv, *mult).reshape({-1}));
  }
  return torch::cat(parts).reshape(opt_.param(source.param).sizes());
}

// The refusal for a master_param upstream's set_scaled_state asserts on.
// Megatron-LM PR #4222 (open) fixes only the widened remainder: it casts the fp32 container back
// to int16 in _set_main_param_and_optimizer_states before set_scaled_state (for a master-mode
// change its range check refuses instead), so only that refusal names it.
std::string StatePlanner::master_conversion_refusal(const Source& source, const std::string& what,
                                                    const std::string& option_does,
                                                    bool widened_remainder) const {
  return source.w + ": " + what +
         "; upstream Megatron (distrib_optimizer.py _set_main_param_and_optimizer_states @d98e8a6) hands it to "
         "TransformerEngine's FusedAdam.set_scaled_state as master_param, which asserts unscaled_state.dtype == " +
         (tgt_rem_ ? "torch.int16" : "torch.float32") + " and fails (fused_adam.py @d0067d0" +
         (widened_remainder ? "; Megatron-LM PR #4222, open, proposes casting it back to int16 there" : "") +
         "): refusing (exact_master_conversion " + option_does + ")";
}

// master_param under per_key, where the PR's int16 decision (pr_int16_) disagrees with the
// checkpoint, or meets an fp16 master: refused, or the misfire reproduced (allow_lossy). False when
// the PR's rule does not apply.
bool StatePlanner::plan_pr_misfire(const Source& source, Action& action) {
  const bool saved_rem = source.kind == "remainder";
  if (source.policy == "per_key" && pr_int16_ && opt_.master_mode() == optim::MasterMode::fp16)
    throw CheckpointError(source.w +
                          ": per_key load converts 'param' to int16 (store_param_remainders=true, bf16 params) "
                          "and hands it to set_scaled_state as master_param, but with an fp16 master TransformerEngine "
                          "has remainders off and upstream fails an assertion here (FusedAdam.set_scaled_state: "
                          "assert unscaled_state.dtype == torch.float32); refusing (PR 2790 misfire)");
  if (source.policy != "per_key" || pr_int16_ == saved_rem) return false;
  const std::string why = source.w + ": per_key load converts 'param' to int16 when store_param_remainders=" +
                          std::string(opt_.config().store_param_remainders ? "true" : "false") + " and params are " +
                          (bf16_params_ ? "bf16" : "not bf16") + ", but the checkpoint holds " +
                          (saved_rem ? "an int16 remainder" : "an fp32 master") + " (PR 2790 misfire)";
  if (!opts_.allow_lossy) throw CheckpointError(why + "; refusing without allow_lossy");
  notes_.push_back(source.skey + ": reproducing the PR misfire (" + why + ")");
  // What upstream does: convert by the flag, then hand the result over as master_param.
  torch::Tensor master = full(source).to(torch::kFloat);
  torch::Tensor remainder = pr_int16_ ? master.clamp(-32768, 32767).trunc().to(torch::kShort) : torch::Tensor();
  if (pr_int16_ && tgt_rem_)
    action.stored = {owned(source, remainder).contiguous(), optim::Dtype::int16, std::nullopt, std::nullopt};
  else set_value(source, action, pr_int16_ ? remainder.to(torch::kFloat) : master, "");
  return true;
}

// A saved int16 remainder: stored into a remainder optimizer, or joined with the model file's bf16
// weight into an fp32/fp16 master. False when the checkpoint holds a master instead.
bool StatePlanner::plan_saved_remainder(const Source& source, Action& action) {
  if (source.kind != "remainder") return false;
  auto as_int16 = [&](const torch::Tensor& t) {
    torch::Tensor rem = source.conv == "remainder_widened_f32" ? container_to_int16(t, source.w) : t;
    if (rem.scalar_type() != torch::kShort)
      throw CheckpointError(source.w + ": remainder is " + st_name(source.dt) + ", expected I16");
    return rem;
  };
  const bool upstream_refuses = source.policy != "per_key" && !opts_.exact_master_conversion;
  if (tgt_rem_) {
    if (source.conv == "remainder_widened_f32" && upstream_refuses)
      throw CheckpointError(
          master_conversion_refusal(source,
                                    "the int16 remainder was saved widened to fp32 (policy " + source.policy + ")",
                                    "narrows it back to int16 exactly", true));
    action.stored = {as_int16(source.data), optim::Dtype::int16, std::nullopt, std::nullopt};
    return true;
  }
  if (upstream_refuses && source.conv == "remainder_widened_f32")
    // The fp32 container passes set_scaled_state's float32 assertion: upstream loads the
    // remainder's integer values as the master, silently. Refused, saying what upstream does.
    throw CheckpointError(source.w + ": the checkpoint holds an int16 remainder widened to fp32 (policy " +
                          source.policy + "), this optimizer an " + optim::to_string(opt_.master_mode()) +
                          " master; upstream Megatron (distrib_optimizer.py _set_main_param_and_optimizer_states "
                          "@d98e8a6) hands the fp32 container to FusedAdam.set_scaled_state as master_param, which "
                          "accepts it (assert unscaled_state.dtype == torch.float32, fused_adam.py @d0067d0) and "
                          "would take the remainder's integer values as the master: refusing (exact_master_conversion "
                          "joins it with the bf16 weight exactly)");
  if (upstream_refuses)
    throw CheckpointError(
        master_conversion_refusal(source,
                                  "the checkpoint holds an int16 remainder, this optimizer an " +
                                      optim::to_string(opt_.master_mode()) + " master",
                                  "joins it with the bf16 weight exactly", false));
  const torch::Tensor rem = as_int16(full(source));
  const TensorInfo& weight_info = mf_.info(source.param);
  if (weight_info.dtype != StDtype::BF16)
    throw CheckpointError(source.w + ": a remainder needs the bf16 weight, but " + mf_.path() + " holds '" +
                          source.param + "' as " + st_name(weight_info.dtype));
  set_value(source, action, optim::codec::remainder_join(mf_.tensor(source.param), rem.contiguous()),
            "bf16 weight + int16 remainder -> " + optim::to_string(opt_.master_mode()) + " master");
  return true;
}

// Every other state: stored bit for bit where the optimizer holds the saved dtype, a master split
// for a remainder optimizer, or the decoded fp32 value for set_scaled_state.
void StatePlanner::plan_conversion(const Source& source, Action& action) {
  const optim::StoredState& held = opt_.stored(source.param, source.key);
  const bool split = source.key == StateKey::master_param && tgt_rem_;
  if (split && !opts_.exact_master_conversion)
    throw CheckpointError(master_conversion_refusal(source,
                                                    "the checkpoint holds an " + st_name(source.dt) +
                                                        " master, this optimizer keeps bf16 weight + int16 remainder",
                                                    "splits it into weight and remainder exactly", false));
  if (source.conv == "stored" && source.dt == st_of(held.dtype) && !split && !source.repieced) {
    action.stored = {source.data, held.dtype, source.scale, source.scale_inv};
    try {
      opt_.check_stored(source.param, source.key, action.stored);
    } catch (const std::invalid_argument& e) {
      throw CheckpointError(source.w + ": " + e.what());
    }
  } else if (split) {
    // An fp32/fp16 master into a remainder optimizer: upstream's set_scaled_state takes only
    // the int16 remainder there, so the split (exact for every bit pattern) happens here and
    // the bf16 weight that belongs to the remainder replaces the saved model weight.
    torch::Tensor bf16_weight, rem;
    optim::codec::remainder_split(full_value(source).contiguous(), bf16_weight, rem);
    action.stored = {owned(source, rem).contiguous(), optim::Dtype::int16, std::nullopt, std::nullopt};
    action.weight = bf16_weight;
    notes_.push_back(source.skey + ": " + st_name(source.dt) + " master -> bf16 weight + int16 remainder");
  } else {
    std::string note;
    if (source.dt != st_of(held.dtype))
      note = st_name(source.dt) + " (" + source.conv + ") -> " + optim::to_string(held.dtype) + " storage";
    else if (source.repieced)
      note = "saved per-shard " + st_name(source.dt) + " scales re-applied to this rank's range";
    set_value(source, action, full_value(source), note);
  }
}

}   // namespace

LoadPlan plan_load(const VerifiedLoad& checkpoint, const optim::PrecisionAdam& opt, const LoadOptions& opts) {
  LoadPlan plan;
  plan.train_state = checkpoint.train_state;
  check_bucket_layout(checkpoint, opt, opts, plan.notes);
  choose_generators(checkpoint, opt.layout().rank, plan);
  const Entries entries = index_entries(checkpoint, opts, plan.notes);
  StatePlanner planner(checkpoint, opt, opts, entries, plan.notes);
  for (const std::string& param : opt.param_names())
    for (StateKey key : kKeys)
      if (std::optional<Action> action = planner.plan(param, key)) plan.actions.push_back(std::move(*action));
  return plan;
}

}   // namespace rh::ckpt::detail
