// Checkpoint directory resolution, whole-checkpoint verification and disk accounting (see
// manifest.h for the layout).
#include "harness/checkpoint/manifest.h"

#include <xxhash.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <future>
#include <iomanip>
#include <ostream>
#include <set>
#include <sstream>
#include <thread>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/fsutil.h"

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

std::string resolve_checkpoint_dir(const std::string& root_or_dir) {
  const fs::path p(root_or_dir);
  if (path_exists((p / kManifestFile).string())) return p.string();
  const fs::path ptr = p / kPointerFile;
  if (!path_exists(ptr.string())) {
    if (path_exists(p.string()) && p.filename().string().rfind("iter_", 0) == 0)
      throw CheckpointError("checkpoint " + p.string() + ": no " + kManifestFile +
                            " (an incomplete save; not a checkpoint)");
    throw CheckpointError(p.string() + ": neither a checkpoint directory (no " + kManifestFile +
                          ") nor a checkpoint root (no " + kPointerFile + ")");
  }
  std::string text = read_small_file(ptr.string());
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  int64_t it = -1;
  try {
    size_t used = 0;
    it = std::stoll(text, &used);
    if (used != text.size() || it < 0) it = -1;
  } catch (const std::exception&) {
    it = -1;
  }
  if (it < 0) throw CheckpointError(ptr.string() + ": expected an iteration number, got '" + text + "'");
  const std::string name = iter_dir_name(it);
  const fs::path dir = p / name;
  if (path_exists((dir / kManifestFile).string())) return dir.string();
  // Without RENAME_EXCHANGE a re-save of the same iteration moves the old directory aside
  // (.old.<name>.<pid>) before renaming the new one in; a crash between the two renames leaves
  // the complete old checkpoint there.
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(p, ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind(".old." + name + ".", 0) == 0 && path_exists((e.path() / kManifestFile).string()))
      return e.path().string();
  }
  throw CheckpointError(ptr.string() + " names iteration " + std::to_string(it) + " but " +
                        dir.string() + " has no " + kManifestFile);
}

namespace {

[[noreturn]] void fail(const std::string& file, const std::string& what) {
  throw CheckpointError("checkpoint file " + file + ": " + what);
}

const nlohmann::json& need(const nlohmann::json& j, const char* key, const std::string& file) {
  if (!j.is_object() || !j.contains(key)) fail(file, std::string("missing field '") + key + "'");
  return j[key];
}

}  // namespace

Verified verify_checkpoint_dir(const std::string& dir) {
  Verified v;
  v.dir = dir;
  const std::string mpath = (fs::path(dir) / kManifestFile).string();
  if (!path_exists(mpath)) fail(mpath, "missing (an incomplete save; not a checkpoint)");
  try {
    v.manifest = nlohmann::json::parse(read_small_file(mpath));
  } catch (const nlohmann::json::exception& e) {
    fail(mpath, std::string("not valid JSON: ") + e.what());
  }
  const nlohmann::json& m = v.manifest;
  if (!m.is_object() || m.value("format", std::string()) != kFormatName)
    fail(mpath, std::string("not a ") + kFormatName + " manifest");
  const auto& ver = need(m, "format_version", mpath);
  if (!ver.is_number_integer() || ver.get<int>() != kFormatVersion)
    fail(mpath, "format version " + ver.dump() + ", this build reads version " +
                    std::to_string(kFormatVersion));

  // Files: plain names only, so nothing outside the directory can be read through a manifest.
  struct Want {
    std::string name, path, hash;
    uint64_t size;
    uint64_t block_bytes = 0;            // > 0: verify block_hash (in parallel) instead of hash
    std::vector<std::string> block_hash;
  };
  std::vector<Want> wants;
  std::set<std::string> names;
  for (const auto& f : need(m, "files", mpath)) {
    const std::string name = need(f, "name", mpath).get<std::string>();
    if (!is_plain_file_name(name))
      fail(mpath, "file name '" + name + "' is not a plain file name inside the checkpoint directory");
    if (!names.insert(name).second) fail(mpath, "file '" + name + "' listed twice");
    const std::string path = (fs::path(dir) / name).string();
    if (!path_exists(path)) fail(path, "missing (listed in " + mpath + ")");
    Want w{name, path, need(f, "xxh3", mpath).get<std::string>(), need(f, "bytes", mpath).get<uint64_t>(), 0, {}};
    if (f.contains("block_xxh3")) {
      w.block_bytes = need(f, "block_bytes", mpath).get<uint64_t>();
      w.block_hash = f["block_xxh3"].get<std::vector<std::string>>();
      if (w.block_bytes == 0 || w.block_hash.size() != (w.size + w.block_bytes - 1) / w.block_bytes)
        fail(mpath, "file '" + name + "': " + std::to_string(w.block_hash.size()) + " block checksums of " +
                        std::to_string(w.block_bytes) + " bytes do not cover its " + std::to_string(w.size) + " bytes");
    }
    wants.push_back(std::move(w));
  }
  // Size and checksum before the structure, so damage is reported as damage. Files are hashed
  // concurrently (hashing is most of a load's CPU time); the first failure in list order wins.
  auto open_one = [](const Want& w) {
    auto check = [&](const uint8_t* data, uint64_t size) {
      if (size != w.size)
        fail(w.path, "size " + std::to_string(size) + " bytes, manifest says " + std::to_string(w.size) +
                         (size < w.size ? " (truncated)" : ""));
      if (w.block_bytes == 0) {
        const std::string got = hex64(XXH3_64bits(data, size));
        if (got != w.hash) fail(w.path, "XXH3-64 checksum " + got + " != manifest " + w.hash + " (file is corrupted)");
        return;
      }
      // Every byte is covered by exactly one block; blocks are hashed on all cores.
      const size_t nb = w.block_hash.size();
      std::vector<std::string> bad(nb);
      auto worker = [&](size_t first, size_t step) {
        for (size_t b = first; b < nb; b += step) {
          const uint64_t off = b * w.block_bytes, len = std::min<uint64_t>(w.block_bytes, size - off);
          const std::string got = hex64(XXH3_64bits(data + off, len));
          if (got != w.block_hash[b]) bad[b] = got;
        }
      };
      const size_t nt = std::max<size_t>(1, std::min<size_t>(nb, std::thread::hardware_concurrency()));
      std::vector<std::thread> pool;
      for (size_t t = 1; t < nt; ++t) pool.emplace_back(worker, t, nt);
      worker(0, nt);
      for (auto& t : pool) t.join();
      for (size_t b = 0; b < nb; ++b)
        if (!bad[b].empty())
          fail(w.path, "XXH3-64 checksum of bytes [" + std::to_string(b * w.block_bytes) + ", " +
                           std::to_string(std::min<uint64_t>((b + 1) * w.block_bytes, size)) + ") " + bad[b] +
                           " != manifest " + w.block_hash[b] + " (file is corrupted)");
    };
    return SafetensorsFile::open(w.path, check);
  };
  std::vector<std::future<SafetensorsFile>> jobs;
  for (size_t i = 1; i < wants.size(); ++i) jobs.push_back(std::async(std::launch::async, open_one, wants[i]));
  std::exception_ptr first;
  if (!wants.empty()) {
    try {
      v.files.emplace(wants[0].name, open_one(wants[0]));
    } catch (...) {
      first = std::current_exception();
    }
  }
  for (size_t i = 1; i < wants.size(); ++i) {
    try {
      v.files.emplace(wants[i].name, jobs[i - 1].get());
    } catch (...) {
      if (!first) first = std::current_exception();
    }
  }
  if (first) std::rethrow_exception(first);

  // Manifest tensors <-> file tensors: same set, same dtype, shape and bytes.
  std::map<std::string, std::set<std::string>> listed;
  for (const auto& t : need(m, "tensors", mpath)) {
    const std::string file = need(t, "file", mpath).get<std::string>();
    const std::string key = need(t, "key", mpath).get<std::string>();
    auto it = v.files.find(file);
    if (it == v.files.end()) fail(mpath, "tensor '" + key + "' refers to unlisted file '" + file + "'");
    const std::string path = it->second.path();
    if (!listed[file].insert(key).second) fail(mpath, "tensor '" + key + "' of " + file + " listed twice");
    const TensorInfo* ti = it->second.find(key);
    if (!ti) fail(path, "has no tensor '" + key + "' (listed in the manifest)");
    const auto shape = need(t, "shape", mpath).get<std::vector<int64_t>>();
    if (st_name(ti->dtype) != need(t, "dtype", mpath).get<std::string>() || ti->shape != shape ||
        ti->end - ti->begin != need(t, "bytes", mpath).get<uint64_t>())
      fail(path, "tensor '" + key + "' is " + st_name(ti->dtype) + " " + c10::str(c10::IntArrayRef(ti->shape)) +
                     ", manifest says " + t["dtype"].get<std::string>() + " " + t["shape"].dump());
  }
  for (const auto& [name, sf] : v.files)
    for (const auto& ti : sf.tensors())
      if (!listed[name].count(ti.key)) fail(sf.path(), "tensor '" + ti.key + "' is not in the manifest");
  return v;
}

ShardIndex shard_index(const Verified& v) {
  const std::string mpath = (fs::path(v.dir) / kManifestFile).string();
  auto mit = v.files.find(kModelFile);
  if (mit == v.files.end()) fail(mpath, std::string("lists no ") + kModelFile);
  ShardIndex ix;
  for (const auto& t : mit->second.tensors()) ix.shape[t.key] = t.shape;
  const nlohmann::json& shards = need(v.manifest, "shards", mpath);
  if (!shards.is_array()) fail(mpath, "'shards' is not a list");
  for (const auto& sh : shards) {
    const std::string file = need(sh, "file", mpath).get<std::string>();
    if (!v.files.count(file)) fail(mpath, "shard file '" + file + "' is not listed in 'files'");
    for (const auto& r : need(sh, "param_ranges", mpath)) {
      const std::string p = need(r, "param", mpath).get<std::string>();
      const int64_t b = need(r, "begin", mpath).get<int64_t>(), e = need(r, "end", mpath).get<int64_t>();
      if (!ix.shape.count(p)) fail(mpath, "shard " + file + " holds state of '" + p + "', which the model does not have");
      ix.pieces[p].push_back({file, b, e});
    }
  }
  for (const auto& [p, shape] : ix.shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    auto& pcs = ix.pieces[p];
    std::sort(pcs.begin(), pcs.end(), [](const Piece& a, const Piece& b) { return a.begin < b.begin; });
    int64_t at = 0;
    for (const auto& pc : pcs) {
      if (pc.begin != at || pc.end <= pc.begin || pc.end > n)
        fail(mpath, "the shards' ranges of '" + p + "' do not cover [0, " + std::to_string(n) + ") exactly once (" +
                        pc.file + " holds [" + std::to_string(pc.begin) + ", " + std::to_string(pc.end) +
                        "), expected a range starting at " + std::to_string(at) + ")");
      at = pc.end;
    }
    if (at != n)
      fail(mpath, "the shards hold elements [0, " + std::to_string(at) + ") of '" + p + "', which has " + std::to_string(n));
  }
  return ix;
}

torch::Tensor gather_state(const Verified& v, const ShardIndex& ix, const std::string& param,
                           const std::string& key, int64_t begin, int64_t end) {
  std::vector<torch::Tensor> parts;
  for (const auto& pc : ix.pieces.at(param)) {
    const int64_t s = std::max(begin, pc.begin), e = std::min(end, pc.end);
    if (s >= e) continue;
    const SafetensorsFile& f = v.files.at(pc.file);
    const TensorInfo* ti = f.find(key);
    if (!ti) fail(f.path(), "has no tensor '" + key + "' (its shard holds part of '" + param + "')");
    if (static_cast<int64_t>(ti->numel()) != pc.end - pc.begin)
      fail(f.path(), "tensor '" + key + "' has " + std::to_string(ti->numel()) + " elements, its range [" +
                         std::to_string(pc.begin) + ", " + std::to_string(pc.end) + ") of '" + param + "' needs " +
                         std::to_string(pc.end - pc.begin));
    parts.push_back(f.tensor(key).reshape({-1}).narrow(0, s - pc.begin, e - s));
  }
  if (parts.empty()) {
    // An empty range: a 0-element tensor of the stored dtype.
    const auto& pc = ix.pieces.at(param).front();
    const SafetensorsFile& f = v.files.at(pc.file);
    if (!f.find(key)) fail(f.path(), "has no tensor '" + key + "'");
    return f.tensor(key).reshape({-1}).narrow(0, 0, 0);
  }
  return parts.size() == 1 ? parts[0] : torch::cat(parts);
}

torch::Tensor gather_scale(const Verified& v, const ShardIndex& ix, const std::string& param, const std::string& key) {
  torch::Tensor first;
  std::string first_file;
  for (const auto& pc : ix.pieces.at(param)) {
    const SafetensorsFile& f = v.files.at(pc.file);
    if (!f.find(key)) continue;
    torch::Tensor t = f.tensor(key);
    if (!first.defined()) {
      first = t;
      first_file = f.path();
    } else if (t.numel() != first.numel() || std::memcmp(t.data_ptr(), first.data_ptr(), t.numel() * t.element_size()) != 0) {
      fail(f.path(), "tensor '" + key + "' differs from the one in " + first_file +
                         " (the shards of one moment must share its scale)");
    }
  }
  return first;
}

nlohmann::json tensor_entry(const std::string& file, const std::string& key, const std::string& param,
                            const std::string& kind, const TensorInfo& info, const std::string& policy,
                            const std::string& conversion, bool exact) {
  return {{"file", file},   {"key", key},         {"param", param},
          {"kind", kind},   {"dtype", st_name(info.dtype)}, {"shape", info.shape},
          {"numel", info.numel()}, {"bytes", info.end - info.begin}, {"policy", policy},
          {"conversion", conversion}, {"exact", exact}};
}

std::string finalize_disk_accounting(nlohmann::json& m, uint64_t num_model_params) {
  std::map<std::string, uint64_t> per_kind, per_dtype, per_file;
  uint64_t data_total = 0, headers = 0;
  for (const auto& f : m["files"]) {
    per_file[f["name"].get<std::string>()] = f["bytes"].get<uint64_t>();
    data_total += f["bytes"].get<uint64_t>();
    headers += f["header_bytes"].get<uint64_t>();
  }
  for (const auto& t : m["tensors"]) {
    per_kind[t["kind"].get<std::string>()] += t["bytes"].get<uint64_t>();
    per_dtype[t["dtype"].get<std::string>()] += t["bytes"].get<uint64_t>();
  }
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
    m["disk"] = {{"total_bytes", total},
                 {"bytes_per_file", files},
                 {"bytes_per_key", kinds},
                 {"bytes_per_dtype", per_dtype},
                 {"num_params", num_model_params},
                 {"bytes_per_param", num_model_params ? double(total) / double(num_model_params) : 0.0}};
    text = m.dump(1);
    if (text.size() + 1 <= self) return text + std::string(self - text.size() - 1, ' ') + "\n";
    self = text.size() + 1;
  }
  throw CheckpointError("manifest size did not settle (internal error)");
}

std::string disk_csv(const nlohmann::json& m) {
  std::ostringstream o;
  o << "file,key,kind,dtype,numel,bytes\n";
  for (const auto& t : m["tensors"])
    o << t["file"].get<std::string>() << ',' << t["key"].get<std::string>() << ','
      << t["kind"].get<std::string>() << ',' << t["dtype"].get<std::string>() << ','
      << t["numel"].get<uint64_t>() << ',' << t["bytes"].get<uint64_t>() << '\n';
  for (const auto& f : m["files"])
    o << f["name"].get<std::string>() << ",<header>,metadata,,0," << f["header_bytes"].get<uint64_t>() << '\n';
  o << kManifestFile << ",<manifest>,metadata,,0,"
    << m["disk"]["bytes_per_file"][kManifestFile].get<uint64_t>() << '\n';
  return o.str();
}

void print_tensor_table(const nlohmann::json& m, std::ostream& out) {
  out << std::left << std::setw(48) << "key" << std::setw(9) << "dtype" << std::setw(18) << "shape"
      << std::right << std::setw(12) << "bytes" << "  file\n";
  for (const auto& t : m["tensors"])
    out << std::left << std::setw(48) << t["key"].get<std::string>() << std::setw(9)
        << t["dtype"].get<std::string>() << std::setw(18) << t["shape"].dump() << std::right
        << std::setw(12) << t["bytes"].get<uint64_t>() << "  " << t["file"].get<std::string>() << '\n';
  const auto& d = m["disk"];
  auto section = [&](const char* title, const nlohmann::json& map) {
    out << title << ":\n";
    for (auto it = map.begin(); it != map.end(); ++it)
      out << "  " << std::left << std::setw(32) << it.key() << std::right << std::setw(14)
          << it.value().get<uint64_t>() << '\n';
  };
  section("bytes per key", d["bytes_per_key"]);
  section("bytes per dtype", d["bytes_per_dtype"]);
  section("bytes per file", d["bytes_per_file"]);
  out << "total " << d["total_bytes"].get<uint64_t>() << " bytes, " << d["num_params"].get<uint64_t>()
      << " parameters, " << std::fixed << std::setprecision(3) << d["bytes_per_param"].get<double>()
      << " bytes/parameter\n";
  out.unsetf(std::ios::fixed);
}

}  // namespace rh::ckpt::detail
