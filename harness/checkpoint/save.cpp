// save_checkpoint: every rank writes and verifies its optimizer shard, rank 0 also the model and
// then the manifest, into a temporary directory that publish.h's protocol makes durable and
// publishes (temp dir, fsync, rename, pointer). The ranks agree after each phase (optim::agree),
// so a failure on one fails the save on all and nothing is published.
#include "harness/base/text.h"
#include "harness/base/version.h"
#include <xxhash.h>

#include <filesystem>
#include <future>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"
#include "harness/checkpoint/policy.h"
#include "harness/checkpoint/publish.h"

namespace rh::ckpt {

namespace fs = std::filesystem;
using optim::StateKey;

namespace {

constexpr StateKey kKeys[] = {StateKey::master_param, StateKey::exp_avg, StateKey::exp_avg_sq};

nlohmann::json optimizer_json(const optim::PrecisionAdam& opt) {
  const auto& config = opt.config();
  return {{"use_precision_aware_optimizer", config.use_precision_aware_optimizer},
          {"main_grads_dtype", optim::to_string(config.main_grads_dtype)},
          {"main_params_dtype", optim::to_string(config.main_params_dtype)},
          {"exp_avg_dtype", optim::to_string(config.exp_avg_dtype)},
          {"exp_avg_sq_dtype", optim::to_string(config.exp_avg_sq_dtype)},
          {"store_param_remainders", config.store_param_remainders},
          {"beta1", config.beta1},
          {"beta2", config.beta2},
          {"eps", config.eps},
          {"weight_decay", config.weight_decay},
          {"adam_w_mode", config.adam_w_mode}};
}

TensorInfo info_of(const std::string& key, const torch::Tensor& tensor, StDtype dtype) {
  TensorInfo ti;
  ti.key = key;
  ti.dtype = dtype;
  ti.shape = tensor.sizes().vec();
  ti.end = static_cast<uint64_t>(tensor.numel()) * st_itemsize(dtype);
  return ti;
}

// The manifest's entry for a written file: size, whole-file XXH3-64, and the XXH3-64 of every
// kHashBlock bytes (the loader verifies those in parallel).
nlohmann::json file_entry(const std::string& name, const char* kind, const WriteStats& ws) {
  nlohmann::json blocks = nlohmann::json::array();
  for (uint64_t h : ws.block_xxh3) blocks.push_back(hex64(h));
  return {{"name", name},           {"kind", kind},
          {"bytes", ws.file_bytes}, {"header_bytes", ws.header_bytes},
          {"xxh3", hex64(ws.xxh3)}, {"block_bytes", kHashBlock},
          {"block_xxh3", blocks}};
}

// Writes a data file as the policy says (plain or compressed). For a compressed one, adds to the
// file entry "compress", "header_xxh3", "raw_bytes" (its tensors' bytes decoded) and
// "stored_bytes" (their bytes in the file), and "stored_bytes" to each of its tensor entries.
WriteStats write_data_file(const std::string& path, const std::vector<WriteTensor>& tensors,
                           const std::map<std::string, std::string>& metadata, const SavePolicy& policy,
                           nlohmann::json& tensor_entries, nlohmann::json& file_json, const char* kind,
                           const std::string& name) {
  if (policy.compress == Compression::none) {
    WriteStats ws = write_safetensors(path, tensors, metadata, true);
    file_json = file_entry(name, kind, ws);
    return ws;
  }
  std::map<std::string, CompressedKeyStats> per_key;
  WriteStats ws = write_safetensors_compressed(path, tensors, metadata, true, CodecOptions{}, &per_key);
  file_json = file_entry(name, kind, ws);
  uint64_t raw = 0, stored = 0;
  for (const auto& [k, stats] : per_key) {
    raw += stats.raw_bytes;
    stored += stats.stored_bytes;
  }
  file_json["compress"] = to_string(policy.compress);
  file_json["header_xxh3"] = hex64(ws.header_xxh3);
  file_json["raw_bytes"] = raw;
  file_json["stored_bytes"] = stored;
  for (auto& entry : tensor_entries)
    if (entry["file"] == name) entry["stored_bytes"] = per_key.at(entry["key"].get<std::string>()).stored_bytes;
  return ws;
}

// Rank `rank`'s optimizer shard: writes the file into tmp, verifies it (read back, XXH3), and
// returns its part of the manifest: {"tensors", "file", "shard", "rng_states"}.
nlohmann::json write_shard(const fs::path& tmp, const SaveInput& in, int rank, bool verify) {
  const optim::PrecisionAdam& opt = *in.optimizer;
  const std::string shard = detail::shard_file_name(rank);
  nlohmann::json part;
  part["tensors"] = nlohmann::json::array();
  std::vector<WriteTensor> shard_tensors;
  // param_ranges: the part [begin, end) of each param this shard holds, and where that part
  // starts in the flat concatenation of all params in optimizer order (Megatron's
  // distributed-optimizer ranges); any data-parallel layout can be rebuilt from them.
  nlohmann::json ranges = nlohmann::json::array();
  const auto names = opt.param_names();
  for (size_t i = 0; i < names.size(); ++i) {
    const std::string& param = names[i];
    const auto [begin, end] = opt.shard_range(param);
    if (begin == end) continue;
    ranges.push_back(
        {{"param", param}, {"begin", begin}, {"end", end}, {"flat_begin", opt.layout().offsets[i] + begin}});
    for (StateKey state_key : kKeys)
      for (detail::EncodedTensor& encoded : detail::encode_state(opt, param, state_key, in.policy)) {
        part["tensors"].push_back(detail::tensor_entry(shard, encoded.key, param, encoded.kind,
                                                       info_of(encoded.key, encoded.data, encoded.dtype),
                                                       encoded.policy, encoded.conversion, encoded.exact));
        shard_tensors.push_back({encoded.key, std::move(encoded.data), encoded.dtype});
      }
  }
  const std::string path = (tmp / shard).string();
  const int dp_size = in.group ? in.group->size() : 1;
  nlohmann::json fentry;
  const WriteStats ws =
      write_data_file(path, shard_tensors,
                      {{"format", "pt"}, {"dp_rank", std::to_string(rank)}, {"dp_size", std::to_string(dp_size)}},
                      in.policy, part["tensors"], fentry, "optimizer_shard", shard);
  if (verify) {   // what reached the file system, not what we meant to write
    SafetensorsFile::open(path, [&](const uint8_t* data, uint64_t size) {
      if (size != ws.file_bytes || XXH3_64bits(data, size) != ws.xxh3)
        throw CheckpointError("checkpoint file " + path + ": read-back verification failed (size or XXH3-64 differ)");
    });
  }
  part["file"] = fentry;
  part["shard"] = {{"file", shard}, {"dp_rank", rank}, {"param_ranges", ranges}};
  part["rng_states"] = rng_states_json(in.state->rng_states);
  return part;
}

// Rank 0's model file and the manifest skeleton.
nlohmann::json write_model(const fs::path& tmp, const SaveInput& in, uint64_t& num_params) {
  nlohmann::json manifest;
  manifest["format"] = detail::kFormatName;
  manifest["format_version"] = kFormatVersion;
  manifest["harness_version"] = RH_VERSION;
  manifest["git_commit"] = rh::git_commit();
  manifest["iteration"] = in.state->iteration;
  manifest["run_config"] = in.run_config;
  // Megatron's dp_reshardable saves per_bucket_numel_unpadded beside its per-bucket tensors and
  // asserts it on load (load_layout.cpp); written for every policy, compared for that one.
  manifest["per_bucket_numel_unpadded"] = in.optimizer->layout().bucket_numel_unpadded;
  manifest["save_policy"] = to_json(in.policy);
  manifest["train_state"] = to_json(*in.state);
  manifest["tensors"] = nlohmann::json::array();
  manifest["files"] = nlohmann::json::array();
  std::vector<WriteTensor> model_tensors;
  num_params = 0;
  for (const auto& item : in.model->named_parameters(/*recurse=*/true)) {
    const torch::Tensor& param = item.value();
    StDtype dtype = st_from_scalar_type(param.scalar_type(), "model parameter " + item.key());
    model_tensors.push_back({item.key(), param.detach(), dtype});
    num_params += static_cast<uint64_t>(param.numel());
    manifest["tensors"].push_back(detail::tensor_entry(detail::kModelFile, item.key(), item.key(), "model",
                                                       info_of(item.key(), param, dtype), "native", "stored", true));
  }
  // Persistent buffers (a router's expert_bias) go into the model file beside the weights, as in
  // a PyTorch state_dict; they are not parameters and not counted as such.
  nlohmann::json buffer_names = nlohmann::json::array();
  for (const auto& item : in.model->named_buffers(/*recurse=*/true)) {
    const torch::Tensor& buffer = item.value();
    buffer_names.push_back(item.key());
    StDtype dtype = st_from_scalar_type(buffer.scalar_type(), "model buffer " + item.key());
    model_tensors.push_back({item.key(), buffer.detach(), dtype});
    manifest["tensors"].push_back(detail::tensor_entry(detail::kModelFile, item.key(), item.key(), "model",
                                                       info_of(item.key(), buffer, dtype), "native", "stored", true));
  }
  nlohmann::json fentry;
  write_data_file((tmp / detail::kModelFile).string(), model_tensors, {{"format", "pt"}}, in.policy,
                  manifest["tensors"], fentry, "model", detail::kModelFile);
  manifest["files"].push_back(fentry);
  manifest["model"] = {{"num_params", num_params}, {"num_tensors", model_tensors.size()}, {"buffers", buffer_names}};
  const optim::PrecisionAdam& opt = *in.optimizer;
  nlohmann::json groups = nlohmann::json::array();
  for (size_t g = 0; g < opt.num_groups(); ++g)
    groups.push_back({{"name", opt.group_name(g)}, {"step", opt.step_count(g)}});
  nlohmann::json params = nlohmann::json::array();
  for (const std::string& name : opt.param_names())
    params.push_back(
        {{"name", name}, {"group", opt.group_name(opt.group_of(name))}, {"numel", opt.param(name).numel()}});
  torch::ScalarType param_dtype =
      opt.param_names().empty() ? torch::kFloat : opt.param(opt.param_names()[0]).scalar_type();
  manifest["optimizer"] = {{"master_mode", optim::to_string(opt.master_mode())},
                           {"param_dtype", c10::toString(param_dtype)},
                           {"describe", opt.describe()},
                           {"config", optimizer_json(opt)},
                           {"groups", groups},
                           {"params", params}};
  return manifest;
}

// This rank's outcome of a phase: the payload, or the error it caught.
optim::RankOutcome outcome(const std::string& err, std::string payload = "") {
  optim::RankOutcome o;
  o.ok = err.empty();
  if (o.ok) o.payload = std::move(payload);
  else o.error = err;
  return o;
}

// One save as every rank sees it.
struct SaveJob {
  SaveJob(const std::string& root_str_, const SaveInput& in_)
      : in(in_),
        rank(in_.group ? in_.group->rank() : 0),
        size(in_.group ? in_.group->size() : 1),
        root_str(root_str_),
        root(root_str_) {}
  // Rank 0 owns the temp directory: never a published one.
  void abandon() const {
    if (rank != 0) return;
    std::error_code ignore;
    fs::remove_all(tmp, ignore);
  }

  const SaveInput& in;
  const int rank, size;
  const std::string root_str;
  const fs::path root;
  std::string name;     // iter_0000010
  fs::path final_dir;   // root/name
  fs::path tmp;         // rank 0's temp directory, agreed in phase 1
};

// Phase 1, every rank: its own input.
void check_input(const SaveJob& job) {
  const SaveInput& in = job.in;
  if (!in.model || !in.optimizer || !in.state)
    throw CheckpointError("save_checkpoint(" + job.root_str + "): model, optimizer and state are required");
  for (const auto& [k, d] : in.policy.overrides) {   // a SavePolicy built in code, not parsed
    try {
      (void)parse_override_key(k, "save policy override");
    } catch (const std::invalid_argument& e) {
      throw CheckpointError(e.what());
    }
  }
  if (in.optimizer->layout().size != job.size || in.optimizer->layout().rank != job.rank)
    throw CheckpointError("save_checkpoint(" + job.root_str + "): the optimizer is sharded as " +
                          in.optimizer->layout().describe() + " but the save group is rank " +
                          std::to_string(job.rank) + " of " + std::to_string(job.size));
}

// Phase 1: every rank checks its input and rank 0 prepares the temp directory; all learn the
// outcome (a rank's bad input fails the save on every rank instead of leaving them waiting) and
// the temp directory's name.
void prepare(SaveJob& job) {
  std::string err, tmp_name;
  try {
    check_input(job);
    if (job.rank == 0) detail::make_temp_dir(job.root_str, job.name, tmp_name);
  } catch (const std::exception& e) {
    err = e.what();
  }
  const optim::Agreement agreement = optim::agree(job.in.group, outcome(err, tmp_name));
  if (!agreement.ok()) {
    if (job.rank == 0 && !tmp_name.empty()) remove_tree((job.root / tmp_name).string());
    if (!job.in.group) throw CheckpointError(err);   // a single process: its own error, as it was
    throw CheckpointError("save of " + job.final_dir.string() + " failed on " + agreement.failure());
  }
  job.tmp = job.root / agreement.payloads.at(0);
}

// What phase 2 wrote.
struct Written {
  nlohmann::json manifest;             // rank 0: the skeleton write_model made
  uint64_t num_params = 0;             // rank 0: the model's parameter count
  std::vector<nlohmann::json> parts;   // every rank's write_shard part, in rank order
};

// Phase 2 on this rank. Rank 0 writes the model file on a second thread while it writes its
// shard, so the two page-cache copies overlap. It pays where the storage outpaces one core (1 GB
// bench on tmpfs: 0.46 s -> 0.41 s); on this VM's disk the write-back bounds both (within noise).
nlohmann::json write_model_and_shard(const SaveJob& job, Written& written) {
  std::future<nlohmann::json> model;
  if (job.rank == 0)
    model = std::async(std::launch::async, [&] { return write_model(job.tmp, job.in, written.num_params); });
  nlohmann::json part;
  std::string shard_err;
  try {
    part = write_shard(job.tmp, job.in, job.rank, job.size > 1);
  } catch (const std::exception& e) {
    shard_err = e.what();
  }
  if (model.valid()) written.manifest = model.get();   // the model's error first: it names the model file
  if (!shard_err.empty()) throw CheckpointError(shard_err);
  return part;
}

// Phase 2: every rank writes and verifies its shard; rank 0 also the model. Any rank's failure
// abandons the temp directory on every rank.
Written write_files(const SaveJob& job) {
  Written written;
  nlohmann::json part;
  std::string err;
  try {
    part = write_model_and_shard(job, written);
  } catch (const std::exception& e) {
    err = e.what();
  }
  // Other ranks' parts travel as JSON text; a process of its own keeps its part as it is.
  optim::Agreement agreement;
  try {
    agreement = optim::agree(job.in.group, outcome(err, job.in.group && err.empty() ? part.dump() : ""));
  } catch (...) {
    job.abandon();
    throw;
  }
  if (!agreement.ok()) {
    job.abandon();
    throw CheckpointError("save of " + job.final_dir.string() + " failed on " + agreement.failure() +
                          "; nothing was published, the previous checkpoint stays the newest");
  }
  if (!job.in.group) {
    written.parts.push_back(std::move(part));
  } else {
    for (const std::string& text : agreement.payloads) written.parts.push_back(nlohmann::json::parse(text));
  }
  return written;
}

// Phase 3: every rank's shard part joined into rank 0's manifest, then the disk accounting (which
// settles the manifest's own size). Returns the manifest's text.
std::string assemble_manifest(const SaveJob& job, Written& written) {
  nlohmann::json& manifest = written.manifest;
  nlohmann::json shards = nlohmann::json::array(), rank_states = nlohmann::json::array();
  for (size_t i = 0; i < written.parts.size(); ++i) {
    const nlohmann::json& part = written.parts[i];
    for (const auto& t : part["tensors"]) manifest["tensors"].push_back(t);
    manifest["files"].push_back(part["file"]);
    shards.push_back(part["shard"]);
    rank_states.push_back({{"dp_rank", i}, {"rng_states", part["rng_states"]}});
  }
  manifest["dp_size"] = job.size;
  manifest["shards"] = shards;
  manifest["rank_states"] = rank_states;   // per-rank generators; train_state holds rank 0's
  return detail::finalize_disk_accounting(manifest, written.num_params);
}

// Phase 3 on rank 0: manifest, its checksum and disk.csv into the temp directory, then publish
// (publish.h). Returns what every rank's SaveResult is made of.
SaveResult publish(const SaveJob& job, Written& written) {
  const std::string text = assemble_manifest(job, written);
  detail::publish_dir(job.root_str, job.tmp.string(), job.name, job.in.state->iteration,
                      {{detail::kManifestFile, text},
                       {detail::kManifestChecksumFile, detail::manifest_checksum_text(text)},
                       {detail::kDiskCsvFile, detail::disk_csv(written.manifest)}});
  const nlohmann::json& disk = written.manifest["disk"];
  SaveResult result;
  result.dir = job.final_dir.string();
  result.total_bytes = disk["total_bytes"].get<uint64_t>();
  result.bytes_per_key = disk["bytes_per_key"].get<std::map<std::string, uint64_t>>();
  result.bytes_per_param = disk["bytes_per_param"].get<double>();
  return result;
}

// A SaveResult between ranks: JSON text (only across processes).
std::string result_text(const SaveResult& result) {
  return nlohmann::json{{"total_bytes", result.total_bytes},
                        {"bytes_per_key", result.bytes_per_key},
                        {"bytes_per_param", result.bytes_per_param}}
      .dump();
}
SaveResult result_of_text(const std::string& dir, const std::string& text) {
  const nlohmann::json parsed = nlohmann::json::parse(text);
  SaveResult result;
  result.dir = dir;
  result.total_bytes = parsed["total_bytes"].get<uint64_t>();
  result.bytes_per_key = parsed["bytes_per_key"].get<std::map<std::string, uint64_t>>();
  result.bytes_per_param = parsed["bytes_per_param"].get<double>();
  return result;
}

// The end: every rank learns rank 0's outcome of phase 3; the others take its result.
SaveResult agreed_result(const SaveJob& job, const std::string& err, const SaveResult& mine) {
  const bool send = job.in.group && job.rank == 0 && err.empty();
  const optim::Agreement agreement = optim::agree(job.in.group, outcome(err, send ? result_text(mine) : ""));
  if (!agreement.ok()) throw CheckpointError("save of " + job.final_dir.string() + " failed on " + agreement.failure());
  if (!job.in.group || job.rank == 0) return mine;
  return result_of_text(job.final_dir.string(), agreement.payloads.at(0));
}

}   // namespace

SaveResult save_checkpoint(const std::string& root_str, const SaveInput& in) {
  SaveJob job(root_str, in);
  // Arguments wrong on every rank alike fail at once, before the ranks talk.
  if (root_str.empty()) throw CheckpointError("save_checkpoint: the checkpoint root is an empty path");
  if (in.state && (in.state->iteration < 0 || in.state->iteration > detail::kMaxCounter))
    throw CheckpointError("save_checkpoint(" + root_str + "): iteration " + std::to_string(in.state->iteration) +
                          " is outside [0, " + std::to_string(detail::kMaxCounter) + "]");
  job.name = detail::iter_dir_name(in.state ? in.state->iteration : 0);
  job.final_dir = job.root / job.name;
  prepare(job);
  Written written = write_files(job);
  // Phase 3: rank 0 writes the manifest and publishes; the others wait for the outcome.
  std::string err;
  SaveResult result;
  if (job.rank == 0) {
    try {
      result = publish(job, written);
    } catch (const std::exception& e) {
      err = e.what();
      job.abandon();
    }
  }
  return agreed_result(job, err, result);
}

}   // namespace rh::ckpt
