// `report --merge OUT_DIR SHARD_DIR...`: the run directories of the N shards of one matrix
// (`matrix --shard I/N`, shard.h) become one run directory whose summary.csv, summary.json and
// junit.xml are what one unsharded run writes (every field but the seconds), with every cell's
// directory copied in; the caller then writes the report there.
//
// The shards must form one matrix: each summary.json says it is shard I of N (all N the same,
// every I from 1 to N exactly once), they name the same scenario-file bytes (file_xxh3), the
// same --filter, the same tool (harness_version and git_commit), and their cells together are
// the matrix's cells (the list every shard records), none missing and none twice. Anything else
// is refused with MergeError (the tool exits 2) naming the shard directory and what differs.
#pragma once
#include <filesystem>
#include <ostream>
#include <stdexcept>
#include <vector>

namespace rh {

struct MergeError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

struct MergeResult {
  size_t cells = 0, failed = 0;
};

// Writes OUT_DIR/summary.csv, summary.json, junit.xml and OUT_DIR/scenarios/<cell>/ for every
// cell. OUT_DIR may be new or a previous merge's output; it must not be one of the shards.
MergeResult merge_shards(const std::filesystem::path& out_dir, const std::vector<std::filesystem::path>& shards,
                         std::ostream& log);

}   // namespace rh
