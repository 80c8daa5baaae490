// Reading a checkpoint's manifest and pointer from disk without trusting them (LibTorch-free, so
// the fuzz targets build without it): size caps, regular files only, bounded JSON depth, and one
// schema check of every field the loader, `inspect` and the disk accounting read, each through
// the checked accessor (base/input.h, checked_io.h) that names the file, the JSON path and the expected type.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "harness/checkpoint/train_state.h"

namespace rh::ckpt::detail {

// What a manifest says besides its files and tensors, as parse_manifest_text parses it (each field
// type- and range-checked once there): what a load restores and what check_counters compares.
struct ManifestState {
  TrainState train_state;
  std::vector<RankGenerators> rank_states;     // the manifest's rank_states, in order (may be empty)
  std::vector<int64_t> group_steps;            // /optimizer/groups/<i>/step, in order
  std::optional<int64_t> saved_global_batch;   // /run_config/train/global_batch, where it is given
};

constexpr int kManifestFormatVersion = 3;
constexpr uint64_t kMaxManifestBytes = 64ull << 20;   // our manifests are ~100 KB per 1M params
constexpr uint64_t kMaxPointerBytes = 32;             // "<iteration>\n"
// Counters (iteration, consumed samples, steps) above this are refused: far beyond any run, and
// small enough that adding a batch or a step can never overflow int64.
constexpr int64_t kMaxCounter = int64_t(1) << 40;
// block_bytes of block checksums: at least 4 KiB, at most 1 TiB.
constexpr uint64_t kMinBlockBytes = 4096, kMaxBlockBytes = 1ull << 40;

// The iteration a pointer file's text names: decimal digits, optionally followed by "\n" (or
// spaces), in [0, kMaxCounter]. Throws CheckpointError naming path, quoting at most 200 chars.
int64_t parse_pointer_text(const std::string& text, const std::string& path);
int64_t read_pointer_file(const std::string& path);   // regular file, <= kMaxPointerBytes

// Parses manifest text (depth-bounded), then checks the schema: format name and version, and
// every field's presence, type and range (files, tensors, shards, optimizer groups and params,
// train_state with its counters and generator hex, rank_states, disk). Throws CheckpointError
// "<path>: field /json/path: expected ..., got ...".
// `parsed`, if given, receives what the loader and check_counters use of it (parsed once, here).
nlohmann::json parse_manifest_text(const std::string& text, const std::string& path, ManifestState* parsed = nullptr);
nlohmann::json read_manifest_file(const std::string& path);   // regular file, <= kMaxManifestBytes

// The manifest's own checksum: "<16 lower-case hex digits of XXH3-64>\n" of the
// manifest's bytes, in a sidecar beside it, written before the directory is published and checked
// before the manifest is parsed. Every other byte of a checkpoint has its checksum in the
// manifest; this covers the manifest itself (a step edited from 10 to 9, a digit of an RNG state).
// Checkpoints written before the sidecar existed have none and are refused, naming the file: a
// deleted sidecar must not make an edited manifest acceptable.
inline constexpr const char* kManifestChecksumFile = "manifest.json.xxh3";
constexpr uint64_t kMaxManifestChecksumBytes = 64;
std::string manifest_checksum_text(const std::string& manifest_text);
// Throws CheckpointError naming sidecar_path when sidecar_text is not manifest_checksum_text's
// form or names another checksum than the manifest's bytes have.
void check_manifest_checksum(const std::string& manifest_text, const std::string& sidecar_text,
                             const std::string& manifest_path, const std::string& sidecar_path);
// manifest.json and its sidecar in dir, both regular files read without following a link; the
// checksum checked, then the text parsed as parse_manifest_text does.
nlohmann::json read_checked_manifest(const std::string& dir, ManifestState* parsed = nullptr);

// The number of block checksums a file of `bytes` needs with blocks of block_bytes (> 0), without
// overflow: ceil(bytes / block_bytes).
uint64_t block_count(uint64_t bytes, uint64_t block_bytes);

// The run a checkpoint is loaded into, as far as its counters are concerned: its length and batch
// size (a run config's "train" section; inspect loads into no run and has neither).
struct ResumingRun {
  std::optional<int64_t> iterations;
  std::optional<int64_t> global_batch;
};
// run_config's train.iterations and train.global_batch, where it has them (null: neither).
ResumingRun resuming_run(const nlohmann::json& run_config);

// A manifest's counters (parsed by parse_manifest_text) checked against each other and the run
// they resume: the iteration within the run's length, consumed_samples equal to iteration x
// global_batch (the batch the checkpoint was saved with, else the run's), the scheduler's
// num_steps equal to consumed samples (also without a batch size: the scheduler counts samples),
// every group's step at most the iteration and equal to the other groups' (one optimizer step
// advances every group). Throws CheckpointError "checkpoint file <path>: field /json/path: ..."
// naming the manifest field.
void check_counters(const ManifestState& saved, const ResumingRun& run, const std::string& path);

}   // namespace rh::ckpt::detail
