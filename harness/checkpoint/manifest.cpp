// Whole-checkpoint verification and disk accounting (see manifest.h for the layout).
#include "harness/checkpoint/manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <set>
#include <sstream>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/manifest_reader.h"

#include <sys/stat.h>
#include <unistd.h>

namespace rh::ckpt::detail {

namespace fs = std::filesystem;

std::string iter_dir_name(int64_t iteration) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "iter_%07lld", static_cast<long long>(iteration));
  return buf;
}

std::string shard_file_name(int dp_rank) {
  char buf[48];
  std::snprintf(buf, sizeof buf, "optim_rank_%05d.safetensors", dp_rank);
  return buf;
}

namespace {

// Every refusal names the file (and load_result.json gets it, with the tensor where known).
[[noreturn]] void fail(const std::string& file, const std::string& what, const std::string& tensor = "") {
  throw CheckpointError("checkpoint file " + file + ": " + what, file, tensor);
}

// One file the manifest lists, with what it must hash to.
struct Want {
  std::string name, path, hash;
  uint64_t size;
  uint64_t block_bytes = 0;   // > 0: verify block_hash (in parallel) instead of hash
  std::vector<std::string> block_hash;
  bool compressed = false;   // "compress": "zstd": decoded after every check
  uint64_t header_bytes = 0;
  std::string header_hash;   // compressed files: damage is located to a block
  // Compressed files: the manifest's tensors of this file, which the file's table must match
  // before anything is decoded (so a load decodes at most what the manifest lists).
  std::map<std::string, TensorInfo> listed;
};

// The manifest's files: plain names only, so nothing outside the directory can be read through a
// manifest; each one present and not a link.
std::vector<Want> listed_files(const JsonField& manifest, const std::string& dir, const std::string& manifest_path) {
  std::vector<Want> wants;
  std::set<std::string> names;
  manifest["files"].each([&](const JsonField& entry) {
    const std::string name = entry["name"].str();
    if (!is_plain_file_name(name))
      entry["name"].fail("'" + quote_text(name) + "' is not a plain file name inside the checkpoint directory");
    if (!names.insert(name).second) entry["name"].fail("file '" + name + "' listed twice");
    const std::string path = (fs::path(dir) / name).string();
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) fail(path, "missing (listed in " + manifest_path + ")");
    if (S_ISLNK(st.st_mode))
      fail(path, "is a symbolic link; refused (checkpoint files must be regular files inside " + dir + ")");
    Want want{name, path, entry["xxh3"].str(), entry["bytes"].u64(), 0, {}, false, 0, {}, {}};
    if (entry.has("block_xxh3")) {   // the schema check bounded block_bytes and matched the count
      want.block_bytes = entry["block_bytes"].u64();
      entry["block_xxh3"].each([&](const JsonField& h) { want.block_hash.push_back(h.str()); });
    }
    if (entry.has("compress")) {   // the schema check allowed "zstd" only, with header_xxh3
      want.compressed = true;
      want.header_bytes = entry["header_bytes"].u64();
      want.header_hash = entry["header_xxh3"].str();
    }
    wants.push_back(std::move(want));
  });
  return wants;
}

// A compressed file's table (rh_tensors) against the manifest's tensors of that file, before
// SafetensorsFile::decoded() allocates or decodes anything: each entry the table lists must be a
// tensor the manifest lists there, with its dtype, shape and raw bytes, so a load decodes at most
// what the manifest says (a table claiming two 3 GiB zero tensors in 6.4 MB would otherwise be
// decoded before the refusal). An entry decoded() refuses as malformed (raw_bytes not numel x itemsize, ...) is left
// to its message, which it gives before allocating anything.
void match_table(const Want& want, const SafetensorsFile& sf) {
  auto table_text = sf.metadata().find("rh_tensors");
  if (table_text == sf.metadata().end()) return;
  nlohmann::json table;
  try {
    table = parse_json_bounded(table_text->second, want.path);
  } catch (const std::invalid_argument&) {
    return;
  }
  if (!table.is_object()) return;
  for (auto it = table.begin(); it != table.end(); ++it) {
    const nlohmann::json& entry = it.value();
    StDtype dtype;
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !st_parse(entry["dtype"].get<std::string>(), &dtype) || !entry.contains("shape") ||
        !entry["shape"].is_array() || !entry.contains("raw_bytes") || !entry["raw_bytes"].is_number_unsigned())
      return;
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& dim : entry["shape"]) {
      if (!dim.is_number_unsigned() || dim.get<uint64_t>() > (uint64_t(1) << 40)) return;
      shape.push_back(dim.get<int64_t>());
      if (__builtin_mul_overflow(numel, dim.get<uint64_t>(), &numel)) return;
    }
    const uint64_t raw = entry["raw_bytes"].get<uint64_t>();
    uint64_t need = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(st_itemsize(dtype)), &need) || need != raw) return;
    auto listed = want.listed.find(it.key());
    if (listed == want.listed.end())
      fail(want.path, "tensor '" + quote_text(it.key()) + "' is not in the manifest (refused before decoding)",
           it.key());
    const TensorInfo& manifest_info = listed->second;
    if (dtype != manifest_info.dtype || shape != manifest_info.shape || raw != manifest_info.end)
      fail(want.path,
           "tensor '" + quote_text(it.key()) + "' is " + st_name(dtype) + " " + nlohmann::json(shape).dump() + " (" +
               std::to_string(raw) + " bytes) in rh_tensors, manifest says " + st_name(manifest_info.dtype) + " " +
               nlohmann::json(manifest_info.shape).dump() + " (" + std::to_string(manifest_info.end) +
               " bytes); refused before decoding",
           it.key());
  }
}

// One file: size and checksum before the structure, so damage is reported as damage.
SafetensorsFile open_verified(const Want& want) {
  // A compressed file whose header is intact names the damaged block (tensor, block index).
  auto located = [&](const uint8_t* data, uint64_t size) -> std::string {
    if (!want.compressed || want.header_bytes > size || hex64(XXH3_64bits(data, want.header_bytes)) != want.header_hash)
      return "";
    const std::string loc = SafetensorsFile::locate_damaged_block(want.path, data, size);
    return loc.empty() ? "" : loc + " (file is corrupted; ";
  };
  auto check_size = [&](uint64_t size) {
    if (size != want.size)
      fail(want.path, "size " + std::to_string(size) + " bytes, manifest says " + std::to_string(want.size) +
                          (size < want.size ? " (truncated)" : ""));
    // Every byte is covered by exactly one block. The count was checked against the listed
    // size; the size equals it here: never skip both checks.
    const size_t num_blocks = want.block_hash.size();
    if (want.block_bytes > 0 && (block_count(size, want.block_bytes) != num_blocks || (size > 0 && num_blocks == 0)))
      fail(want.path, std::to_string(num_blocks) + " block checksums of " + std::to_string(want.block_bytes) +
                          " bytes do not cover its " + std::to_string(size) + " bytes");
  };
  auto check_blocks = [&](const uint8_t* data, uint64_t size, const std::vector<uint64_t>& got) {
    for (size_t b = 0; b < got.size(); ++b)
      if (hex64(got[b]) != want.block_hash[b]) {
        const std::string loc = located(data, size);
        fail(want.path, loc + "XXH3-64 checksum of bytes [" + std::to_string(b * want.block_bytes) + ", " +
                            std::to_string(std::min<uint64_t>((b + 1) * want.block_bytes, size)) + ") " +
                            hex64(got[b]) + " != manifest " + want.block_hash[b] +
                            (loc.empty() ? " (file is corrupted)" : ")"));
      }
  };
  auto check = [&](const uint8_t* data, uint64_t size) {   // a file without block checksums
    check_size(size);
    const std::string got = hex64(XXH3_64bits(data, size));
    if (got != want.hash) {
      const std::string loc = located(data, size);
      fail(want.path, loc + "XXH3-64 checksum " + got + " != manifest " + want.hash +
                          (loc.empty() ? " (file is corrupted)" : ")"));
    }
  };
  // Files with block checksums are read, hashed and copied in one pass into pooled memory
  // (size first, before anything is allocated): an uncompressed file's staging is what the state
  // then adopts (load_apply.cpp); a compressed file's stored bytes are decoded from it, which is
  // faster than decoding from a mapping (no page faults on the stored bytes; measured in
  // bench_compress). Files without block checksums are mapped and hashed whole.
  SafetensorsFile sf = want.block_bytes > 0
                           ? SafetensorsFile::read_hashed(
                                 want.path, want.block_bytes, [&](uint64_t size) { check_size(size); }, check_blocks)
                           : SafetensorsFile::open(want.path, check);
  if (sf.compressed() != want.compressed)
    fail(want.path, sf.compressed() ? "is compressed (rh_codec), but the manifest does not say so"
                                    : "the manifest says compressed, but the file names no codec (rh_codec)");
  if (!want.compressed) return sf;
  match_table(want, sf);
  return sf.decoded();   // every block checked and decoded on all cores
}

// The manifest's tensors of each compressed file (what its table must match), and the total a load
// may decode: what the manifest says those tensors hold, refused once for the whole checkpoint when
// it exceeds this machine's memory (not per file: two 3 GiB tables each fit, together they do not)
// or the caller's budget (a load: what its model and optimizer can hold, load.cpp). A state tensor
// (master_param, remainder, exp_avg, exp_avg_sq) must also have the elements its shard's range of
// its param has, before anything is decoded: a manifest resealed to agree with a bomb's table
// still disagrees with its own layout (the same check as check_shard_files, made early).
// Over the caller's decode budget only: a checkpoint for a larger model, refused by this load but
// not damaged (inspect, whose budget is the machine's memory, accepts it).
struct OverBudget : CheckpointError {
  using CheckpointError::CheckpointError;
};

void expect_tables(const JsonField& manifest, const std::string& manifest_path, std::vector<Want>& wants,
                   uint64_t budget) {
  std::map<std::string, Want*> by_name;
  for (Want& want : wants)
    if (want.compressed) by_name[want.name] = &want;
  std::map<std::pair<std::string, std::string>, int64_t> range_len;   // (file, param) -> end - begin
  manifest["shards"].each([&](const JsonField& shard) {
    const std::string file = shard["file"].str();
    shard["param_ranges"].each([&](const JsonField& range) {
      range_len.emplace(std::make_pair(file, range["param"].str()), range["end"].i64() - range["begin"].i64());
    });
  });
  uint64_t total = 0;
  manifest["tensors"].each([&](const JsonField& tensor) {
    auto it = by_name.find(tensor["file"].str());
    if (it == by_name.end()) return;
    TensorInfo ti;
    ti.key = tensor["key"].str();
    const std::string dtype_name = tensor["dtype"].str();
    if (!st_parse(dtype_name, &ti.dtype)) tensor["dtype"].fail("unknown dtype " + quote_text(dtype_name));
    int64_t numel = 1;
    tensor["shape"].each([&](const JsonField& dim) {
      ti.shape.push_back(dim.i64());
      if (__builtin_mul_overflow(numel, ti.shape.back(), &numel))
        tensor["shape"].fail("more elements than int64 holds");
    });
    ti.end = tensor["bytes"].u64();
    const std::string kind = tensor["kind"].str();
    if (kind == "master_param" || kind == "remainder" || kind == "exp_avg" || kind == "exp_avg_sq") {
      auto shard_range = range_len.find({tensor["file"].str(), tensor["param"].str()});
      if (shard_range != range_len.end() && shard_range->second != numel)
        tensor["shape"].fail(quote_json(tensor["shape"].raw()) + " is " + std::to_string(numel) +
                             " elements, but the shard range of '" + quote_text(tensor["param"].str()) + "' in " +
                             tensor["file"].str() + " has " + std::to_string(shard_range->second) +
                             " (its shard's range; refused before decoding)");
    }
    if (__builtin_add_overflow(total, ti.end, &total)) tensor["bytes"].fail("the tensors' bytes overflow");
    it->second->listed[ti.key] = ti;
  });
  const uint64_t machine_memory =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (total > machine_memory)
    fail(manifest_path, "the compressed files' tensors need " + std::to_string(total) +
                            " bytes decoded, more than this machine's memory (" + std::to_string(machine_memory) + ")");
  if (budget > 0 && total > budget)
    throw OverBudget("checkpoint file " + manifest_path + ": the compressed files' tensors need " +
                         std::to_string(total) + " bytes decoded, more than the " + std::to_string(budget) +
                         " bytes this load's model and optimizer state can hold; refused before decoding",
                     manifest_path);
}

// Every file, hashed concurrently (hashing is most of a load's CPU time); the first failure in
// list order wins. Files with block checksums are read one after another: each is already read
// and hashed on every core (SafetensorsFile::read_hashed), and a second level of threads only
// oversubscribed the cores, so a piece read into L2 was often evicted before it was hashed.
void open_all(const std::vector<Want>& wants, Verified& verified) {
  if (std::all_of(wants.begin(), wants.end(), [](const Want& want) { return want.block_bytes > 0; })) {
    for (const Want& want : wants) verified.files.emplace(want.name, open_verified(want));
    return;
  }
  std::vector<std::future<SafetensorsFile>> jobs;
  for (size_t i = 1; i < wants.size(); ++i) jobs.push_back(std::async(std::launch::async, open_verified, wants[i]));
  std::exception_ptr first;
  if (!wants.empty()) {
    try {
      verified.files.emplace(wants[0].name, open_verified(wants[0]));
    } catch (...) {
      first = std::current_exception();
    }
  }
  for (size_t i = 1; i < wants.size(); ++i) {
    try {
      verified.files.emplace(wants[i].name, jobs[i - 1].get());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);
}

// Manifest tensors <-> file tensors: same set, same dtype, shape and bytes.
void match_tensors(const JsonField& manifest, const Verified& verified) {
  std::map<std::string, std::set<std::string>> listed;
  manifest["tensors"].each([&](const JsonField& tensor) {
    const std::string file = tensor["file"].str();
    const std::string key = tensor["key"].str();
    auto it = verified.files.find(file);
    if (it == verified.files.end())
      tensor["file"].fail("tensor '" + quote_text(key) + "' refers to unlisted file '" + quote_text(file) + "'");
    const std::string path = it->second.path();
    if (!listed[file].insert(key).second)
      tensor["key"].fail("tensor '" + quote_text(key) + "' of " + file + " listed twice");
    const TensorInfo* ti = it->second.find(key);
    if (!ti) fail(path, "has no tensor '" + quote_text(key) + "' (listed in the manifest)", key);
    std::vector<int64_t> shape;
    tensor["shape"].each([&](const JsonField& dim) { shape.push_back(dim.i64()); });
    const uint64_t stored = tensor.has("stored_bytes") ? tensor["stored_bytes"].u64() : tensor["bytes"].u64();
    if (it->second.stored_bytes(key) != stored)
      fail(path,
           "tensor '" + key + "' takes " + std::to_string(it->second.stored_bytes(key)) +
               " bytes in the file, manifest says " + std::to_string(stored),
           key);
    if (st_name(ti->dtype) != tensor["dtype"].str() || ti->shape != shape ||
        ti->end - ti->begin != tensor["bytes"].u64())
      fail(path,
           "tensor '" + key + "' is " + st_name(ti->dtype) + " " + c10::str(c10::IntArrayRef(ti->shape)) +
               ", manifest says " + quote_text(tensor["dtype"].str()) + " " + quote_json(tensor["shape"].raw()),
           key);
  });
  for (const auto& [name, sf] : verified.files)
    for (const auto& ti : sf.tensors())
      if (!listed[name].count(ti.key)) fail(sf.path(), "tensor '" + ti.key + "' is not in the manifest", ti.key);
}

}   // namespace

Verified verify_checkpoint_dir(const std::string& dir, uint64_t decode_budget) try {
  Verified verified;
  verified.dir = dir;
  const std::string manifest_path = (fs::path(dir) / kManifestFile).string();
  if (!path_exists(manifest_path)) fail(manifest_path, "missing (an incomplete save; not a checkpoint)");
  // The manifest's own checksum (its sidecar) before parsing, then size cap, regular file,
  // bounded depth, and the schema of every field read below.
  verified.manifest = read_checked_manifest(dir, &verified.saved);
  const JsonField manifest(verified.manifest, "checkpoint file " + manifest_path);
  std::vector<Want> wants = listed_files(manifest, dir, manifest_path);
  expect_tables(manifest, manifest_path, wants, decode_budget);
  open_all(wants, verified);
  match_tensors(manifest, verified);
  return verified;
} catch (const OverBudget&) {
  throw;
} catch (CheckpointError& e) {
  e.damaged = true;   // the files, checksums, schema: what inspect refuses
  throw;
}

ShardIndex shard_index(const Verified& v) {
  const std::string manifest_path = (fs::path(v.dir) / kManifestFile).string();
  auto model_file = v.files.find(kModelFile);
  if (model_file == v.files.end()) fail(manifest_path, std::string("lists no ") + kModelFile);
  ShardIndex index;
  const JsonField manifest(v.manifest, "checkpoint file " + manifest_path);
  // Persistent buffers (manifest /model/buffers) live in the model file but have no optimizer state.
  std::set<std::string> buffers;
  if (manifest["model"].has("buffers"))
    manifest["model"]["buffers"].each([&](const JsonField& buffer) { buffers.insert(buffer.str()); });
  for (const auto& t : model_file->second.tensors())
    if (!buffers.count(t.key)) index.shape[t.key] = t.shape;
  manifest["shards"].each([&](const JsonField& shard) {
    const std::string file = shard["file"].str();
    if (!v.files.count(file)) shard["file"].fail("shard file '" + quote_text(file) + "' is not listed in 'files'");
    shard["param_ranges"].each([&](const JsonField& range) {
      const std::string param = range["param"].str();
      const int64_t begin = range["begin"].i64(0), end = range["end"].i64(0);
      if (!index.shape.count(param))
        range["param"].fail("shard " + file + " holds state of '" + quote_text(param) +
                            "', which the model does not have");
      index.pieces[param].push_back({file, begin, end});
    });
  });
  for (const auto& [param, shape] : index.shape) {
    int64_t numel = 1;
    for (int64_t dim : shape)
      if (__builtin_mul_overflow(numel, dim, &numel))
        fail(manifest_path, "parameter '" + param + "' has more elements than int64 holds");
    auto& pieces = index.pieces[param];
    std::sort(pieces.begin(), pieces.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const auto& piece : pieces) {
      if (piece.begin != at || piece.end <= piece.begin || piece.end > numel)
        fail(manifest_path, "the shards' ranges of '" + param + "' do not cover [0, " + std::to_string(numel) +
                                ") exactly once (" + piece.file + " holds [" + std::to_string(piece.begin) + ", " +
                                std::to_string(piece.end) + "), expected a range starting at " + std::to_string(at) +
                                ")");
      at = piece.end;
    }
    if (at != numel)
      fail(manifest_path, "the shards hold elements [0, " + std::to_string(at) + ") of '" + param + "', which has " +
                              std::to_string(numel));
  }
  return index;
}

torch::Tensor gather_state(const Verified& v, const ShardIndex& ix, const std::string& param, const std::string& key,
                           int64_t begin, int64_t end) {
  std::vector<torch::Tensor> parts;
  for (const auto& piece : ix.pieces.at(param)) {
    const int64_t overlap_begin = std::max(begin, piece.begin), overlap_end = std::min(end, piece.end);
    if (overlap_begin >= overlap_end) continue;
    const SafetensorsFile& file = v.files.at(piece.file);
    const TensorInfo* ti = file.find(key);
    if (!ti) fail(file.path(), "has no tensor '" + key + "' (its shard holds part of '" + param + "')");
    if (static_cast<int64_t>(ti->numel()) != piece.end - piece.begin)
      fail(file.path(), "tensor '" + key + "' has " + std::to_string(ti->numel()) + " elements, its range [" +
                            std::to_string(piece.begin) + ", " + std::to_string(piece.end) + ") of '" + param +
                            "' needs " + std::to_string(piece.end - piece.begin));
    parts.push_back(file.tensor(key).reshape({-1}).narrow(0, overlap_begin - piece.begin, overlap_end - overlap_begin));
  }
  if (parts.empty()) {
    // An empty range: a 0-element tensor of the stored dtype.
    const auto& piece = ix.pieces.at(param).front();
    const SafetensorsFile& file = v.files.at(piece.file);
    if (!file.find(key)) fail(file.path(), "has no tensor '" + key + "'");
    return file.tensor(key).reshape({-1}).narrow(0, 0, 0);
  }
  return parts.size() == 1 ? parts[0] : torch::cat(parts);
}

std::vector<std::pair<Piece, torch::Tensor>> piece_scales(const Verified& v, const ShardIndex& ix,
                                                          const std::string& param, const std::string& key) {
  std::vector<std::pair<Piece, torch::Tensor>> out;
  for (const auto& piece : ix.pieces.at(param)) {
    const SafetensorsFile& file = v.files.at(piece.file);
    out.emplace_back(piece, file.find(key) ? file.tensor(key) : torch::Tensor());
  }
  return out;
}

torch::Tensor gather_scale(const Verified& v, const ShardIndex& ix, const std::string& param, const std::string& key) {
  std::vector<torch::Tensor> found;
  bool same = true;
  for (const auto& [piece, scale] : piece_scales(v, ix, param, key)) {
    if (!scale.defined()) continue;
    if (scale.numel() != 1)
      fail(v.files.at(piece.file).path(),
           "tensor '" + key + "' has " + std::to_string(scale.numel()) + " elements, a scale has 1");
    if (!found.empty())
      same = same &&
             std::memcmp(scale.data_ptr(), found[0].data_ptr(), static_cast<size_t>(scale.element_size())) == 0 &&
             scale.scalar_type() == found[0].scalar_type();
    found.push_back(scale);
  }
  if (found.empty()) return torch::Tensor();
  if (same) return found[0];
  std::vector<torch::Tensor> flat;
  for (const auto& t : found) flat.push_back(t.reshape({1}));
  return torch::cat(flat);
}

nlohmann::json tensor_entry(const std::string& file, const std::string& key, const std::string& param,
                            const std::string& kind, const TensorInfo& info, const std::string& policy,
                            const std::string& conversion, bool exact) {
  return {{"file", file},
          {"key", key},
          {"param", param},
          {"kind", kind},
          {"dtype", st_name(info.dtype)},
          {"shape", info.shape},
          {"numel", info.numel()},
          {"bytes", info.end - info.begin},
          {"policy", policy},
          {"conversion", conversion},
          {"exact", exact}};
}

std::string finalize_disk_accounting(nlohmann::json& manifest, uint64_t num_model_params) {
  std::map<std::string, uint64_t> per_kind, per_dtype, per_file;
  uint64_t data_total = 0, headers = 0;
  for (const auto& f : manifest["files"]) {
    per_file[f["name"].get<std::string>()] = f["bytes"].get<uint64_t>();
    data_total += f["bytes"].get<uint64_t>();
    headers += f["header_bytes"].get<uint64_t>();
  }
  // On-disk bytes (a compressed tensor's stored bytes); raw_*: the same without compression.
  std::map<std::string, uint64_t> raw_kind;
  uint64_t raw_minus_stored = 0;
  for (const auto& t : manifest["tensors"]) {
    const uint64_t raw = t["bytes"].get<uint64_t>();
    const uint64_t stored = t.contains("stored_bytes") ? t["stored_bytes"].get<uint64_t>() : raw;
    per_kind[t["kind"].get<std::string>()] += stored;
    raw_kind[t["kind"].get<std::string>()] += raw;
    per_dtype[t["dtype"].get<std::string>()] += stored;
    raw_minus_stored += raw - stored;   // signed in effect: a block that grew is stored raw, never larger
  }
  const bool compressed =
      raw_minus_stored != 0 || std::any_of(manifest["files"].begin(), manifest["files"].end(),
                                           [](const nlohmann::json& f) { return f.contains("compress"); });
  // The manifest counts itself. Its length depends on the numbers in it (bytes_per_param's
  // digits can flip back and forth), so grow the assumed size until the text fits, then pad the
  // text with spaces (valid JSON whitespace) to exactly that size. `self` only grows: this ends.
  uint64_t self = 0;
  std::string text;
  for (int round = 0; round < 64; ++round) {
    auto kinds = per_kind;
    kinds["metadata"] = headers + self;
    auto files = per_file;
    files[kManifestFile] = self;
    const uint64_t total = data_total + self;
    manifest["disk"] = {{"total_bytes", total},
                        {"bytes_per_file", files},
                        {"bytes_per_key", kinds},
                        {"bytes_per_dtype", per_dtype},
                        {"num_params", num_model_params},
                        {"bytes_per_param", num_model_params ? double(total) / double(num_model_params) : 0.0}};
    if (compressed) {   // what the same tensors take uncompressed (headers and manifest as they are)
      auto raw_kinds = raw_kind;
      raw_kinds["metadata"] = headers + self;
      const uint64_t raw_total = total + raw_minus_stored;
      manifest["disk"]["raw_total_bytes"] = raw_total;
      manifest["disk"]["raw_bytes_per_key"] = raw_kinds;
      manifest["disk"]["raw_bytes_per_param"] = num_model_params ? double(raw_total) / double(num_model_params) : 0.0;
    }
    text = manifest.dump(1);
    if (text.size() + 1 <= self) return text + std::string(self - text.size() - 1, ' ') + "\n";
    self = text.size() + 1;
  }
  throw CheckpointError("manifest size did not settle (internal error)");
}

std::string disk_csv(const nlohmann::json& manifest) {
  std::ostringstream csv;
  // bytes: on disk (compressed when the file is); raw_bytes: the same data uncompressed.
  csv << "file,key,kind,dtype,numel,bytes,raw_bytes\n";
  for (const auto& tensor : manifest["tensors"]) {
    const uint64_t raw = tensor["bytes"].get<uint64_t>();
    csv << tensor["file"].get<std::string>() << ',' << tensor["key"].get<std::string>() << ','
        << tensor["kind"].get<std::string>() << ',' << tensor["dtype"].get<std::string>() << ','
        << tensor["numel"].get<uint64_t>() << ','
        << (tensor.contains("stored_bytes") ? tensor["stored_bytes"].get<uint64_t>() : raw) << ',' << raw << '\n';
  }
  for (const auto& file : manifest["files"])
    csv << file["name"].get<std::string>() << ",<header>,metadata,,0," << file["header_bytes"].get<uint64_t>() << ','
        << file["header_bytes"].get<uint64_t>() << '\n';
  const uint64_t manifest_bytes = manifest["disk"]["bytes_per_file"][kManifestFile].get<uint64_t>();
  csv << kManifestFile << ",<manifest>,metadata,,0," << manifest_bytes << ',' << manifest_bytes << '\n';
  return csv.str();
}

}   // namespace rh::ckpt::detail
