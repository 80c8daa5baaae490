// Per-iteration metrics and their CSV form. Every floating value is written twice: readable
// (%.9g for fp32 values, %.17g for doubles) and as a C99 hex float that round-trips bit-exactly.
// Wall-clock figures (tokens/s) are not deterministic, so they go to a separate timing file and
// the metrics file of two runs of the same config is byte-identical.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace rh {

struct IterMetrics {
  int64_t iteration = 0;          // 1-based: the iteration just completed
  int64_t consumed_samples = 0;   // data position after the iteration
  float lm_loss = 0;              // mean over micro-batches
  float aux_loss = 0;             // MoE load-balancing (+ z) loss, mean over micro-batches
  float total_loss = 0;           // lm + aux
  double grad_norm = 0;           // global norm before clipping
  double lr = 0;                  // learning rate used by this iteration's step
  int64_t num_zeros = 0;          // zero elements in the main grads (after clipping)
  double seconds = 0;             // wall time of the iteration (timing file only)
  double tokens_per_s = 0;        // (timing file only)
};

// Names of the deterministic metrics, in CSV column order (each with a _hex twin for floats).
const std::vector<std::string>& metric_names();
// The value of metric `name` as a double (exact for every field).
double metric_value(const IterMetrics& metrics, const std::string& name);

void write_metrics_csv(const std::string& path, const std::vector<IterMetrics>& rows);
void write_timing_csv(const std::string& path, const std::vector<IterMetrics>& rows);
// Reads a metrics CSV written by write_metrics_csv, taking the hex columns (bit-exact). Throws
// std::runtime_error naming the file and line on malformed input.
std::vector<IterMetrics> read_metrics_csv(const std::string& path);

std::string hex_float(double v);       // "%a"
std::string exact_decimal(double v);   // "%.17g": round-trips a double

}   // namespace rh
