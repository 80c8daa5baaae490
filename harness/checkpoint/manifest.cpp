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
std::vector<Want> listed_files(const JsonField& mf, const std::string& dir, const std::string& mpath) {
  std::vector<Want> wants;
  std::set<std::string> names;
  mf["files"].each([&](const JsonField& f) {
    const std::string name = f["name"].str();
    if (!is_plain_file_name(name))
      f["name"].fail("'" + quote_text(name) + "' is not a plain file name inside the checkpoint directory");
    if (!names.insert(name).second) f["name"].fail("file '" + name + "' listed twice");
    const std::string path = (fs::path(dir) / name).string();
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) fail(path, "missing (listed in " + mpath + ")");
    if (S_ISLNK(st.st_mode))
      fail(path, "is a symbolic link; refused (checkpoint files must be regular files inside " + dir + ")");
    Want w{name, path, f["xxh3"].str(), f["bytes"].u64(), 0, {}, false, 0, {}, {}};
    if (f.has("block_xxh3")) {   // the schema check bounded block_bytes and matched the count
      w.block_bytes = f["block_bytes"].u64();
      f["block_xxh3"].each([&](const JsonField& h) { w.block_hash.push_back(h.str()); });
    }
    if (f.has("compress")) {   // the schema check allowed "zstd" only, with header_xxh3
      w.compressed = true;
      w.header_bytes = f["header_bytes"].u64();
      w.header_hash = f["header_xxh3"].str();
    }
    wants.push_back(std::move(w));
  });
  return wants;
}

// A compressed file's table (rh_tensors) against the manifest's tensors of that file, before
// SafetensorsFile::decoded() allocates or decodes anything: each entry the table lists must be a
// tensor the manifest lists there, with its dtype, shape and raw bytes, so a load decodes at most
// what the manifest says (a table claiming two 3 GiB zero tensors in 6.4 MB would otherwise be
// decoded before the refusal). An entry decoded() refuses as malformed (raw_bytes not numel x itemsize, ...) is left
// to its message, which it gives before allocating anything.
void match_table(const Want& w, const SafetensorsFile& sf) {
  auto tt = sf.metadata().find("rh_tensors");
  if (tt == sf.metadata().end()) return;
  nlohmann::json j;
  try {
    j = parse_json_bounded(tt->second, w.path);
  } catch (const std::invalid_argument&) {
    return;
  }
  if (!j.is_object()) return;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const nlohmann::json& e = it.value();
    StDtype dt;
    if (!e.is_object() || !e.contains("dtype") || !e["dtype"].is_string() ||
        !st_parse(e["dtype"].get<std::string>(), &dt) || !e.contains("shape") || !e["shape"].is_array() ||
        !e.contains("raw_bytes") || !e["raw_bytes"].is_number_unsigned())
      return;
    std::vector<int64_t> shape;
    uint64_t numel = 1;
    for (const auto& d : e["shape"]) {
      if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t(1) << 40)) return;
      shape.push_back(d.get<int64_t>());
      if (__builtin_mul_overflow(numel, d.get<uint64_t>(), &numel)) return;
    }
    const uint64_t raw = e["raw_bytes"].get<uint64_t>();
    uint64_t need = 0;
    if (__builtin_mul_overflow(numel, static_cast<uint64_t>(st_itemsize(dt)), &need) || need != raw) return;
    auto want = w.listed.find(it.key());
    if (want == w.listed.end())
      fail(w.path, "tensor '" + quote_text(it.key()) + "' is not in the manifest (refused before decoding)", it.key());
    const TensorInfo& m = want->second;
    if (dt != m.dtype || shape != m.shape || raw != m.end)
      fail(w.path,
           "tensor '" + quote_text(it.key()) + "' is " + st_name(dt) + " " + nlohmann::json(shape).dump() + " (" +
               std::to_string(raw) + " bytes) in rh_tensors, manifest says " + st_name(m.dtype) + " " +
               nlohmann::json(m.shape).dump() + " (" + std::to_string(m.end) + " bytes); refused before decoding",
           it.key());
  }
}

// One file: size and checksum before the structure, so damage is reported as damage.
SafetensorsFile open_verified(const Want& w) {
  // A compressed file whose header is intact names the damaged block (tensor, block index).
  auto located = [&](const uint8_t* data, uint64_t size) -> std::string {
    if (!w.compressed || w.header_bytes > size || hex64(XXH3_64bits(data, w.header_bytes)) != w.header_hash) return "";
    const std::string loc = SafetensorsFile::locate_damaged_block(w.path, data, size);
    return loc.empty() ? "" : loc + " (file is corrupted; ";
  };
  auto check_size = [&](uint64_t size) {
    if (size != w.size)
      fail(w.path, "size " + std::to_string(size) + " bytes, manifest says " + std::to_string(w.size) +
                       (size < w.size ? " (truncated)" : ""));
    // Every byte is covered by exactly one block. The count was checked against the listed
    // size; the size equals it here: never skip both checks.
    const size_t nb = w.block_hash.size();
    if (w.block_bytes > 0 && (block_count(size, w.block_bytes) != nb || (size > 0 && nb == 0)))
      fail(w.path, std::to_string(nb) + " block checksums of " + std::to_string(w.block_bytes) +
                       " bytes do not cover its " + std::to_string(size) + " bytes");
  };
  auto check_blocks = [&](const uint8_t* data, uint64_t size, const std::vector<uint64_t>& got) {
    for (size_t b = 0; b < got.size(); ++b)
      if (hex64(got[b]) != w.block_hash[b]) {
        const std::string loc = located(data, size);
        fail(w.path, loc + "XXH3-64 checksum of bytes [" + std::to_string(b * w.block_bytes) + ", " +
                         std::to_string(std::min<uint64_t>((b + 1) * w.block_bytes, size)) + ") " + hex64(got[b]) +
                         " != manifest " + w.block_hash[b] + (loc.empty() ? " (file is corrupted)" : ")"));
      }
  };
  auto check = [&](const uint8_t* data, uint64_t size) {   // a file without block checksums
    check_size(size);
    const std::string got = hex64(XXH3_64bits(data, size));
    if (got != w.hash) {
      const std::string loc = located(data, size);
      fail(w.path,
           loc + "XXH3-64 checksum " + got + " != manifest " + w.hash + (loc.empty() ? " (file is corrupted)" : ")"));
    }
  };
  // Files with block checksums are read, hashed and copied in one pass into pooled memory
  // (size first, before anything is allocated): an uncompressed file's staging is what the state
  // then adopts (load_apply.cpp); a compressed file's stored bytes are decoded from it, which is
  // faster than decoding from a mapping (no page faults on the stored bytes; measured in
  // bench_compress). Files without block checksums are mapped and hashed whole.
  SafetensorsFile sf = w.block_bytes > 0
                           ? SafetensorsFile::read_hashed(
                                 w.path, w.block_bytes, [&](uint64_t size) { check_size(size); }, check_blocks)
                           : SafetensorsFile::open(w.path, check);
  if (sf.compressed() != w.compressed)
    fail(w.path, sf.compressed() ? "is compressed (rh_codec), but the manifest does not say so"
                                 : "the manifest says compressed, but the file names no codec (rh_codec)");
  if (!w.compressed) return sf;
  match_table(w, sf);
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

void expect_tables(const JsonField& mf, const std::string& mpath, std::vector<Want>& wants, uint64_t budget) {
  std::map<std::string, Want*> by_name;
  for (Want& w : wants)
    if (w.compressed) by_name[w.name] = &w;
  std::map<std::pair<std::string, std::string>, int64_t> range_len;   // (file, param) -> end - begin
  mf["shards"].each([&](const JsonField& sh) {
    const std::string file = sh["file"].str();
    sh["param_ranges"].each([&](const JsonField& r) {
      range_len.emplace(std::make_pair(file, r["param"].str()), r["end"].i64() - r["begin"].i64());
    });
  });
  uint64_t total = 0;
  mf["tensors"].each([&](const JsonField& t) {
    auto it = by_name.find(t["file"].str());
    if (it == by_name.end()) return;
    TensorInfo ti;
    ti.key = t["key"].str();
    const std::string dt = t["dtype"].str();
    if (!st_parse(dt, &ti.dtype)) t["dtype"].fail("unknown dtype " + quote_text(dt));
    int64_t numel = 1;
    t["shape"].each([&](const JsonField& d) {
      ti.shape.push_back(d.i64());
      if (__builtin_mul_overflow(numel, ti.shape.back(), &numel)) t["shape"].fail("more elements than int64 holds");
    });
    ti.end = t["bytes"].u64();
    const std::string kind = t["kind"].str();
    if (kind == "master_param" || kind == "remainder" || kind == "exp_avg" || kind == "exp_avg_sq") {
      auto r = range_len.find({t["file"].str(), t["param"].str()});
      if (r != range_len.end() && r->second != numel)
        t["shape"].fail(quote_json(t["shape"].raw()) + " is " + std::to_string(numel) +
                        " elements, but the shard range of '" + quote_text(t["param"].str()) + "' in " +
                        t["file"].str() + " has " + std::to_string(r->second) +
                        " (its shard's range; refused before decoding)");
    }
    if (__builtin_add_overflow(total, ti.end, &total)) t["bytes"].fail("the tensors' bytes overflow");
    it->second->listed[ti.key] = ti;
  });
  const uint64_t phys =
      static_cast<uint64_t>(::sysconf(_SC_PHYS_PAGES)) * static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  if (total > phys)
    fail(mpath, "the compressed files' tensors need " + std::to_string(total) +
                    " bytes decoded, more than this machine's memory (" + std::to_string(phys) + ")");
  if (budget > 0 && total > budget)
    throw OverBudget("checkpoint file " + mpath + ": the compressed files' tensors need " + std::to_string(total) +
                         " bytes decoded, more than the " + std::to_string(budget) +
                         " bytes this load's model and optimizer state can hold; refused before decoding",
                     mpath);
}

// Every file, hashed concurrently (hashing is most of a load's CPU time); the first failure in
// list order wins. Files with block checksums are read one after another: each is already read
// and hashed on every core (SafetensorsFile::read_hashed), and a second level of threads only
// oversubscribed the cores, so a piece read into L2 was often evicted before it was hashed.
void open_all(const std::vector<Want>& wants, Verified& v) {
  if (std::all_of(wants.begin(), wants.end(), [](const Want& w) { return w.block_bytes > 0; })) {
    for (const Want& w : wants) v.files.emplace(w.name, open_verified(w));
    return;
  }
  std::vector<std::future<SafetensorsFile>> jobs;
  for (size_t i = 1; i < wants.size(); ++i) jobs.push_back(std::async(std::launch::async, open_verified, wants[i]));
  std::exception_ptr first;
  if (!wants.empty()) {
    try {
      v.files.emplace(wants[0].name, open_verified(wants[0]));
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
}

// Manifest tensors <-> file tensors: same set, same dtype, shape and bytes.
void match_tensors(const JsonField& mf, const Verified& v) {
  std::map<std::string, std::set<std::string>> listed;
  mf["tensors"].each([&](const JsonField& t) {
    const std::string file = t["file"].str();
    const std::string key = t["key"].str();
    auto it = v.files.find(file);
    if (it == v.files.end())
      t["file"].fail("tensor '" + quote_text(key) + "' refers to unlisted file '" + quote_text(file) + "'");
    const std::string path = it->second.path();
    if (!listed[file].insert(key).second)
      t["key"].fail("tensor '" + quote_text(key) + "' of " + file + " listed twice");
    const TensorInfo* ti = it->second.find(key);
    if (!ti) fail(path, "has no tensor '" + quote_text(key) + "' (listed in the manifest)", key);
    std::vector<int64_t> shape;
    t["shape"].each([&](const JsonField& d) { shape.push_back(d.i64()); });
    const uint64_t stored = t.has("stored_bytes") ? t["stored_bytes"].u64() : t["bytes"].u64();
    if (it->second.stored_bytes(key) != stored)
      fail(path,
           "tensor '" + key + "' takes " + std::to_string(it->second.stored_bytes(key)) +
               " bytes in the file, manifest says " + std::to_string(stored),
           key);
    if (st_name(ti->dtype) != t["dtype"].str() || ti->shape != shape || ti->end - ti->begin != t["bytes"].u64())
      fail(path,
           "tensor '" + key + "' is " + st_name(ti->dtype) + " " + c10::str(c10::IntArrayRef(ti->shape)) +
               ", manifest says " + quote_text(t["dtype"].str()) + " " + quote_json(t["shape"].raw()),
           key);
  });
  for (const auto& [name, sf] : v.files)
    for (const auto& ti : sf.tensors())
      if (!listed[name].count(ti.key)) fail(sf.path(), "tensor '" + ti.key + "' is not in the manifest", ti.key);
}

}   // namespace

Verified verify_checkpoint_dir(const std::string& dir, uint64_t decode_budget) try {
  Verified v;
  v.dir = dir;
  const std::string mpath = (fs::path(dir) / kManifestFile).string();
  if (!path_exists(mpath)) fail(mpath, "missing (an incomplete save; not a checkpoint)");
  // The manifest's own checksum (its sidecar) before parsing, then size cap, regular file,
  // bounded depth, and the schema of every field read below.
  v.manifest = read_checked_manifest(dir, &v.saved);
  const JsonField mf(v.manifest, "checkpoint file " + mpath);
  std::vector<Want> wants = listed_files(mf, dir, mpath);
  expect_tables(mf, mpath, wants, decode_budget);
  open_all(wants, v);
  match_tensors(mf, v);
  return v;
} catch (const OverBudget&) {
  throw;
} catch (CheckpointError& e) {
  e.damaged = true;   // the files, checksums, schema: what inspect refuses
  throw;
}

ShardIndex shard_index(const Verified& v) {
  const std::string mpath = (fs::path(v.dir) / kManifestFile).string();
  auto mit = v.files.find(kModelFile);
  if (mit == v.files.end()) fail(mpath, std::string("lists no ") + kModelFile);
  ShardIndex ix;
  const JsonField m(v.manifest, "checkpoint file " + mpath);
  // Persistent buffers (manifest /model/buffers) live in the model file but have no optimizer state.
  std::set<std::string> buffers;
  if (m["model"].has("buffers")) m["model"]["buffers"].each([&](const JsonField& b) { buffers.insert(b.str()); });
  for (const auto& t : mit->second.tensors())
    if (!buffers.count(t.key)) ix.shape[t.key] = t.shape;
  m["shards"].each([&](const JsonField& sh) {
    const std::string file = sh["file"].str();
    if (!v.files.count(file)) sh["file"].fail("shard file '" + quote_text(file) + "' is not listed in 'files'");
    sh["param_ranges"].each([&](const JsonField& r) {
      const std::string p = r["param"].str();
      const int64_t b = r["begin"].i64(0), e = r["end"].i64(0);
      if (!ix.shape.count(p))
        r["param"].fail("shard " + file + " holds state of '" + quote_text(p) + "', which the model does not have");
      ix.pieces[p].push_back({file, b, e});
    });
  });
  for (const auto& [p, shape] : ix.shape) {
    int64_t n = 1;
    for (int64_t d : shape)
      if (__builtin_mul_overflow(n, d, &n)) fail(mpath, "parameter '" + p + "' has more elements than int64 holds");
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
      fail(mpath,
           "the shards hold elements [0, " + std::to_string(at) + ") of '" + p + "', which has " + std::to_string(n));
  }
  return ix;
}

torch::Tensor gather_state(const Verified& v, const ShardIndex& ix, const std::string& param, const std::string& key,
                           int64_t begin, int64_t end) {
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

std::vector<std::pair<Piece, torch::Tensor>> piece_scales(const Verified& v, const ShardIndex& ix,
                                                          const std::string& param, const std::string& key) {
  std::vector<std::pair<Piece, torch::Tensor>> out;
  for (const auto& pc : ix.pieces.at(param)) {
    const SafetensorsFile& f = v.files.at(pc.file);
    out.emplace_back(pc, f.find(key) ? f.tensor(key) : torch::Tensor());
  }
  return out;
}

torch::Tensor gather_scale(const Verified& v, const ShardIndex& ix, const std::string& param, const std::string& key) {
  std::vector<torch::Tensor> found;
  bool same = true;
  for (const auto& [pc, t] : piece_scales(v, ix, param, key)) {
    if (!t.defined()) continue;
    if (t.numel() != 1)
      fail(v.files.at(pc.file).path(),
           "tensor '" + key + "' has " + std::to_string(t.numel()) + " elements, a scale has 1");
    if (!found.empty())
      same = same && std::memcmp(t.data_ptr(), found[0].data_ptr(), static_cast<size_t>(t.element_size())) == 0 &&
             t.scalar_type() == found[0].scalar_type();
    found.push_back(t);
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

std::string finalize_disk_accounting(nlohmann::json& m, uint64_t num_model_params) {
  std::map<std::string, uint64_t> per_kind, per_dtype, per_file;
  uint64_t data_total = 0, headers = 0;
  for (const auto& f : m["files"]) {
    per_file[f["name"].get<std::string>()] = f["bytes"].get<uint64_t>();
    data_total += f["bytes"].get<uint64_t>();
    headers += f["header_bytes"].get<uint64_t>();
  }
  // On-disk bytes (a compressed tensor's stored bytes); raw_*: the same without compression.
  std::map<std::string, uint64_t> raw_kind;
  uint64_t raw_minus_stored = 0;
  for (const auto& t : m["tensors"]) {
    const uint64_t raw = t["bytes"].get<uint64_t>();
    const uint64_t stored = t.contains("stored_bytes") ? t["stored_bytes"].get<uint64_t>() : raw;
    per_kind[t["kind"].get<std::string>()] += stored;
    raw_kind[t["kind"].get<std::string>()] += raw;
    per_dtype[t["dtype"].get<std::string>()] += stored;
    raw_minus_stored += raw - stored;   // signed in effect: a block that grew is stored raw, never larger
  }
  const bool compressed =
      raw_minus_stored != 0 ||
      std::any_of(m["files"].begin(), m["files"].end(), [](const nlohmann::json& f) { return f.contains("compress"); });
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
    if (compressed) {   // what the same tensors take uncompressed (headers and manifest as they are)
      auto rk = raw_kind;
      rk["metadata"] = headers + self;
      const uint64_t raw_total = total + raw_minus_stored;
      m["disk"]["raw_total_bytes"] = raw_total;
      m["disk"]["raw_bytes_per_key"] = rk;
      m["disk"]["raw_bytes_per_param"] = num_model_params ? double(raw_total) / double(num_model_params) : 0.0;
    }
    text = m.dump(1);
    if (text.size() + 1 <= self) return text + std::string(self - text.size() - 1, ' ') + "\n";
    self = text.size() + 1;
  }
  throw CheckpointError("manifest size did not settle (internal error)");
}

std::string disk_csv(const nlohmann::json& m) {
  std::ostringstream o;
  // bytes: on disk (compressed when the file is); raw_bytes: the same data uncompressed.
  o << "file,key,kind,dtype,numel,bytes,raw_bytes\n";
  for (const auto& t : m["tensors"]) {
    const uint64_t raw = t["bytes"].get<uint64_t>();
    o << t["file"].get<std::string>() << ',' << t["key"].get<std::string>() << ',' << t["kind"].get<std::string>()
      << ',' << t["dtype"].get<std::string>() << ',' << t["numel"].get<uint64_t>() << ','
      << (t.contains("stored_bytes") ? t["stored_bytes"].get<uint64_t>() : raw) << ',' << raw << '\n';
  }
  for (const auto& f : m["files"])
    o << f["name"].get<std::string>() << ",<header>,metadata,,0," << f["header_bytes"].get<uint64_t>() << ','
      << f["header_bytes"].get<uint64_t>() << '\n';
  const uint64_t mb = m["disk"]["bytes_per_file"][kManifestFile].get<uint64_t>();
  o << kManifestFile << ",<manifest>,metadata,,0," << mb << ',' << mb << '\n';
  return o.str();
}

}   // namespace rh::ckpt::detail
