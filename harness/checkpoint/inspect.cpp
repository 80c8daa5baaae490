// inspect_checkpoint (the `inspect` command): every check load makes that needs no model or
// optimizer, then the manifest's tensor table with totals per key, dtype and file.
#include <filesystem>
#include <iomanip>
#include <map>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "harness/checkpoint/checkpoint.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/train_state.h"
#include "harness/base/version.h"

namespace rh::ckpt {

namespace fs = std::filesystem;

namespace {

// The manifest's tensor table and totals. Compressed checkpoints add the stored bytes and the
// ratio stored/raw per tensor and per key.
void print_tensor_table(const nlohmann::json& m, std::ostream& out) {
  bool compressed = false;
  for (const auto& t : m["tensors"]) compressed = compressed || t.contains("stored_bytes");
  out << std::left << std::setw(48) << "key" << std::setw(9) << "dtype" << std::setw(18) << "shape" << std::right
      << std::setw(12) << "bytes";
  if (compressed) out << std::setw(12) << "stored" << std::setw(8) << "ratio";
  out << "  file\n";
  std::map<std::string, std::pair<uint64_t, uint64_t>> per_key;   // kind -> raw, stored
  for (const auto& t : m["tensors"]) {
    const uint64_t raw = t["bytes"].get<uint64_t>();
    const uint64_t stored = t.contains("stored_bytes") ? t["stored_bytes"].get<uint64_t>() : raw;
    per_key[t["kind"].get<std::string>()].first += raw;
    per_key[t["kind"].get<std::string>()].second += stored;
    out << std::left << std::setw(48) << t["key"].get<std::string>() << std::setw(9) << t["dtype"].get<std::string>()
        << std::setw(18) << t["shape"].dump() << std::right << std::setw(12) << raw;
    if (compressed)
      out << std::setw(12) << stored << std::setw(8) << std::fixed << std::setprecision(3)
          << (raw ? double(stored) / double(raw) : 1.0) << std::defaultfloat;
    out << "  " << t["file"].get<std::string>() << '\n';
  }
  if (compressed) {
    out << "compression per key (raw -> stored bytes, ratio stored/raw):\n";
    for (const auto& [kind, bytes] : per_key)
      out << "  " << std::left << std::setw(32) << kind << std::right << std::setw(14) << bytes.first << std::setw(14)
          << bytes.second << std::setw(8) << std::fixed << std::setprecision(3)
          << (bytes.first ? double(bytes.second) / double(bytes.first) : 1.0) << std::defaultfloat << '\n';
  }
  const auto& disk = m["disk"];
  auto section = [&](const char* title, const nlohmann::json& map) {
    out << title << ":\n";
    for (auto it = map.begin(); it != map.end(); ++it)
      out << "  " << std::left << std::setw(32) << it.key() << std::right << std::setw(14) << it.value().get<uint64_t>()
          << '\n';
  };
  section("bytes per key", disk["bytes_per_key"]);
  section("bytes per dtype", disk["bytes_per_dtype"]);
  section("bytes per file", disk["bytes_per_file"]);
  out << "total " << disk["total_bytes"].get<uint64_t>() << " bytes, " << disk["num_params"].get<uint64_t>()
      << " parameters, " << std::fixed << std::setprecision(3) << disk["bytes_per_param"].get<double>()
      << " bytes/parameter\n";
  if (disk.contains("raw_total_bytes"))
    out << "uncompressed " << disk["raw_total_bytes"].get<uint64_t>() << " bytes, "
        << disk["raw_bytes_per_param"].get<double>() << " bytes/parameter\n";
  out.unsetf(std::ios::fixed);
}

// inspect -v: each verified file, and the training state the manifest carries (what a resume
// restores besides the tensors). The manifest passed verify_checkpoint_dir's schema check.
void print_files_and_state(const detail::Verified& v, std::ostream& out) {
  const nlohmann::json& m = v.manifest;
  out << "files (bytes, XXH3-64 of the whole file, checksummed blocks):\n";
  for (const auto& f : m["files"]) {
    out << "  " << std::left << std::setw(36) << printable_text(f["name"].get<std::string>()) << std::right
        << std::setw(14) << f["bytes"].get<uint64_t>() << "  " << f["xxh3"].get<std::string>();
    if (f.contains("block_xxh3"))
      out << "  " << f["block_xxh3"].size() << (f["block_xxh3"].size() == 1 ? " block" : " blocks") << " of "
          << f["block_bytes"].get<uint64_t>() << " bytes";
    if (f.contains("compress")) out << "  " << f["compress"].get<std::string>();
    out << '\n';
  }
  const TrainState& ts = v.saved.train_state;   // parsed once by the manifest reader, as a load uses it
  out << "training state: iteration " << ts.iteration << ", consumed samples " << ts.consumed_samples << '\n';
  const nlohmann::json sched = to_json(ts.opt_param_scheduler);
  out << "  scheduler:";
  for (auto it = sched.begin(); it != sched.end(); ++it)
    out << ' ' << it.key() << '=' << (it.value().is_string() ? it.value().get<std::string>() : it.value().dump());
  out << '\n';
  const auto generators = [&out](const std::string& who, const std::map<std::string, std::vector<uint8_t>>& rng) {
    out << "  generators" << who << ':';
    for (const auto& [name, bytes] : rng) out << ' ' << name << " (" << bytes.size() << " bytes)";
    out << '\n';
  };
  generators("", ts.rng_states);
  if (v.saved.rank_states.size() > 1)
    for (const auto& r : v.saved.rank_states)
      generators(" of data-parallel rank " + std::to_string(r.dp_rank), r.rng_states);
  if (m.contains("shards") && m["shards"].is_array()) {
    const int64_t dp = m.value("dp_size", int64_t(1));
    out << "data parallel: " << dp << (dp == 1 ? " rank" : " ranks") << ", optimizer shards:";
    for (const auto& sh : m["shards"])
      out << ' ' << printable_text(sh.value("file", std::string("?"))) << " (rank " << sh.value("dp_rank", -1) << ", "
          << (sh.contains("param_ranges") ? sh["param_ranges"].size() : 0) << " ranges)";
    out << '\n';
  }
}

// inspect --json: the same content as the listing, one object (docs/running.md, "inspect --json").
nlohmann::json listing_json(const std::string& checkpoint_dir, const detail::Verified& v) {
  const nlohmann::json& m = v.manifest;
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& t : m["tensors"]) {
    const uint64_t raw = t["bytes"].get<uint64_t>();
    tensors.push_back({{"key", printable_text(t["key"].get<std::string>())},
                       {"kind", t["kind"]},
                       {"dtype", t["dtype"]},
                       {"shape", t["shape"]},
                       {"bytes", raw},
                       {"stored_bytes", t.contains("stored_bytes") ? t["stored_bytes"].get<uint64_t>() : raw},
                       {"file", t["file"]}});
  }
  const auto& disk = m["disk"];
  const uint64_t total = disk["total_bytes"].get<uint64_t>();
  return {{"schema_version", 1},
          {"status", "ok"},
          {"exit_code", 0},
          {"checkpoint", printable_text(checkpoint_dir)},
          {"iteration", m.value("iteration", int64_t(-1))},
          {"save_policy", m["save_policy"].value("kind", std::string("?"))},
          {"compress", m["save_policy"].value("compress", std::string("none"))},
          {"harness_version", m.value("harness_version", std::string("?"))},
          {"files_verified", v.files.size()},
          {"tensors", tensors},
          {"bytes_per_key", disk["bytes_per_key"]},
          {"bytes_per_dtype", disk["bytes_per_dtype"]},
          {"bytes_per_file", disk["bytes_per_file"]},
          {"total_bytes", total},
          {"raw_total_bytes", disk.contains("raw_total_bytes") ? disk["raw_total_bytes"].get<uint64_t>() : total},
          {"num_params", disk["num_params"]},
          {"bytes_per_param", disk["bytes_per_param"]},
          {"raw_bytes_per_param",
           disk.contains("raw_bytes_per_param") ? disk["raw_bytes_per_param"] : disk["bytes_per_param"]}};
}

// A refusal as JSON: status "damaged" (1) or "bad_input" (2), the message, the file and tensor where known.
int refusal_json(std::ostream& out, const std::string& dir, int code, const std::string& message,
                 const std::string& file = "", const std::string& tensor = "") {
  nlohmann::json j = {{"schema_version", 1},
                      {"status", code == 1 ? "damaged" : "bad_input"},
                      {"exit_code", code},
                      {"checkpoint", printable_text(dir)},
                      {"error", printable_text(message)}};
  if (!file.empty()) j["file"] = printable_text(file);
  if (!tensor.empty()) j["tensor"] = printable_text(tensor);
  out << dump_text(j, 2) << "\n";
  return code;
}

}   // namespace

int inspect_checkpoint(const std::string& dir, std::ostream& out, bool json, bool verbose) {
  // A path that is not there, or names no checkpoint at all, is bad input (2), not a damaged
  // checkpoint (1): an iter_ directory without its manifest or a dangling pointer is damage.
  std::error_code ec;
  const fs::path path(dir);
  const bool is_dir = fs::is_directory(path, ec);
  if (!is_dir || (!fs::exists(path / detail::kManifestFile, ec) && !fs::exists(path / detail::kPointerFile, ec) &&
                  path.filename().string().rfind("iter_", 0) != 0)) {
    const std::string why = !fs::exists(path, ec) ? "no such file or directory"
                            : !is_dir             ? "not a directory"
                                      : std::string("neither a checkpoint directory (no ") + detail::kManifestFile +
                                            ") nor a checkpoint root (no " + detail::kPointerFile + ")";
    if (json) return refusal_json(out, dir, 2, printable_text(dir) + ": " + why);
    out << kErrorPrefix << printable_text(dir) << ": " << why << "\n";
    return 2;
  }
  try {
    const std::string checkpoint_dir = detail::resolve_checkpoint_dir(dir);
    detail::Verified v = detail::verify_checkpoint_dir(checkpoint_dir);   // files, checksums, schema: as load
    (void)detail::check_consistency(v, nullptr);                          // counters, generators, shards: as load
    if (json) {
      out << dump_text(listing_json(checkpoint_dir, v), 2) << "\n";
      return 0;
    }
    out << "checkpoint " << printable_text(checkpoint_dir) << " (iteration "
        << v.manifest.value("iteration", int64_t(-1)) << ", policy "
        << v.manifest["save_policy"].value("kind", std::string("?")) << ", compress "
        << v.manifest["save_policy"].value("compress", std::string("none")) << ", harness "
        << v.manifest.value("harness_version", std::string("?")) << ")\n";
    print_tensor_table(v.manifest, out);
    if (verbose) print_files_and_state(v, out);
    out << "OK: " << v.files.size() << " files verified (size, XXH3-64, safetensors structure"
        << (v.manifest["save_policy"].value("compress", std::string("none")) != "none"
                ? "; every compressed block's XXH3-64, stored and decoded)\n"
                : ")\n");
    return 0;
  } catch (const std::exception& e) {
    if (json) {
      const auto* ce = dynamic_cast<const CheckpointError*>(&e);
      return refusal_json(out, dir, 1, e.what(), ce ? ce->file : "", ce ? ce->tensor : "");
    }
    out << "DAMAGED: " << printable_text(e.what()) << "\n";   // a path that is not UTF-8 as \xNN
    return 1;
  }
}

}   // namespace rh::ckpt
