// load_checkpoint: verify everything, plan every state's restore, then apply. Nothing in the
// model, optimizer or TrainState changes until the files, the config and every planned
// conversion have been checked; conversions whose exactness is only known once the optimizer
// has re-applied its storage (set_scaled_state) run under a snapshot and are rolled back if they
// turn out lossy and the caller did not allow it.
//
// Conversion rules (Megatron PR 2790, plus exact master-mode conversions):
//  - stored states whose dtype the optimizer still holds: set_stored, bit for bit, with scales;
//  - remainders into a remainder optimizer: set_stored (per_key's fp32 container back to int16);
//  - remainder + bf16 weight into an fp32/fp16 master: joined, set_scaled_state (exactness checked);
//  - everything else: upcast to fp32 and set_scaled_state (re-storage, scales recomputed).
//  - per_key only: the PR decides "param is int16" from store_param_remainders && bf16 params,
//    not from what the optimizer holds, and only with the precision-aware optimizer on (Megatron-LM
//    megatron/core/optimizer/distrib_optimizer.py @d08b402, _set_main_param_and_optimizer_states:
//    with it every key goes through set_scaled_state; without it `main_param.copy_(param)`, no
//    int16 branch). Where that disagrees with the checkpoint the PR misfires; load
//    refuses, or with allow_lossy reproduces the misfire as upstream would. With an fp16 master
//    the PR hands an int16 tensor to set_scaled_state, whose `assert unscaled_state.dtype ==
//    torch.float32` fails upstream (TE turns remainders off for fp16 masters): always refused.
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/fsutil.h"
#include "harness/checkpoint/json_guard.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"
#include "harness/checkpoint/policy.h"
#include "harness/optim/storage_codecs.h"
#include "harness/version.h"

namespace rh::ckpt {

using optim::StateKey;
namespace fs = std::filesystem;

static_assert(kFormatVersion == detail::kManifestFormatVersion, "one format version for writer and reader");

namespace {

constexpr StateKey kKeys[] = {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq};

struct Action {
  std::string param, file, tkey;
  StateKey key;
  bool use_stored = true;
  optim::StoredState stored;   // use_stored: the owned part
  torch::Tensor value;         // !use_stored: the whole param's fp32 value for set_scaled_state
  torch::Tensor value_owned;   // its owned part (what the optimizer must then hold)
  torch::Tensor weight;        // remainder split on load: the whole bf16 weight belonging to it
};

std::string where(const detail::Verified& v, const std::string& file, const std::string& key) {
  return "checkpoint file " + (fs::path(v.dir) / file).string() + " tensor '" + key + "'";
}

void check_model(const detail::Verified& v, const torch::nn::Module& model, const nlohmann::json& run_config) {
  auto it = v.files.find(detail::kModelFile);
  if (it == v.files.end()) throw CheckpointError("checkpoint " + v.dir + ": manifest lists no " + detail::kModelFile);
  const SafetensorsFile& f = it->second;
  // Parameters and persistent buffers (every registered buffer, e.g. a router's expert_bias).
  auto params = model.named_parameters(true);
  for (const auto& b : model.named_buffers(true)) params.insert(b.key(), b.value());
  for (const auto& p : params) {
    const TensorInfo* ti = f.find(p.key());
    if (!ti) throw CheckpointError("config mismatch: " + f.path() + " has no tensor '" + p.key() + "' (the model has it)");
    const StDtype want = st_from_scalar_type(p.value().scalar_type(), p.key());
    if (ti->dtype != want || ti->shape != p.value().sizes().vec())
      throw CheckpointError("config mismatch: " + f.path() + " tensor '" + p.key() + "' is " + st_name(ti->dtype) +
                            " " + c10::str(c10::IntArrayRef(ti->shape)) + ", the model has " + st_name(want) +
                            " " + c10::str(p.value().sizes()));
  }
  if (f.tensors().size() != params.size())
    throw CheckpointError("config mismatch: " + f.path() + " holds " + std::to_string(f.tensors().size()) +
                          " tensors, the model has " + std::to_string(params.size()) + " (parameters and buffers)");
  const nlohmann::json& saved = v.manifest["run_config"];
  if (run_config.is_object() && saved.is_object() && run_config.contains("model") && saved.contains("model") &&
      run_config["model"] != saved["model"]) {
    std::string diff;
    for (const auto& [k, val] : saved["model"].items())
      if (!run_config["model"].contains(k) || run_config["model"][k] != val)
        diff += " " + k + "=" + quote_json(val) + " (now " + quote_json(run_config["model"].value(k, nlohmann::json())) + ")";
    throw CheckpointError("config mismatch: " + (fs::path(v.dir) / detail::kManifestFile).string() +
                          " was saved with model config" + diff);
  }
}

void check_optimizer(const detail::Verified& v, const optim::PrecisionAdam& opt) {
  const std::string mpath = (fs::path(v.dir) / detail::kManifestFile).string();
  const nlohmann::json& o = v.manifest.at("optimizer");
  std::vector<std::string> saved;
  for (const auto& p : o.at("params")) saved.push_back(p.at("name").get<std::string>());
  if (saved != opt.param_names())
    throw CheckpointError("config mismatch: " + mpath + " lists " + std::to_string(saved.size()) +
                          " optimizer params, the optimizer has " + std::to_string(opt.param_names().size()) +
                          " (names or order differ)");
  const auto& groups = o.at("groups");
  if (groups.size() != opt.num_groups())
    throw CheckpointError("config mismatch: " + mpath + " has " + std::to_string(groups.size()) +
                          " parameter groups, the optimizer has " + std::to_string(opt.num_groups()));
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g].at("name").get<std::string>() != opt.group_name(g))
      throw CheckpointError("config mismatch: " + mpath + " group " + std::to_string(g) + " is '" +
                            groups[g].at("name").get<std::string>() + "', the optimizer's is '" + opt.group_name(g) + "'");
}

// Generator states ("rng_states": name -> hex), as train_state and rank_states hold them.
std::map<std::string, std::vector<uint8_t>> parse_rng_states(const nlohmann::json& j, const std::string& mpath) {
  std::map<std::string, std::vector<uint8_t>> out;
  try {
    for (const auto& [name, hex] : j.items())
      out[name] = hex_decode(hex.get<std::string>(), mpath + " rng state '" + name + "'");
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(mpath + ": bad rng_states: " + e.what());
  }
  return out;
}

TrainState parse_train_state(const nlohmann::json& j, const std::string& mpath) {
  TrainState s;
  try {
    s.iteration = j.at("iteration").get<int64_t>();
    s.consumed_samples = j.at("consumed_samples").get<int64_t>();
    const auto& sc = j.at("opt_param_scheduler");
    auto& o = s.opt_param_scheduler;
    o.max_lr = sc.at("max_lr").get<double>();
    o.lr_warmup_steps = sc.at("lr_warmup_steps").get<int64_t>();
    o.num_steps = sc.at("num_steps").get<int64_t>();
    o.lr_decay_style = sc.at("lr_decay_style").get<std::string>();
    o.lr_decay_steps = sc.at("lr_decay_steps").get<int64_t>();
    o.min_lr = sc.at("min_lr").get<double>();
    o.start_wd = sc.at("start_wd").get<double>();
    o.end_wd = sc.at("end_wd").get<double>();
    o.wd_incr_style = sc.at("wd_incr_style").get<std::string>();
    o.wd_incr_steps = sc.at("wd_incr_steps").get<int64_t>();
    s.rng_states = parse_rng_states(j.at("rng_states"), mpath);
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(mpath + ": bad train_state: " + e.what());
  }
  return s;
}

// Int16 values out of a per_key fp32 container; every value must be an exact int16.
torch::Tensor container_to_int16(const torch::Tensor& f, const std::string& w) {
  torch::Tensor ok = f.eq(f.trunc()).logical_and(f.ge(-32768)).logical_and(f.le(32767));
  if (!ok.all().item<bool>()) throw CheckpointError(w + ": fp32 container does not hold int16 remainder values");
  return f.to(torch::kShort);
}

// One F32 scalar of a stored state's scaling ("<key>.scale" / ".scale_inv"), if present.
std::optional<float> read_scalar(const detail::Verified& v, const detail::ShardIndex& ix, const std::string& param,
                                 const std::string& key, const std::string& file) {
  torch::Tensor st = detail::gather_scale(v, ix, param, key);
  if (!st.defined()) return std::nullopt;
  if (st.scalar_type() != torch::kFloat || st.numel() != 1)
    throw CheckpointError(where(v, file, key) + ": expected a single F32 value");
  return st.reshape({}).item<float>();
}

}  // namespace

LoadReport load_checkpoint(const std::string& root_or_dir, torch::nn::Module& model, optim::PrecisionAdam& opt,
                           TrainState& state, const nlohmann::json& run_config, const LoadOptions& opts) {
  for (const auto& k : opts.skip_keys)
    if (k != "master_param" && k != "remainder" && k != "exp_avg" && k != "exp_avg_sq" && k != "model" && k != "step" &&
        k != "buffers")
      throw CheckpointError("skip_keys: unknown key '" + k + "' (master_param, remainder, exp_avg, exp_avg_sq, model, "
                            "buffers, step)");
  LoadReport rep;
  const auto t0 = std::chrono::steady_clock::now();
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  rep.dir = detail::resolve_checkpoint_dir(root_or_dir);
  detail::Verified v = detail::verify_checkpoint_dir(rep.dir);
  const nlohmann::json& m = v.manifest;
  const std::string mpath = (fs::path(rep.dir) / detail::kManifestFile).string();
  check_model(v, model, run_config);
  check_optimizer(v, opt);
  detail::check_counters(m, run_config, mpath);   // counters against the run they resume
  TrainState loaded = parse_train_state(m.at("train_state"), mpath);
  const detail::ShardIndex ix = detail::shard_index(v);
  // Generators are per rank: train_state holds rank 0's, rank_states every rank's. A rank the
  // checkpoint had no counterpart for (resharding to more ranks) gets rank 0's.
  const int my_rank = opt.layout().rank;
  if (my_rank != 0) {
    const nlohmann::json* mine = nullptr;
    if (m.contains("rank_states"))
      for (const auto& rs : m["rank_states"])
        if (rs.value("dp_rank", -1) == my_rank) mine = &rs;
    if (mine) {
      loaded.rng_states = parse_rng_states(mine->at("rng_states"), mpath);
    } else {   // the trainer's ranks share one generator stream: rank 0's is theirs too
      rep.conversions.push_back("rank " + std::to_string(my_rank) + ": the checkpoint (dp_size " +
                                m.value("dp_size", nlohmann::json(1)).dump() + ") has no generator state for it; rank 0's is used");
    }
  }

  std::map<std::string, const nlohmann::json*> entries;   // tensor key -> manifest entry
  for (const auto& t : m["tensors"]) {
    const std::string key = t["key"].get<std::string>();
    if (entries.count(key)) {   // the same state in several shards: one description
      const nlohmann::json& o = *entries[key];
      for (const char* f : {"kind", "dtype", "policy", "conversion", "exact"})
        if (o[f] != t[f])
          throw CheckpointError(mpath + ": shards disagree on '" + key + "': " + f + " " + o[f].dump() + " in " +
                                o["file"].get<std::string>() + ", " + t[f].dump() + " in " + t["file"].get<std::string>());
      continue;
    }
    entries[key] = &t;
    if (!t["exact"].get<bool>()) {
      const std::string w = where(v, t["file"], t["key"]);
      if (!opts.allow_lossy)
        throw CheckpointError(w + " was written lossily (policy " + t["policy"].get<std::string>() + ", conversion " +
                              t["conversion"].get<std::string>() + "); refusing to load without allow_lossy");
      rep.conversions.push_back(t["key"].get<std::string>() + ": lossy on save (" + t["conversion"].get<std::string>() + ")");
    }
  }

  const SafetensorsFile& mf = v.files.at(detail::kModelFile);
  const bool bf16_params = !opt.param_names().empty() && opt.param(opt.param_names()[0]).scalar_type() == torch::kBFloat16;
  const bool pao = opt.config().use_precision_aware_optimizer;
  const bool pr_int16 = pao && opt.config().store_param_remainders && bf16_params;   // the PR's condition
  const bool tgt_rem = opt.master_mode() == optim::MasterMode::remainders;
  std::vector<Action> plan;
  for (const std::string& p : opt.param_names()) {
    for (StateKey k : kKeys) {
      const std::string kname = optim::key_name(k), tfield = detail::field_name(opt, k);
      if (opts.skip_keys.count(kname) || opts.skip_keys.count(tfield)) continue;
      std::string skey = p + "/" + kname;
      if (k == StateKey::master_param && !entries.count(skey)) skey = p + "/remainder";
      if (!entries.count(skey))
        throw CheckpointError("checkpoint " + rep.dir + ": no saved state for '" + p + "/" + kname + "'");
      const nlohmann::json& e = *entries[skey];
      const std::string file = e["file"], conv = e["conversion"], kind = e["kind"], policy = e["policy"];
      const StDtype dt = v.files.at(file).info(skey).dtype;
      const std::string w = where(v, file, skey);
      if (ix.shape.at(p) != opt.param(p).sizes().vec())
        throw CheckpointError(w + ": the parameter was saved with shape " + c10::str(c10::IntArrayRef(ix.shape.at(p))) +
                              ", the parameter has " + c10::str(opt.param(p).sizes()));
      // This rank's part (stored bit for bit), or the whole tensor (conversions: a value is
      // re-stored as a whole, so scales come from the whole tensor as in one process).
      const auto range = opt.shard_range(p);
      const int64_t ob = range.first, oe = range.second;
      if (ob == oe) continue;   // another rank holds this param's state
      const auto owned_shape = opt.stored(p, k).data.sizes();
      torch::Tensor data = detail::gather_state(v, ix, p, skey, ob, oe).reshape(owned_shape);
      auto full = [&, skey = skey] {
        return detail::gather_state(v, ix, p, skey, 0, opt.param(p).numel()).reshape(opt.param(p).sizes());
      };
      auto owned = [&](const torch::Tensor& t) { return t.reshape({-1}).narrow(0, ob, oe - ob).reshape(owned_shape); };
      // A stored fp16/fp8 state's scaling: fp16 decodes with `scale`, fp8 with `scale_inv`.
      std::optional<float> scale, scale_inv, decode_mult;
      if (conv == "stored" && (dt == StDtype::F16 || dt == StDtype::F8_E4M3)) {
        scale = read_scalar(v, ix, p, skey + ".scale", file);
        if (!scale) throw CheckpointError(where(v, file, skey + ".scale") + ": missing (a stored " + st_name(dt) + " state needs its scale)");
        if (dt == StDtype::F8_E4M3) {
          scale_inv = read_scalar(v, ix, p, skey + ".scale_inv", file);
          if (!scale_inv)
            throw CheckpointError(where(v, file, skey + ".scale_inv") + ": missing (an fp8 state decodes with its scale_inv)");
        }
        decode_mult = dt == StDtype::F8_E4M3 ? scale_inv : scale;
      }
      Action a;
      a.param = p;
      a.file = file;
      a.tkey = skey;
      a.key = k;
      const optim::StoredState& cur = opt.stored(p, k);
      auto set_value = [&](torch::Tensor val, const std::string& note) {
        a.use_stored = false;
        a.value_owned = owned(val);
        a.value = std::move(val);
        if (!note.empty()) rep.conversions.push_back(skey + ": " + note);
      };
      if (k == StateKey::master_param) {
        const bool saved_rem = kind == "remainder";
        if (policy == "per_key" && pr_int16 && opt.master_mode() == optim::MasterMode::fp16)
          throw CheckpointError(w + ": per_key load converts 'param' to int16 (store_param_remainders=true, bf16 params) "
                                "and hands it to set_scaled_state as master_param, but with an fp16 master TransformerEngine "
                                "has remainders off and upstream fails an assertion here (FusedAdam.set_scaled_state: "
                                "assert unscaled_state.dtype == torch.float32); refusing (PR 2790 misfire)");
        if (policy == "per_key" && pr_int16 != saved_rem) {
          const std::string why = w + ": per_key load converts 'param' to int16 when store_param_remainders=" +
                                  std::string(opt.config().store_param_remainders ? "true" : "false") +
                                  " and params are " + (bf16_params ? "bf16" : "not bf16") + ", but the checkpoint holds " +
                                  (saved_rem ? "an int16 remainder" : "an fp32 master") + " (PR 2790 misfire)";
          if (!opts.allow_lossy) throw CheckpointError(why + "; refusing without allow_lossy");
          rep.conversions.push_back(skey + ": reproducing the PR misfire (" + why + ")");
          // What upstream does: convert by the flag, then hand the result over as master_param.
          torch::Tensor f = full().to(torch::kFloat);
          torch::Tensor r = pr_int16 ? f.clamp(-32768, 32767).trunc().to(torch::kShort) : torch::Tensor();
          if (pr_int16 && tgt_rem) a.stored = {owned(r).contiguous(), optim::Dtype::int16, std::nullopt, std::nullopt};
          else set_value(pr_int16 ? r.to(torch::kFloat) : f, "");
          plan.push_back(std::move(a));
          continue;
        }
        if (saved_rem) {
          auto as_int16 = [&](const torch::Tensor& t) {
            torch::Tensor rem = conv == "remainder_widened_f32" ? container_to_int16(t, w) : t;
            if (rem.scalar_type() != torch::kShort) throw CheckpointError(w + ": remainder is " + st_name(dt) + ", expected I16");
            return rem;
          };
          if (tgt_rem) {
            a.stored = {as_int16(data), optim::Dtype::int16, std::nullopt, std::nullopt};
          } else {
            const torch::Tensor rem = as_int16(full());
            const TensorInfo& wi = mf.info(p);
            if (wi.dtype != StDtype::BF16)
              throw CheckpointError(w + ": a remainder needs the bf16 weight, but " + mf.path() + " holds '" + p + "' as " + st_name(wi.dtype));
            set_value(optim::codec::remainder_join(mf.tensor(p), rem.contiguous()),
                      "bf16 weight + int16 remainder -> " + optim::to_string(opt.master_mode()) + " master");
          }
          plan.push_back(std::move(a));
          continue;
        }
      }
      if (conv == "stored" && dt == detail::st_of(cur.dtype) && !(k == StateKey::master_param && tgt_rem)) {
        a.stored = {data, cur.dtype, scale, scale_inv};
        try {
          opt.check_stored(p, k, a.stored);
        } catch (const std::invalid_argument& e) {
          throw CheckpointError(w + ": " + e.what());
        }
      } else if (k == StateKey::master_param && tgt_rem) {
        // An fp32/fp16 master into a remainder optimizer: upstream's set_scaled_state takes only
        // the int16 remainder there, so the split (exact for every bit pattern) happens here and
        // the bf16 weight that belongs to the remainder replaces the saved model weight.
        torch::Tensor w16, rem;
        optim::codec::remainder_split(detail::decode_value(full(), dt, conv, decode_mult).contiguous(), w16, rem);
        a.stored = {owned(rem).contiguous(), optim::Dtype::int16, std::nullopt, std::nullopt};
        a.weight = w16;
        rep.conversions.push_back(skey + ": " + st_name(dt) + " master -> bf16 weight + int16 remainder");
      } else {
        std::string note;
        if (dt != detail::st_of(cur.dtype)) note = st_name(dt) + " (" + conv + ") -> " + optim::to_string(cur.dtype) + " storage";
        set_value(detail::decode_value(full(), dt, conv, decode_mult), note);
      }
      plan.push_back(std::move(a));
    }
  }

  // ---- apply. Snapshot only if some outcome is unknown until the optimizer re-stores it.
  rep.verify_seconds = since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  // Stored states and model weights are adopted, not copied: verify_checkpoint_dir read every
  // file into staging memory while hashing it (one pass over the bytes), so the verified staging
  // tensors become the state (PrecisionAdam::adopt_stored, Tensor::set_data). The tensors the
  // state held before are only released, never written, so a refusal puts them back as they were.
  // What is written in place (set_scaled_state re-stores a converted state and may write the
  // model param) is snapshotted first, only where some conversion is planned.
  bool need_snapshot = false;
  for (const auto& a : plan) need_snapshot |= !a.use_stored;
  std::vector<std::pair<const Action*, optim::StoredState>> adopted;   // the state each replaced
  std::vector<std::pair<const Action*, optim::StoredState>> converted;  // a copy of what each overwrote
  std::vector<torch::Tensor> old_params;                               // the weights set_data replaced
  std::vector<torch::Tensor> snap_params;
  std::vector<int64_t> snap_steps;
  const auto params = model.named_parameters(true);
  if (need_snapshot) {
    for (const Action& a : plan)
      if (!a.use_stored) {
        optim::StoredState s = opt.stored(a.param, a.key);
        s.data = s.data.clone();
        converted.emplace_back(&a, std::move(s));
      }
    for (const auto& p : params) snap_params.push_back(p.value().detach().clone());
    for (size_t g = 0; g < opt.num_groups(); ++g) snap_steps.push_back(opt.step_count(g));
  }
  auto undo = [&] {
    torch::NoGradGuard ng;
    for (auto it = adopted.rbegin(); it != adopted.rend(); ++it) opt.adopt_stored(it->first->param, it->first->key, it->second);
    for (size_t i = 0; i < old_params.size(); ++i) params[i].value().set_data(old_params[i]);
    for (const auto& [a, s] : converted) opt.set_stored(a->param, a->key, s);
    for (size_t i = 0; i < snap_params.size(); ++i) params[i].value().detach().copy_(snap_params[i]);
    for (size_t g = 0; g < snap_steps.size(); ++g) opt.set_step_count(g, snap_steps[g]);
  };
  try {
    torch::NoGradGuard ng;
    // Optimizer first, then the model weights from the file (setting a master may write the
    // model param; the saved weight is the one to keep), except where a remainder optimizer
    // split an fp32 master: that split produced the weight belonging to its remainder.
    std::vector<std::string> inexact;
    for (const Action& a : plan)
      if (a.use_stored) {
        optim::StoredState before = opt.stored(a.param, a.key);   // a handle: nothing is copied
        opt.adopt_stored(a.param, a.key, a.stored);
        adopted.emplace_back(&a, std::move(before));
      }
    std::map<std::string, torch::Tensor> split_weight;
    for (const Action& a : plan)
      if (a.weight.defined()) split_weight[a.param] = a.weight;
    for (const Action& a : plan) {
      if (a.use_stored) continue;
      opt.set_scaled_state(a.param, a.key, a.value);
      torch::Tensor got = detail::unscaled(opt, a.param, a.key);
      if (!detail::bits_equal(got, a.value_owned)) {
        const int64_t n = detail::count_bits_differ(got, a.value_owned);
        inexact.push_back(where(v, a.file, a.tkey) + ": " + std::to_string(n) + " of " + std::to_string(got.numel()) +
                          " values change when the optimizer re-applies " + optim::to_string(opt.stored(a.param, a.key).dtype) +
                          " storage");
      }
    }
    if (!inexact.empty()) {
      if (!opts.allow_lossy) {
        std::string msg = "conversion is not exact, refusing without allow_lossy: " + inexact[0];
        if (inexact.size() > 1) msg += " (and " + std::to_string(inexact.size() - 1) + " more)";
        throw CheckpointError(msg);
      }
      for (const auto& s : inexact) rep.conversions.push_back("lossy on load: " + s);
    }
    if (!opts.skip_keys.count("model"))
      for (const auto& p : params) {
        auto it = split_weight.find(p.key());
        torch::Tensor w = it != split_weight.end() ? it->second : mf.tensor(p.key());
        old_params.push_back(p.value().detach());   // shares the old storage; set_data leaves it be
        p.value().set_data(w.is_contiguous() ? w : w.contiguous());
      }
    // Persistent buffers, exactly as saved (a router's fp32 expert_bias); after the last refusal.
    if (!opts.skip_keys.count("buffers"))
      for (const auto& b : model.named_buffers(true)) b.value().detach().copy_(mf.tensor(b.key()));
    if (!opts.skip_keys.count("step")) {
      const auto& groups = m["optimizer"]["groups"];
      for (size_t g = 0; g < opt.num_groups(); ++g) opt.set_step_count(g, groups[g]["step"].get<int64_t>());
    }
  } catch (const std::exception& e) {
    undo();
    if (dynamic_cast<const CheckpointError*>(&e)) throw;
    throw CheckpointError("checkpoint " + rep.dir + ": restoring state failed: " + e.what());
  }
  state = loaded;
  rep.apply_seconds = since(t1);
  rep.iteration = loaded.iteration;
  rep.manifest = m;
  return rep;
}

int inspect_checkpoint(const std::string& dir, std::ostream& out) {
  // A path that is not there, or names no checkpoint at all, is bad input (2), not a damaged
  // checkpoint (1): an iter_ directory without its manifest or a dangling pointer is damage.
  std::error_code ec;
  const fs::path p(dir);
  const bool is_dir = fs::is_directory(p, ec);
  if (!is_dir || (!fs::exists(p / detail::kManifestFile, ec) && !fs::exists(p / detail::kPointerFile, ec) &&
                  p.filename().string().rfind("iter_", 0) != 0)) {
    out << kErrorPrefix << dir << ": "
        << (!fs::exists(p, ec) ? "no such file or directory"
            : !is_dir          ? "not a directory"
                               : std::string("neither a checkpoint directory (no ") + detail::kManifestFile +
                                     ") nor a checkpoint root (no " + detail::kPointerFile + ")")
        << "\n";
    return 2;
  }
  try {
    const std::string d = detail::resolve_checkpoint_dir(dir);
    detail::Verified v = detail::verify_checkpoint_dir(d);   // the manifest's whole schema, as load
    (void)detail::shard_index(v);                           // and the shards' coverage, as load
    out << "checkpoint " << d << " (iteration " << v.manifest.value("iteration", int64_t(-1)) << ", policy "
        << v.manifest["save_policy"].value("kind", std::string("?")) << ", compress "
        << v.manifest["save_policy"].value("compress", std::string("none")) << ", harness "
        << v.manifest.value("harness_version", std::string("?")) << ")\n";
    detail::print_tensor_table(v.manifest, out);
    out << "OK: " << v.files.size() << " files verified (size, XXH3-64, safetensors structure"
        << (v.manifest["save_policy"].value("compress", std::string("none")) != "none"
                ? "; every compressed block's XXH3-64, stored and decoded)\n"
                : ")\n");
    return 0;
  } catch (const std::exception& e) {
    out << "DAMAGED: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace rh::ckpt
