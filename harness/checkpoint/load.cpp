// load_checkpoint: verify everything, plan every state's restore, then apply. Nothing in the
// model, optimizer or TrainState changes until the files, the config and every planned
// conversion have been checked; conversions whose exactness is only known once the optimizer
// has re-applied its storage (set_scaled_state) run under a snapshot and are rolled back if they
// turn out lossy and the caller did not allow it.
//
// The phases (load_phases.h): verify is here, plan and the conversion rules in load_plan.cpp,
// apply and its undo in load_apply.cpp.
#include <chrono>
#include <filesystem>
#include <map>
#include <set>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/fsutil.h"
#include "harness/checkpoint/json_guard.h"
#include "harness/checkpoint/load_phases.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"

namespace rh::ckpt {

namespace fs = std::filesystem;

static_assert(kFormatVersion == detail::kManifestFormatVersion, "one format version for writer and reader");

namespace {

// The keys LoadOptions::skip_keys may name; anything else is the caller's mistake, refused first.
void check_skip_keys(const std::set<std::string>& skip_keys) {
  for (const auto& k : skip_keys)
    if (k != "master_param" && k != "remainder" && k != "exp_avg" && k != "exp_avg_sq" && k != "model" && k != "step" &&
        k != "buffers")
      throw CheckpointError("skip_keys: unknown key '" + k + "' (master_param, remainder, exp_avg, exp_avg_sq, model, "
                            "buffers, step)");
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

LoadReport load_checkpoint(const std::string& root_or_dir, torch::nn::Module& model, optim::PrecisionAdam& opt,
                           TrainState& state, const nlohmann::json& run_config, const LoadOptions& opts) {
  check_skip_keys(opts.skip_keys);
  LoadReport rep;
  const auto t0 = std::chrono::steady_clock::now();
  rep.dir = detail::resolve_checkpoint_dir(root_or_dir);
  const detail::VerifiedLoad vl = detail::verify_for_load(rep.dir, model, opt, run_config);
  detail::LoadPlan plan = detail::plan_load(vl, opt, opts);
  rep.conversions = std::move(plan.notes);
  rep.verify_seconds = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  detail::apply_load(vl, plan, model, opt, opts, rep.conversions);
  state = plan.train_state;
  rep.apply_seconds = seconds_since(t1);
  rep.iteration = plan.train_state.iteration;
  rep.manifest = vl.v.manifest;
  return rep;
}

// ---- Phase 1: verify. The checkpoint as a whole (verify_checkpoint_dir), then that it is one of
// this run's: the model's tensors, the optimizer's params and groups, the counters.

namespace detail {
namespace {

void check_model(const Verified& v, const torch::nn::Module& model, const nlohmann::json& run_config) {
  auto it = v.files.find(kModelFile);
  if (it == v.files.end()) throw CheckpointError("checkpoint " + v.dir + ": manifest lists no " + kModelFile);
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
    throw CheckpointError("config mismatch: " + (fs::path(v.dir) / kManifestFile).string() +
                          " was saved with model config" + diff);
  }
}

void check_optimizer(const Verified& v, const optim::PrecisionAdam& opt) {
  const std::string mpath = (fs::path(v.dir) / kManifestFile).string();
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

}  // namespace

std::string where(const Verified& v, const std::string& file, const std::string& key) {
  return "checkpoint file " + (fs::path(v.dir) / file).string() + " tensor '" + key + "'";
}

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

// In this order, so that a checkpoint with several faults is refused for the same one as always.
VerifiedLoad verify_for_load(const std::string& dir, const torch::nn::Module& model, const optim::PrecisionAdam& opt,
                             const nlohmann::json& run_config) {
  VerifiedLoad vl;
  vl.v = verify_checkpoint_dir(dir);
  vl.mpath = (fs::path(dir) / kManifestFile).string();
  check_model(vl.v, model, run_config);
  check_optimizer(vl.v, opt);
  check_counters(vl.v.manifest, run_config, vl.mpath);   // counters against the run they resume
  vl.train_state = parse_train_state(vl.v.manifest.at("train_state"), vl.mpath);
  vl.ix = shard_index(vl.v);
  return vl;
}

}  // namespace detail
}  // namespace rh::ckpt
