// The comparisons of an external cell's runs (external_check.h) by what they logged: metric rows
// matched by iteration number (the printed text bit for bit, the parsed value for |diff|), and the
// probe's records (python/rhckpt/probe.py: metrics as hex floats and a hash of every tensor and
// RNG state, per iteration and right after load), read from probe.jsonl.
#pragma once
#include <cstdint>
#include <filesystem>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "harness/verify/check_result.h"
#include "harness/verify/external_metrics.h"

namespace rh::external {

// ---- the probe's records ----

struct ProbeRecord {
  std::string event;   // "after_load" | "step" | "before_step" (probe = "auto": the state a step starts from)
  int64_t iteration = 0;
  std::vector<std::pair<std::string, std::string>> metrics, state;
};

// A run's probe.jsonl (none when the file is absent); throws std::invalid_argument naming the file
// and line of a malformed record.
std::vector<ProbeRecord> read_probe(const std::filesystem::path& file);

// The "step" record of an iteration, or nullptr.
const ProbeRecord* probe_step(const std::vector<ProbeRecord>& records, int64_t iteration);

// The first key of `got` (in its order) whose text differs from `ref`'s, or is missing there;
// then keys of `ref` that `got` lacks; "" when none. Keys starting with skip_prefix, and those in
// skip_keys, are ignored.
std::string first_differing(const std::vector<std::pair<std::string, std::string>>& ref,
                            const std::vector<std::pair<std::string, std::string>>& got,
                            const std::string& skip_prefix = "", const std::set<std::string>& skip_keys = {});

// The RNG streams (rng/<name>) whose hash is the same in every record of each run given (two
// records at least per run): a stream the trainer never draws from during the recorded steps
// (Python's `random` in a trainer that never seeds or uses it differs between processes and
// means nothing). Those are left out of the probe's verdict, with a note.
std::set<std::string> unused_streams(const std::vector<const std::vector<ProbeRecord>*>& runs);

// ---- comparisons ----

// The earliest difference found (by iteration), in words.
struct Difference {
  int64_t iteration = std::numeric_limits<int64_t>::max();
  std::string what;
  bool found() const { return !what.empty(); }
  void offer(int64_t it, const std::string& w) {
    if (it < iteration) iteration = it, what = w;
  }
};

// Every row of `got` with an iteration in [lo, hi] against `ref`'s row of the same number;
// differences go to diffs (when given). The difference names every metric that differs at the
// first differing iteration, then each other metric from its own first one ("iteration 11:
// metric lr (a vs b); loss from 12").
Difference compare_rows(const MetricLog& ref, const MetricLog& got, int64_t lo, int64_t hi, const std::string& got_name,
                        std::vector<MetricDiff>* diffs);

// The rows of `ref` in [lo, hi] that `got` does not log, folded into diff (the earliest wins).
void offer_missing(const MetricLog& ref, const MetricLog& got, int64_t lo, int64_t hi, const std::string& got_name,
                   Difference& diff);

// The probe's step records of `got` in [lo, hi] against `ref`'s: a record's state before its
// metrics (the batch or an RNG stream that differs is the cause of the loss that differs).
Difference compare_probe_steps(const std::vector<ProbeRecord>& ref, const std::vector<ProbeRecord>& got, int64_t lo,
                               int64_t hi, const std::set<std::string>& skip_keys = {});

}   // namespace rh::external
