// Manifest and pointer reading with a schema check (see manifest_reader.h).
#include "harness/checkpoint/manifest_reader.h"

#include <sys/stat.h>
#include <xxhash.h>

#include <cctype>
#include <cstdio>
#include <filesystem>
#include <optional>
#include <set>
#include <vector>
#include <stdexcept>

#include "harness/checkpoint/errors.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/checkpoint/train_state.h"

namespace rh::ckpt::detail {

namespace {

void hex_string(const JsonField& f, size_t exact_len = 0) { (void)ckpt::parse_hex(f, exact_len); }

void u64_map(const JsonField& f) {
  f.each_member([](const std::string&, const JsonField& v) { (void)v.u64(); });
}

}   // namespace

uint64_t block_count(uint64_t bytes, uint64_t block_bytes) {
  return bytes / block_bytes + (bytes % block_bytes != 0 ? 1 : 0);
}

int64_t parse_pointer_text(const std::string& raw, const std::string& path) {
  std::string text = raw;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  auto refuse = [&] {
    throw CheckpointError(path + ": expected an iteration number in [0, " + std::to_string(kMaxCounter) + "], got '" +
                          quote_text(raw) + "'");
  };
  if (text.empty() || text.size() > 13) refuse();
  int64_t it = 0;
  for (char c : text) {
    if (c < '0' || c > '9') refuse();
    it = it * 10 + (c - '0');
  }
  if (it > kMaxCounter) refuse();
  return it;
}

int64_t read_pointer_file(const std::string& path) {
  return parse_pointer_text(read_regular_file(path, kMaxPointerBytes), path);
}

nlohmann::json parse_manifest_text(const std::string& text, const std::string& path, ManifestState* parsed) {
  // A key named twice in one object is refused (nlohmann keeps the last silently, Python's json
  // too: an edit appended after the original would win in both readers unseen).
  nlohmann::json j;
  try {
    j = parse_json_unique(text.data(), text.size(), "checkpoint file " + path);
  } catch (const std::invalid_argument& e) {
    throw CheckpointError(e.what(), path);
  }
  const JsonField m(j, "checkpoint file " + path);
  if (!j.is_object() || !j.contains("format") || !j["format"].is_string() ||
      j["format"].get<std::string>() != "resume-harness-checkpoint")
    throw CheckpointError("checkpoint file " + path + ": not a resume-harness-checkpoint manifest");
  const int64_t ver = m["format_version"].i64();
  if (ver != kManifestFormatVersion)
    m["format_version"].fail("format version " + std::to_string(ver) + ", this build reads version " +
                             std::to_string(kManifestFormatVersion));
  const int64_t iteration = m["iteration"].i64(0, kMaxCounter);
  if (m.has("dp_size")) (void)m["dp_size"].i64(1, 4096);
  // The run config the checkpoint was saved with: an object, or null when the caller gave none.
  // Its batch size is what the counters were counted in (check_counters).
  ManifestState state;
  if (const JsonField rc = m["run_config"]; !rc.raw().is_null() && !rc.raw().is_object())
    rc.fail("expected an object or null, got " + quote_json(rc.raw()));
  else if (rc.has("train") && rc["train"].has("global_batch"))
    state.saved_global_batch = rc["train"]["global_batch"].i64(1, kMaxCounter);
  (void)m["save_policy"]["kind"].str();
  if (m["save_policy"].has("compress")) {
    const std::string c = m["save_policy"]["compress"].str();
    if (c != "none" && c != "zstd") m["save_policy"]["compress"].fail("expected none or zstd, got " + quote_text(c));
  }

  m["files"].each([](const JsonField& f) {
    (void)f["name"].str();
    const uint64_t bytes = f["bytes"].u64();
    hex_string(f["xxh3"], 16);
    (void)f["header_bytes"].u64(bytes);
    if (f.has("block_xxh3") != f.has("block_bytes"))
      f.fail("block_xxh3 and block_bytes come together (one is missing)");
    if (f.has("block_xxh3")) {
      const uint64_t bb = f["block_bytes"].u64(kMaxBlockBytes);
      if (bb < kMinBlockBytes)
        f["block_bytes"].fail("expected at least " + std::to_string(kMinBlockBytes) + ", got " + std::to_string(bb));
      const uint64_t want = block_count(bytes, bb);
      if (f["block_xxh3"].size() != want)
        f["block_xxh3"].fail(std::to_string(f["block_xxh3"].size()) + " block checksums, a file of " +
                             std::to_string(bytes) + " bytes in blocks of " + std::to_string(bb) + " needs " +
                             std::to_string(want));
      f["block_xxh3"].each([](const JsonField& h) { hex_string(h, 16); });
      // A file of one block: its whole-file XXH3-64 is that block's, so the two must agree (free).
      // Larger files' whole-file hash is not recomputed: docs/checkpoint-format.md, R7.
      auto lower = [](std::string h) {
        for (char& c : h) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        return h;
      };
      if (want == 1 && lower(f["xxh3"].str()) != lower(f["block_xxh3"][size_t{0}].str()))
        f["xxh3"].fail(f["xxh3"].str() + ", but the file is one block whose XXH3-64 (block_xxh3/0) is " +
                       f["block_xxh3"][size_t{0}].str() + ": they are the same hash");
    }
    if (f.has("compress")) {
      if (f["compress"].str() != "zstd")
        f["compress"].fail("expected \"zstd\", got " + quote_json(f["compress"].raw()));
      hex_string(f["header_xxh3"], 16);
      (void)f["raw_bytes"].u64();
      (void)f["stored_bytes"].u64(bytes);
    }
  });
  m["tensors"].each([](const JsonField& t) {
    for (const char* k : {"file", "key", "param", "kind", "dtype", "policy", "conversion"}) (void)t[k].str();
    t["shape"].each([](const JsonField& d) { (void)d.i64(0, int64_t(1) << 40); });
    (void)t["numel"].u64();
    (void)t["bytes"].u64();
    if (t.has("stored_bytes")) (void)t["stored_bytes"].u64();
    (void)t["exact"].boolean();
  });
  m["shards"].each([](const JsonField& sh) {
    (void)sh["file"].str();
    sh["param_ranges"].each([](const JsonField& r) {
      (void)r["param"].str();
      const int64_t b = r["begin"].i64(0, int64_t(1) << 50);
      const int64_t e = r["end"].i64(0, int64_t(1) << 50);
      if (e < b) r.fail("end " + std::to_string(e) + " < begin " + std::to_string(b));
    });
  });
  const JsonField o = m["optimizer"];
  o["params"].each([](const JsonField& p) { (void)p["name"].str(); });
  o["groups"].each([&state](const JsonField& group) {
    (void)group["name"].str();
    state.group_steps.push_back(group["step"].i64(0, kMaxCounter));
  });
  state.train_state = ckpt::parse_train_state(m["train_state"], iteration, kMaxCounter);
  if (m.has("rank_states"))
    m["rank_states"].each([&state](const JsonField& r) {
      RankGenerators generators;
      generators.dp_rank = r["dp_rank"].i64(0, 4095);
      generators.rng_states = ckpt::parse_rng_states(r["rng_states"]);
      state.rank_states.push_back(std::move(generators));
    });
  const JsonField d = m["disk"];
  (void)d["total_bytes"].u64();
  u64_map(d["bytes_per_file"]);
  u64_map(d["bytes_per_key"]);
  u64_map(d["bytes_per_dtype"]);
  (void)d["num_params"].u64();
  (void)d["bytes_per_param"].number();
  if (d.has("raw_total_bytes")) {   // compressed checkpoints
    (void)d["raw_total_bytes"].u64();
    u64_map(d["raw_bytes_per_key"]);
    (void)d["raw_bytes_per_param"].number();
  }
  if (parsed) *parsed = std::move(state);
  return j;
}

nlohmann::json read_manifest_file(const std::string& path) {
  // Never through a symbolic link: nothing outside the checkpoint directory is read.
  return parse_manifest_text(read_regular_file(path, kMaxManifestBytes, /*no_follow=*/true), path);
}

std::string manifest_checksum_text(const std::string& manifest_text) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx\n",
                static_cast<unsigned long long>(XXH3_64bits(manifest_text.data(), manifest_text.size())));
  return buf;
}

void check_manifest_checksum(const std::string& manifest_text, const std::string& sidecar_text,
                             const std::string& manifest_path, const std::string& sidecar_path) {
  const std::string want = manifest_checksum_text(manifest_text);
  bool form = sidecar_text.size() == 17 && sidecar_text.back() == '\n';
  for (size_t i = 0; form && i < 16; ++i)
    form = (sidecar_text[i] >= '0' && sidecar_text[i] <= '9') || (sidecar_text[i] >= 'a' && sidecar_text[i] <= 'f');
  if (!form)
    throw CheckpointError("checkpoint file " + sidecar_path +
                              ": expected 16 lower-case hex digits and a newline (the "
                              "XXH3-64 of " +
                              manifest_path + "), got '" + quote_text(sidecar_text) + "'",
                          sidecar_path);
  if (sidecar_text != want)
    throw CheckpointError("checkpoint file " + manifest_path + ": XXH3-64 checksum " + want.substr(0, 16) +
                              " != " + sidecar_path + " " + sidecar_text.substr(0, 16) + " (the manifest is corrupted)",
                          manifest_path);
}

nlohmann::json read_checked_manifest(const std::string& dir, ManifestState* parsed) {
  const std::string mpath = (std::filesystem::path(dir) / "manifest.json").string();
  const std::string spath = (std::filesystem::path(dir) / kManifestChecksumFile).string();
  // Never through a symbolic link: nothing outside the checkpoint directory is read.
  const std::string text = read_regular_file(mpath, kMaxManifestBytes, /*no_follow=*/true);
  struct stat st;
  if (::lstat(spath.c_str(), &st) != 0)
    throw CheckpointError("checkpoint file " + spath +
                              ": missing: the manifest's checksum (checkpoints written "
                              "before it existed have none; they cannot be verified, save them again with this "
                              "version)",
                          spath);
  check_manifest_checksum(text, read_regular_file(spath, kMaxManifestChecksumBytes, /*no_follow=*/true), mpath, spath);
  return parse_manifest_text(text, mpath, parsed);
}

ResumingRun resuming_run(const nlohmann::json& run_config) {
  ResumingRun run;
  if (!run_config.is_object() || !run_config.contains("train") || !run_config["train"].is_object()) return run;
  const JsonField train = JsonField(run_config, "the run config")["train"];
  if (train.has("iterations")) run.iterations = train["iterations"].i64();
  if (train.has("global_batch")) run.global_batch = train["global_batch"].i64(1, kMaxCounter);
  return run;
}

void check_counters(const ManifestState& saved, const ResumingRun& run, const std::string& path) {
  // The message JsonField::fail gives for a manifest field (each value was read through it).
  auto fail = [&path](const std::string& field, const std::string& what) {
    throw CheckpointError("checkpoint file " + path + ": field " + field + ": " + what);
  };
  const TrainState& ts = saved.train_state;
  const int64_t iteration = ts.iteration;
  const int64_t consumed = ts.consumed_samples;
  const int64_t num_steps = ts.opt_param_scheduler.num_steps;
  if (run.iterations && iteration > *run.iterations)
    fail("/train_state/iteration", "iteration " + std::to_string(iteration) +
                                       " is beyond the run's length (train.iterations = " +
                                       std::to_string(*run.iterations) + "): nothing would be trained");
  // The batch size the checkpoint was written with (its own run config), else the current one.
  if (const std::optional<int64_t> batch = saved.saved_global_batch ? saved.saved_global_batch : run.global_batch) {
    const int64_t global_batch = *batch;
    int64_t expected = 0;
    if (__builtin_mul_overflow(iteration, global_batch, &expected) || expected > kMaxCounter)
      fail("/train_state/iteration",
           "iteration " + std::to_string(iteration) + " * global_batch " + std::to_string(global_batch) + " overflows");
    if (consumed != expected)
      fail("/train_state/consumed_samples", std::to_string(consumed) + " samples, but " + std::to_string(iteration) +
                                                " iterations of " + std::to_string(global_batch) + " samples consume " +
                                                std::to_string(expected));
    // The scheduler counts samples (training.py: increment = global batch per step).
    if (num_steps != expected)
      fail("/train_state/opt_param_scheduler/num_steps",
           std::to_string(num_steps) + " scheduler steps (samples) after " + std::to_string(iteration) +
               " iterations of " + std::to_string(global_batch) + " samples, expected " + std::to_string(expected));
  }
  // The scheduler counts samples, as consumed_samples does: equal even when no batch size is known.
  if (num_steps != consumed)
    fail("/train_state/opt_param_scheduler/num_steps",
         std::to_string(num_steps) + " scheduler steps (samples), but consumed_samples is " + std::to_string(consumed));
  for (size_t i = 0; i < saved.group_steps.size(); ++i) {
    const int64_t step = saved.group_steps[i];
    const std::string field = "/optimizer/groups/" + std::to_string(i) + "/step";
    if (step > iteration)
      fail(field,
           "step " + std::to_string(step) + " is more than the " + std::to_string(iteration) + " iterations run");
    // One optimizer step advances every group (a skipped step skips them all).
    if (step != saved.group_steps[0])
      fail(field,
           "step " + std::to_string(step) + " differs from group 0's step " + std::to_string(saved.group_steps[0]));
  }
}

}   // namespace rh::ckpt::detail
