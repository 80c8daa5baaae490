// Extrapolation of measured checkpoint sizes to real models: bytes = measured bytes per parameter
// (model + optimizer tensors, fixed metadata excluded, since headers and the manifest do not grow
// with the parameter count) x the model's parameter count. Models come from a TOML file
// (reports/models.toml) so users add their own; a model may list published checkpoint sizes,
// which the table shows beside the projection with the difference in percentage points.
#pragma once
#include <string>
#include <vector>

#include "reports/tables.h"

namespace rh::report {

struct PublishedSize {
  std::string states;   // dtype of exp_avg and exp_avg_sq in that checkpoint: fp32 | bf16 | fp16
  double gb = 0;        // published size in GB (1e9 bytes)
  std::string source;
};

struct ModelSize {
  std::string name;
  double params = 0;   // parameter count, e.g. 15.7e9
  std::vector<PublishedSize> published;
};

// The models of a models.toml, sorted by parameter count (stable). Throws ReportError
// "file:line: what was expected".
std::vector<ModelSize> load_models(const std::string& path);

// The default models file: reports/models.toml in the data directory (harness/base/data_files.h),
// named kDefaultModelsName in reports (its installed path differs between machines).
inline constexpr const char* kDefaultModelsName = "reports/models.toml";
std::string default_models_file();

struct ProjectionRow {
  size_t model = 0, combo = 0;
  double bytes = 0, gb = 0;                   // projected
  const PublishedSize* published = nullptr;   // the published size of this storage, if any
  double published_diff_pct = 0;              // (projected - published) / published, in %
  bool has_published_reduction = false;
  double published_reduction_pct = 0;   // vs the model's published fp32-states size
  double delta_pp = 0;                  // projected reduction - published reduction
};

// A published size applies to an uncompressed combination that wrote bf16 model weights, an fp32
// master and both moments in the published states dtype.
bool published_applies(const PublishedSize& p, const Combo& c);

std::vector<ProjectionRow> project(const std::vector<ModelSize>& models, const std::vector<Combo>& combos);

// One row per model and save policy: how many storage configurations, their projected range,
// the smallest one, and each published size that applies with its difference.
Table projection_table(const std::vector<ModelSize>& models, const std::vector<Combo>& combos,
                       const std::vector<ProjectionRow>& rows);

// Every (model, storage configuration) row at full precision (%.17g), for projection.csv.
std::string projection_csv(const std::vector<ModelSize>& models, const std::vector<Combo>& combos,
                           const std::vector<ProjectionRow>& rows);

}   // namespace rh::report
