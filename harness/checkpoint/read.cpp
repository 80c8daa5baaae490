// Reading a checkpoint without a model or optimizer (checkpoint.h): its size on disk for the
// resume check's bytes-per-parameter figures, and every tensor with data-parallel shards joined
// for the state comparison. Not here: restoring state (load.cpp), the `inspect` view (inspect.cpp).
#include <filesystem>
#include <stdexcept>
#include <string>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"

namespace rh::ckpt {

namespace fs = std::filesystem;

namespace {

// One optimizer-state tensor of a shard file as the whole param's tensor: a state is joined over
// the shards; a scale is one value when every shard holding part of the state has the same
// (shared_dp_scale, or one shard), else the shards' values in piece order (per-shard scaling).
torch::Tensor joined_state(const detail::Verified& v, const detail::ShardIndex& ix, const SafetensorsFile& f,
                           const TensorInfo& t) {
  const auto slash = t.key.rfind('/');
  const std::string param = t.key.substr(0, slash);
  if (!ix.pieces.count(param)) throw std::runtime_error(f.path() + ": tensor '" + t.key + "' of no known param");
  if (is_scale_key(t.key)) return detail::gather_scale(v, ix, param, t.key);
  int64_t n = 1;
  for (int64_t d : ix.shape.at(param)) n *= d;
  return detail::gather_state(v, ix, param, t.key, 0, n).reshape(ix.shape.at(param));
}

}   // namespace

CheckpointSize measure_checkpoint(const std::string& root_or_iter_dir) {
  CheckpointSize s;
  const fs::path iter = detail::resolve_checkpoint_dir(root_or_iter_dir);
  s.iter_dir = iter.string();
  // The checkpoint's files; disk.csv is an accounting report beside them, not checkpoint data,
  // and the manifest's 17-byte checksum is left out as the manifest's own disk accounting does.
  for (const auto& e : fs::directory_iterator(iter))
    if (e.is_regular_file() && e.path().filename() != detail::kDiskCsvFile &&
        e.path().filename() != detail::kManifestChecksumFile)
      s.stored_bytes += e.file_size();
  auto f = SafetensorsFile::open((iter / detail::kModelFile).string());
  if (f.compressed()) f = f.decoded();   // blobs of stored bytes: count the decoded tensors' elements
  for (const auto& t : f.tensors()) s.num_params += static_cast<int64_t>(t.numel());
  s.raw_bytes = s.stored_bytes;
  const nlohmann::json manifest = detail::read_manifest_file((iter / detail::kManifestFile).string());
  for (const auto& file : manifest["files"])
    if (file.contains("compress"))
      s.raw_bytes += file["raw_bytes"].get<uint64_t>() - file["stored_bytes"].get<uint64_t>();
  return s;
}

JoinedTensors read_joined_tensors(const std::string& root_or_iter_dir) {
  JoinedTensors out;
  const detail::Verified v = detail::verify_checkpoint_dir(detail::resolve_checkpoint_dir(root_or_iter_dir));
  const detail::ShardIndex ix = detail::shard_index(v);
  for (const auto& [name, f] : v.files) {
    const bool model = name == detail::kModelFile;
    for (const auto& t : f.tensors()) {
      if (model) {
        out.tensors["model/" + t.key] = {t.dtype, f.tensor(t.key)};
        continue;
      }
      if (out.tensors.count(t.key)) continue;   // joined already from another shard
      out.tensors[t.key] = {t.dtype, joined_state(v, ix, f, t)};
    }
  }
  out.files.reserve(v.files.size());
  for (const auto& [name, f] : v.files) out.files.push_back(f);
  return out;
}

}   // namespace rh::ckpt
