// An external trainer's checkpoints; see external_checkpoints.h.
#include "harness/verify/external_checkpoints.h"

#include <algorithm>
#include <limits>
#include <optional>
#include <set>
#include <stdexcept>

#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/errors.h"
#include "harness/process/bridge_client.h"
#include "harness/process/process.h"
#include "harness/verify/external_cell_dir.h"
#include "harness/verify/external_check.h"

namespace fs = std::filesystem;

namespace rh::external {

namespace {

// Regular files under a directory (relative path -> absolute), refusing symbolic links.
std::map<std::string, fs::path> files_under(const fs::path& dir) {
  std::map<std::string, fs::path> out;
  for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator(); ++it) {
    const auto st = it->symlink_status();
    if (fs::is_symlink(st)) throw ckpt::CheckpointError(it->path().string() + ": is a symbolic link; not followed");
    if (fs::is_regular_file(st)) out[fs::relative(it->path(), dir).string()] = it->path();
  }
  return out;
}

// True when the two paths hold the same bytes (the same file names under directories).
bool byte_identical(const fs::path& a, const fs::path& b) {
  if (fs::is_directory(a) != fs::is_directory(b)) return false;
  std::map<std::string, fs::path> fa, fb;
  if (fs::is_directory(a)) fa = files_under(a), fb = files_under(b);
  else fa[""] = a, fb[""] = b;
  if (fa.size() != fb.size()) return false;
  for (const auto& [k, p] : fa) {
    auto it = fb.find(k);
    if (it == fb.end()) return false;
    uint64_t sa = 0, sb = 0;
    if (fs::file_size(p) != fs::file_size(it->second)) return false;
    if (ckpt::xxh3_file_untrusted(p.string(), &sa) != ckpt::xxh3_file_untrusted(it->second.string(), &sb))
      return false;
  }
  return true;
}

bool torch_like(const fs::path& p) {
  static const char* exts[] = {".pt", ".pth", ".bin", ".ckpt", ".distcp", ".pkl"};
  const std::string e = p.extension().string();
  for (const char* x : exts)
    if (e == x) return true;
  return false;
}

void add_safetensors(Flat& f, const fs::path& file, const std::string& prefix) {
  // pread, never mmap: a file the trainer still changes is an error, not a SIGBUS.
  auto st = ckpt::SafetensorsFile::read_untrusted(file.string());
  if (st.compressed()) st = st.decoded();
  const bool bridged = st.metadata().count("rh_bridge") != 0;
  for (const auto& t : st.tensors()) f.tensors[prefix + t.key] = {t.dtype, st.tensor(t.key)};
  for (const auto& [k, v] : st.metadata()) {
    if (bridged && k.rfind("leaf:", 0) == 0) f.leaves[prefix + k.substr(5)] = v;
    else if (bridged && k.rfind("dtype:", 0) == 0) f.leaves[prefix + k.substr(6) + " (dtype)"] = v;
    else if (!bridged) f.leaves[prefix + "__metadata__/" + k] = v;
  }
  f.files.push_back(std::move(st));
}

// How the bridge is started: `python3 -I -c kBridgeLauncher PATHS ARGS...`. -I (isolated) keeps
// the current directory, the script directory and PYTHON* variables off sys.path, so a json.py
// where the tool was started is never imported; the launcher puts PATHS (colon-separated) first
// on sys.path and runs rhckpt.torch_bridge. Kept equal to torch_bridge.LAUNCHER (issue 41).
const char* const kBridgeLauncher =
    "import sys; sys.path[:0] = [p for p in sys.argv.pop(1).split(':') if p]; import runpy; "
    "runpy.run_module('rhckpt.torch_bridge', run_name='__main__', alter_sys=True)";

// One long-lived `torch_bridge --serve` per tool process, shared by every cell (and worker thread):
// importing torch costs about 1.5 s of CPU, a conversion of our example's checkpoint 0.05 s.
BridgeClient& torch_bridge() {
  static BridgeClient bridge("the torch bridge", [] {
    const std::string py = python_package_dir();
    if (py.empty())
      throw std::runtime_error("python/rhckpt not found (set RH_PYTHON_DIR to the repository's python/ directory)");
    return BridgeCommand{{python_interpreter(), "-I", "-c", kBridgeLauncher, py, "--serve"},
                         {{"OMP_NUM_THREADS", "1"}}};
  });
  return bridge;
}

}   // namespace

std::vector<Flat> CheckpointReader::read(const std::vector<fs::path>& paths, const std::string& label) {
  std::vector<Flat> out(paths.size());
  std::vector<std::pair<fs::path, fs::path>> bridged;   // input -> flat safetensors
  std::vector<size_t> bridged_index;
  for (size_t i = 0; i < paths.size(); ++i) {
    const fs::path& p = paths[i];
    const bool dir = fs::is_directory(fs::symlink_status(p));
    if (format_of(p, dir) == "torch") {
      bridged.emplace_back(p, scratch_ / (label + "_" + std::to_string(i) + ".safetensors"));
      bridged_index.push_back(i);
    } else if (!dir) {
      add_safetensors(out[i], p, "");
    } else {
      for (const auto& [rel, abs] : files_under(p)) {
        if (abs.extension() == ".safetensors") {
          add_safetensors(out[i], abs, rel + "/");
        } else {
          uint64_t size = 0;
          out[i].leaves[rel + " (file bytes)"] =
              ckpt::hex64(ckpt::xxh3_file_untrusted(abs.string(), &size)) + " " + std::to_string(size);
        }
      }
    }
  }
  if (!bridged.empty()) bridge(bridged, label);
  for (size_t k = 0; k < bridged.size(); ++k) add_safetensors(out[bridged_index[k]], bridged[k].second, "");
  return out;
}

std::string CheckpointReader::format_of(const fs::path& p, bool dir) const {
  if (t_.checkpoint.format != "auto") return t_.checkpoint.format;
  bool torch = !dir && p.extension() != ".safetensors";
  if (dir)
    for (const auto& [rel, abs] : files_under(p)) torch = torch || torch_like(abs);
  return torch ? "torch" : "safetensors";
}

void CheckpointReader::bridge(const std::vector<std::pair<fs::path, fs::path>>& io, const std::string& label) {
  external::cell_dir(cell(), scratch_.filename(), /*create=*/true);   // flat/, never through a link
  // The root the bridge walks beneath without following links: the directory above the cell
  // (scratch_ is <cell>/flat), so a link planted in place of the cell or `flat` is refused.
  const fs::path root = fs::absolute(scratch_).parent_path().parent_path();
  if (!t_.checkpoint.trust_pickle) {   // trusted pickles run code: in a process of their own
    // (no create_directories here: it would follow a planted link; the bridge makes `flat`)
    nlohmann::json paths = nlohmann::json::array();
    for (const auto& [in, out] : io)
      paths.push_back(fs::absolute(in).string()), paths.push_back(fs::absolute(out).string());
    const nlohmann::json request = {{"root", root.string()}, {"io", paths}};
    const std::string err = torch_bridge().request(request.dump(), 600);
    if (!err.empty()) throw ckpt::CheckpointError("cannot read torch checkpoint: " + ckpt::quote_text(err, 500));
    return;
  }
  const std::string py = python_package_dir();
  if (py.empty())
    throw std::runtime_error("cannot read torch checkpoint " + io.front().first.string() +
                             ": python/rhckpt not found (set RH_PYTHON_DIR to the repository's python/ directory)");
  external::cell_dir(cell(), scratch_.filename(), /*create=*/true);   // flat/, never through a link
  CapturedSpec c;
  // Isolated too; a trusted pickle's classes are imported from the tool's PYTHONPATH, never cwd.
  const char* pp = std::getenv("PYTHONPATH");
  c.argv = {python_interpreter(), "-I", "-c", kBridgeLauncher, py + (pp && *pp ? ":" + std::string(pp) : std::string()),
            "--trust-pickle", "--root", root.string()};
  for (const auto& [in, out] : io) {
    c.argv.push_back(fs::absolute(in).string());
    c.argv.push_back(fs::absolute(out).string());
  }
  c.env = {{"OMP_NUM_THREADS", "1"}};
  c.stdout_path = (scratch_ / (label + ".bridge.out")).string();
  c.stderr_path = (scratch_ / (label + ".bridge.err")).string();
  c.timeout_s = 600;
  const auto e = run_captured(c);
  if (!e.ok()) {
    std::string msg = tail_of_file(c.stderr_path, 600);
    while (!msg.empty() && (msg.back() == '\n' || msg.back() == '\r')) msg.pop_back();
    throw ckpt::CheckpointError("cannot read torch checkpoint: " +
                                (msg.empty() ? "the bridge " + e.describe() : ckpt::quote_text(msg, 500)));
  }
}

namespace {

// A non-tensor value's sort by the bridge's type prefix: numbers and bools are state.
const char* leaf_kind(const std::string& text) {
  const std::string type = text.substr(0, text.find(':'));
  const bool numeric = type == "int" || type == "float" || type == "bool" || type == "complex" ||
                       (type.rfind("numpy.", 0) == 0 && type != "numpy.str_" && type != "numpy.bytes_");
  return numeric ? "value" : "metadata";
}

std::string short_text(const std::string& text) { return text.size() > 60 ? text.substr(0, 60) + "..." : text; }

const std::string* ignore_reason(const ExternalTrainer& t, const std::string& key) {
  for (const auto& rule : t.checkpoint.ignore)
    if (key_glob_match(rule.key, key)) return &rule.reason;
  return nullptr;
}

}   // namespace

Comparison compare_checkpoints(CheckpointReader& reader, const fs::path& a, const fs::path& b, const RunSide* side_a,
                               const RunSide* side_b, const std::string& label,
                               const std::set<std::string>& run_varying) {
  for (const auto* p : {&a, &b}) external::refuse_links_to(reader.cell(), *p);   // a run directory swapped
  for (const auto* p : {&a, &b})
    if (!fs::exists(fs::symlink_status(*p)))
      throw std::runtime_error("checkpoint " + p->string() + " was not written (trainer.checkpoint.path)");
  Comparison out;
  // Files that differ in bytes with every key equal (a zip's record names, a pickle's memo order)
  // hold the same checkpoint; equal bytes need no reading.
  if (byte_identical(a, b)) return out;
  const auto flat = reader.read({a, b}, label);
  const Flat &fa = flat[0], &fb = flat[1];
  std::vector<TensorDiff> td = compare_tensor_maps(fa.tensors, fb.tensors);
  std::set<std::string> keys;
  for (const auto& [k, v] : fa.leaves) keys.insert(k);
  for (const auto& [k, v] : fb.leaves) keys.insert(k);
  std::map<std::string, std::string> described;   // leaf key -> "key (a vs b)"
  for (const auto& k : keys) {
    TensorDiff d;
    d.key = k;
    auto ia = fa.leaves.find(k), ib = fb.leaves.find(k);
    const bool in_a = ia != fa.leaves.end(), in_b = ib != fb.leaves.end();
    d.kind = run_varying.count(k) ? "metadata" : leaf_kind(in_a ? ia->second : ib->second);
    d.dtype_a = in_a ? "text" : "";
    d.dtype_b = in_b ? "text" : "";
    d.numel = 1;
    d.shape_equal = true;
    d.bit_equal_fraction = (in_a && in_b && ia->second == ib->second) ? 1.0 : 0.0;
    if (d.bit_equal_fraction < 1) {
      std::optional<std::string> as;
      if (in_a && in_b && side_a && side_b) as = harness_varied(k, ia->second, ib->second, *side_a, *side_b);
      if (as) {
        out.varied.emplace_back(k, *as);
        d.bit_equal_fraction = 1.0;   // compared as the placeholder it came from
      } else {
        d.max_abs_diff = std::numeric_limits<double>::infinity();
        if (in_a && in_b) described[k] = k + " (" + short_text(ia->second) + " vs " + short_text(ib->second) + ")";
      }
    }
    td.push_back(d);
  }
  std::sort(td.begin(), td.end(), [](const TensorDiff& x, const TensorDiff& y) { return x.key < y.key; });
  for (auto& d : td) {
    if (d.identical()) continue;
    if (const std::string* reason = ignore_reason(reader.trainer(), d.key)) {
      out.ignored.emplace_back(d.key, *reason);
      continue;
    }
    out.changed.push_back(d.key);
    const std::string what = d.dtype_a.empty()   ? d.key + " (missing in the first)"
                             : d.dtype_b.empty() ? d.key + " (missing in the second)"
                             : described.count(d.key) ? described[d.key]
                                                      : d.key;
    std::string& first = d.kind == "metadata" ? out.first_metadata : d.kind == "value" ? out.first_value : out.first_tensor;
    if (first.empty()) first = what;
  }
  out.diffs = std::move(td);
  return out;
}

std::vector<std::string> lossy_optimizer_state(const Flat& flat) {
  static const std::set<std::string> kStateNames = {"exp_avg",    "exp_avg_sq", "max_exp_avg_sq", "momentum_buffer",
                                                    "square_avg", "acc_delta",  "sum"};
  auto float_width = [](const std::string& dtype) -> int {
    if (dtype == "F64") return 64;
    if (dtype == "F32") return 32;
    if (dtype == "F16" || dtype == "BF16") return 16;
    if (dtype.rfind("F8", 0) == 0) return 8;
    return 0;
  };
  auto is_state = [](const std::string& key) {
    return key.find("/state/") != std::string::npos || key.rfind("state/", 0) == 0;
  };
  std::vector<std::string> out;
  for (const auto& [key, tensor] : flat.tensors) {
    const std::string last = key.substr(key.rfind('/') == std::string::npos ? 0 : key.rfind('/') + 1);
    const int width = float_width(ckpt::st_name(tensor.first));
    if (!kStateNames.count(last) || !is_state(key) || width == 0) continue;
    int narrowest_param = 0;
    std::string param_dtype;
    for (const auto& [other_key, other] : flat.tensors) {
      const int other_width = float_width(ckpt::st_name(other.first));
      if (is_state(other_key) || other_width == 0 || other.second.sizes() != tensor.second.sizes()) continue;
      if (narrowest_param == 0 || other_width < narrowest_param)
        narrowest_param = other_width, param_dtype = ckpt::st_name(other.first);
    }
    if (narrowest_param > width)
      out.push_back(key + " saved as " + ckpt::st_name(tensor.first) + ", the parameters of its shape as " + param_dtype);
  }
  return out;
}

}   // namespace rh::external
