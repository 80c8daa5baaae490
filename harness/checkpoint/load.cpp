// load_checkpoint: verify everything, plan every state's restore, then apply. Nothing in the
// model, optimizer or TrainState changes until the files, the config and every planned
// conversion have been checked; conversions whose exactness is only known once the optimizer
// has re-applied its storage (set_scaled_state) run under a snapshot and are rolled back if they
// turn out lossy and the caller did not allow it.
//
// The phases (load_phases.h): verify is here, plan and the conversion rules in load_plan.cpp,
// apply and its undo in load_apply.cpp.
#include <ATen/CPUGeneratorImpl.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <tuple>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/load_phases.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"
#include "harness/checkpoint/publish.h"

namespace rh::ckpt {

namespace fs = std::filesystem;

static_assert(kFormatVersion == detail::kManifestFormatVersion, "one format version for writer and reader");

namespace {

// The keys LoadOptions::skip_keys may name; anything else is the caller's mistake, refused first.
void check_skip_keys(const std::set<std::string>& skip_keys) {
  for (const auto& k : skip_keys)
    if (k != "master_param" && k != "remainder" && k != "exp_avg" && k != "exp_avg_sq" && k != "model" && k != "step" &&
        k != "buffers")
      throw CheckpointError("skip_keys: unknown key '" + k +
                            "' (master_param, remainder, exp_avg, exp_avg_sq, model, "
                            "buffers, step)");
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}   // namespace

LoadReport load_checkpoint(const std::string& root_or_dir, torch::nn::Module& model, optim::PrecisionAdam& opt,
                           TrainState& state, const nlohmann::json& run_config, const LoadOptions& opts) {
  check_skip_keys(opts.skip_keys);
  LoadReport rep;
  const auto t0 = std::chrono::steady_clock::now();
  rep.dir = detail::resolve_checkpoint_dir(root_or_dir);
  if (fs::path(rep.dir).lexically_normal() != fs::path(root_or_dir).lexically_normal()) {
    try {   // a root: what a save killed midway left there goes (never a published directory)
      detail::clean_temps(root_or_dir);
    } catch (const std::exception&) {   // a read-only root, say: loading does not depend on it
    }
  }
  const detail::VerifiedLoad verified = detail::verify_for_load(rep.dir, model, opt, run_config);
  detail::LoadPlan plan = detail::plan_load(verified, opt, opts);
  rep.conversions = std::move(plan.notes);
  rep.verify_seconds = seconds_since(t0);
  const auto t1 = std::chrono::steady_clock::now();
  detail::apply_load(verified, plan, model, opt, opts, rep.conversions);
  state = plan.train_state;
  rep.apply_seconds = seconds_since(t1);
  rep.iteration = plan.train_state.iteration;
  rep.manifest = verified.v.manifest;
  return rep;
}

// ---- Phase 1: verify. The checkpoint as a whole (verify_checkpoint_dir), then that it is one of
// this run's: the model's tensors, the optimizer's params and groups, the counters.

namespace detail {
namespace {

[[noreturn]] void fail_tensor(const Verified& v, const std::string& file, const std::string& key,
                              const std::string& what) {
  const std::string path = (fs::path(v.dir) / file).string();
  throw CheckpointError("checkpoint file " + path + " tensor '" + key + "': " + what, path, key);
}

void check_model(const Verified& v, const torch::nn::Module& model, const nlohmann::json& run_config) {
  auto it = v.files.find(kModelFile);
  if (it == v.files.end()) throw CheckpointError("checkpoint " + v.dir + ": manifest lists no " + kModelFile);
  const SafetensorsFile& f = it->second;
  // Parameters and persistent buffers (every registered buffer, e.g. a router's expert_bias).
  auto params = model.named_parameters(true);
  for (const auto& b : model.named_buffers(true)) params.insert(b.key(), b.value());
  for (const auto& p : params) {
    const TensorInfo* ti = f.find(p.key());
    if (!ti)
      throw CheckpointError("config mismatch: " + f.path() + " has no tensor '" + p.key() + "' (the model has it)");
    const StDtype want = st_from_scalar_type(p.value().scalar_type(), p.key());
    if (ti->dtype != want || ti->shape != p.value().sizes().vec())
      throw CheckpointError("config mismatch: " + f.path() + " tensor '" + p.key() + "' is " + st_name(ti->dtype) +
                            " " + c10::str(c10::IntArrayRef(ti->shape)) + ", the model has " + st_name(want) + " " +
                            c10::str(p.value().sizes()));
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
        diff += " " + k + "=" + quote_json(val) + " (now " +
                quote_json(run_config["model"].value(k, nlohmann::json())) + ")";
    throw CheckpointError("config mismatch: " + (fs::path(v.dir) / kManifestFile).string() +
                          " was saved with model config" + diff);
  }
}

void check_optimizer(const Verified& v, const optim::PrecisionAdam& opt) {
  const std::string mpath = (fs::path(v.dir) / kManifestFile).string();
  const nlohmann::json& optimizer = v.manifest.at("optimizer");
  std::vector<std::string> saved;
  for (const auto& p : optimizer.at("params")) saved.push_back(p.at("name").get<std::string>());
  if (saved != opt.param_names())
    throw CheckpointError("config mismatch: " + mpath + " lists " + std::to_string(saved.size()) +
                          " optimizer params, the optimizer has " + std::to_string(opt.param_names().size()) +
                          " (names or order differ)");
  const auto& groups = optimizer.at("groups");
  if (groups.size() != opt.num_groups())
    throw CheckpointError("config mismatch: " + mpath + " has " + std::to_string(groups.size()) +
                          " parameter groups, the optimizer has " + std::to_string(opt.num_groups()));
  for (size_t g = 0; g < groups.size(); ++g)
    if (groups[g].at("name").get<std::string>() != opt.group_name(g))
      throw CheckpointError("config mismatch: " + mpath + " group " + std::to_string(g) + " is '" +
                            groups[g].at("name").get<std::string>() + "', the optimizer's is '" + opt.group_name(g) +
                            "'");
}

// Shards: each file named once, the file of its dp_rank (shard_file_name), one shard per rank
// of dp_size; every state tensor of a shard file in one of that shard's ranges, with the range's
// length (a boundary moved by one, swapped or doubled shard files are refused here, not at the
// first gather).
void check_shard_files(const Verified& v, const std::string& mpath) {
  const JsonField m(v.manifest, "checkpoint file " + mpath);
  // A range's flat_begin is its offset in the optimizer's flat buffer (save.cpp writes the
  // param's buffer offset + begin). The buffer's layout (Megatron's: reverse model order, padding,
  // buckets) depends on the run's options, so it is not rebuilt here; what holds for any layout:
  // every range of one param gives it the same buffer offset (flat_begin - begin), and no two
  // params' [offset, offset + numel) overlap (numel from model.safetensors).
  std::map<std::string, int64_t> flat_offset;
  const SafetensorsFile& model_file = v.files.at(kModelFile);   // shard_index refused a manifest without it
  std::set<std::string> files;
  std::set<int64_t> ranks;
  std::map<std::pair<std::string, std::string>, int64_t> range_len;   // (file, param) -> end - begin
  m["shards"].each([&](const JsonField& shard) {
    const std::string file = shard["file"].str();
    const int64_t rank = shard["dp_rank"].i64(0, 4095);
    if (!files.insert(file).second) shard["file"].fail("shard file '" + quote_text(file) + "' is named by two shards");
    if (!ranks.insert(rank).second) shard["dp_rank"].fail("dp_rank " + std::to_string(rank) + " has two shards");
    if (file != shard_file_name(static_cast<int>(rank)))
      shard["file"].fail("the shard of dp_rank " + std::to_string(rank) + " is " +
                         shard_file_name(static_cast<int>(rank)) + ", not '" + quote_text(file) +
                         "' (shard files swapped or renamed)");
    shard["param_ranges"].each([&](const JsonField& range) {
      const std::string param = range["param"].str();
      if (!range_len.emplace(std::make_pair(file, param), range["end"].i64() - range["begin"].i64()).second)
        range["param"].fail("shard " + file + " holds two ranges of '" + quote_text(param) + "'");
      if (!range.has("flat_begin")) return;
      const int64_t offset = range["flat_begin"].i64(0, int64_t(1) << 50) - range["begin"].i64();
      auto [earlier, first] = flat_offset.emplace(param, offset);
      if (!first && earlier->second != offset)
        range["flat_begin"].fail(std::to_string(range["flat_begin"].i64()) + ", but another range of '" +
                                 quote_text(param) + "' puts the param at flat offset " +
                                 std::to_string(earlier->second) + " and this range starts at its element " +
                                 std::to_string(range["begin"].i64()) + ": expected " +
                                 std::to_string(earlier->second + range["begin"].i64()));
    });
  });
  {
    std::vector<std::tuple<int64_t, int64_t, std::string>> spans;   // (offset, end, param)
    for (const auto& [param, offset] : flat_offset)
      if (const TensorInfo* info = model_file.find(param))
        spans.emplace_back(offset, offset + static_cast<int64_t>(info->numel()), param);
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i)
      if (std::get<0>(spans[i]) < std::get<1>(spans[i - 1]))
        m["shards"].fail("flat_begin puts '" + quote_text(std::get<2>(spans[i])) + "' at flat offset " +
                         std::to_string(std::get<0>(spans[i])) + ", inside '" + quote_text(std::get<2>(spans[i - 1])) +
                         "' [" + std::to_string(std::get<0>(spans[i - 1])) + ", " +
                         std::to_string(std::get<1>(spans[i - 1])) + ")");
  }
  if (m.has("dp_size")) {
    const int64_t dp_size = m["dp_size"].i64();
    if (static_cast<int64_t>(ranks.size()) != dp_size || (!ranks.empty() && *ranks.rbegin() != dp_size - 1))
      m["shards"].fail(std::to_string(ranks.size()) + " shards, but dp_size is " + std::to_string(dp_size) +
                       " (one shard per rank 0.." + std::to_string(dp_size - 1) + ")");
  }
  m["tensors"].each([&](const JsonField& t) {
    const std::string kind = t["kind"].str();
    if (kind != "master_param" && kind != "remainder" && kind != "exp_avg" && kind != "exp_avg_sq") return;
    const std::string file = t["file"].str(), param = t["param"].str(), key = t["key"].str();
    auto range = range_len.find({file, param});
    if (range == range_len.end())
      t["file"].fail("state '" + quote_text(key) + "' is in " + quote_text(file) +
                     ", but no shard range of that file holds '" + quote_text(param) + "'");
    const int64_t numel = static_cast<int64_t>(v.files.at(file).info(key).numel());
    if (numel != range->second)
      fail_tensor(v, file, key,
                  "has " + std::to_string(numel) + " elements, but its shard's range of '" + param + "' has " +
                      std::to_string(range->second));
  });
}

// Every generator state of train_state and rank_states (one entry per rank below dp_size).
void check_generators(const Verified& v, const TrainState& ts, const std::string& mpath) {
  for (const auto& [name, bytes] : ts.rng_states)
    check_generator_state(bytes, "checkpoint file " + mpath + ": field /train_state/rng_states/" + name);
  const int64_t dp_size = v.manifest.value("dp_size", int64_t(1));
  std::set<int64_t> seen;
  for (size_t i = 0; i < v.saved.rank_states.size(); ++i) {
    const std::string at = "checkpoint file " + mpath + ": field /rank_states/" + std::to_string(i);
    const int64_t r = v.saved.rank_states[i].dp_rank;   // the schema check bounded it
    if (r >= dp_size)
      throw CheckpointError(at + "/dp_rank: " + std::to_string(r) + " is not below dp_size " + std::to_string(dp_size),
                            mpath);
    if (!seen.insert(r).second)
      throw CheckpointError(at + "/dp_rank: rank " + std::to_string(r) + " listed twice", mpath);
    for (const auto& [name, bytes] : v.saved.rank_states[i].rng_states)
      check_generator_state(bytes, at + "/rng_states/" + name);
  }
}

// A load restores generators of the run's device: a CPU run's must be CPU states, a CUDA run's the
// 16-byte Philox state. check_generators accepts either (inspect knows no device), so a 16-byte
// state in rank_states passed, the load was reported, and set_state failed afterwards with a
// LibTorch backtrace (exit 3 at --nproc 2). Every rank checks every rank's state, so all refuse
// alike, before anything is restored.
void check_generators_for_device(const Verified& v, const TrainState& ts, const nlohmann::json& run_config,
                                 const std::string& mpath) {
  constexpr size_t kPhiloxStateBytes = 16;
  std::string device = "cpu";
  if (run_config.is_object() && run_config.contains("train") && run_config["train"].is_object() &&
      run_config["train"].contains("device") && run_config["train"]["device"].is_string())
    device = run_config["train"]["device"].get<std::string>();
  const bool cuda = device == "cuda";
  auto check = [&](const std::vector<uint8_t>& bytes, const std::string& what) {
    if ((bytes.size() == kPhiloxStateBytes) == cuda) return;
    throw CheckpointError(what + ": " + std::to_string(bytes.size()) + " bytes is " +
                              (cuda ? "a CPU generator's state" : "a CUDA generator's state") +
                              ", but this run's generators are on the " +
                              (cuda ? "GPU (a CUDA generator's has 16 bytes)"
                                    : "CPU (a CPU generator's has 5048 or 5056 bytes)"),
                          mpath);
  };
  for (const auto& [name, bytes] : ts.rng_states)
    check(bytes, "checkpoint file " + mpath + ": field /train_state/rng_states/" + name);
  for (size_t i = 0; i < v.saved.rank_states.size(); ++i)
    for (const auto& [name, bytes] : v.saved.rank_states[i].rng_states)
      check(bytes, "checkpoint file " + mpath + ": field /rank_states/" + std::to_string(i) + "/rng_states/" + name);
}

}   // namespace

void check_generator_state(const std::vector<uint8_t>& bytes, const std::string& what) {
  constexpr size_t kPhiloxStateBytes = 16;   // CUDAGeneratorImpl: seed and offset
  if (bytes.size() == kPhiloxStateBytes) return;
  auto gen = at::detail::createCPUGenerator();
  const int64_t cpu_bytes = gen.get_state().numel();
  auto t = torch::empty({static_cast<int64_t>(bytes.size())}, torch::kByte);
  if (!bytes.empty()) std::memcpy(t.data_ptr<uint8_t>(), bytes.data(), bytes.size());
  try {
    gen.set_state(t);
  } catch (const c10::Error&) {
    throw CheckpointError(what + ": " + std::to_string(bytes.size()) +
                          " bytes is not a generator state (a CPU "
                          "generator's has " +
                          std::to_string(cpu_bytes) + ", a CUDA generator's " + std::to_string(kPhiloxStateBytes) +
                          ")");
  }
}

Consistent check_consistency(const Verified& v, const nlohmann::json& run_config) {
  const std::string mpath = (fs::path(v.dir) / kManifestFile).string();
  Consistent consistent;
  check_counters(v.saved, resuming_run(run_config), mpath);   // against each other and the run they resume
  consistent.train_state = v.saved.train_state;
  check_generators(v, consistent.train_state, mpath);
  consistent.ix = shard_index(v);
  check_shard_files(v, mpath);
  return consistent;
}

std::string where(const Verified& v, const std::string& file, const std::string& key) {
  return "checkpoint file " + (fs::path(v.dir) / file).string() + " tensor '" + key + "'";
}


// The most a load of this model and optimizer may decode: the model's
// parameters and buffers as they are, and per parameter element at most 16 bytes of optimizer
// state (master or remainder, exp_avg, exp_avg_sq: at most 4 bytes each in every save policy,
// fp32; one spare), plus 64 KiB per parameter for the per-shard scales. A manifest resealed to
// agree with a bomb's table is refused before decoding it, whatever the machine's memory.
uint64_t decode_budget(const torch::nn::Module& model) {
  uint64_t bytes = 1u << 20;
  for (const auto& p : model.named_parameters(true))
    bytes += static_cast<uint64_t>(p.value().nbytes()) + 16 * static_cast<uint64_t>(p.value().numel()) + (64u << 10);
  for (const auto& b : model.named_buffers(true)) bytes += static_cast<uint64_t>(b.value().nbytes());
  return bytes;
}

// In this order, so that a checkpoint with several faults is refused for the same one as always.
VerifiedLoad verify_for_load(const std::string& dir, const torch::nn::Module& model, const optim::PrecisionAdam& opt,
                             const nlohmann::json& run_config) {
  VerifiedLoad verified;
  verified.v = verify_checkpoint_dir(dir, decode_budget(model));   // marks what inspect refuses as damage
  verified.mpath = (fs::path(dir) / kManifestFile).string();
  Consistent consistent;
  try {
    check_model(verified.v, model, run_config);
    check_optimizer(verified.v, opt);
    consistent = check_consistency(verified.v, run_config);   // what inspect checks too
  } catch (const std::exception& e) {
    // Damage is damage whatever else this run refuses: the message stays the first refusal (the
    // order above), the exit code is inspect's, so both commands give a damaged checkpoint one code.
    bool damaged = false;
    try {
      (void)check_consistency(verified.v, nlohmann::json());
    } catch (const std::exception&) {
      damaged = true;
    }
    const auto* refusal = dynamic_cast<const CheckpointError*>(&e);
    if (!damaged && refusal == nullptr) throw;
    CheckpointError out = refusal ? *refusal : CheckpointError(e.what(), verified.mpath);
    out.damaged = out.damaged || damaged;
    throw out;
  }
  check_generators_for_device(verified.v, consistent.train_state, run_config, verified.mpath);
  verified.train_state = std::move(consistent.train_state);
  verified.ix = std::move(consistent.ix);
  return verified;
}

}   // namespace detail
}   // namespace rh::ckpt
