// models.toml and the projection table; see projection.h.
#include "reports/projection.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <map>

#include "harness/base/input.h"
#include "harness/base/data_files.h"
#include "reports/run_data.h"

namespace rh::report {
namespace {

const char* kDash = "\u2014";

[[noreturn]] void fail(const std::string& path, const toml::node& n, const std::string& what) {
  throw ReportError(path + ":" + std::to_string(n.source().begin.line) + ": " + what);
}

std::string need_string(const std::string& path, const toml::table& t, const char* key, bool required = true) {
  const auto* n = t.get(key);
  if (!n) {
    if (!required) return "";
    throw ReportError(path + ":" + std::to_string(t.source().begin.line) + ": missing key '" + key + "'");
  }
  if (!n->is_string()) fail(path, *n, std::string("key '") + key + "': expected a string");
  return n->as_string()->get();
}

double need_positive(const std::string& path, const toml::table& t, const char* key) {
  const auto* n = t.get(key);
  if (!n) throw ReportError(path + ":" + std::to_string(t.source().begin.line) + ": missing key '" + key + "'");
  double v = 0;
  if (n->is_integer()) v = static_cast<double>(n->as_integer()->get());
  else if (n->is_floating_point()) v = n->as_floating_point()->get();
  else fail(path, *n, std::string("key '") + key + "': expected a number");
  if (!(v > 0)) fail(path, *n, std::string("key '") + key + "': expected a positive number");
  return v;
}

std::string safetensors_dtype(const std::string& states) {
  if (states == "fp32") return "F32";
  if (states == "bf16") return "BF16";
  if (states == "fp16") return "F16";
  return "";
}

const PublishedSize* published_fp32(const ModelSize& m) {
  for (const auto& p : m.published)
    if (p.states == "fp32") return &p;
  return nullptr;
}

}   // namespace

std::string default_models_file() { return data_file(kDefaultModelsName); }

std::vector<ModelSize> load_models(const std::string& path) {
  const std::string text = read_run_file(path, 4u << 20);   // no FIFO, no /dev/zero
  // ASCII only: toml++ 3.3.0 has undefined behaviour on some non-ASCII code points (base/input.h).
  if (const auto where = non_ascii_position(text); !where.empty()) throw ReportError(path + ":" + where);
  if (const auto where = toml_nesting_position(text); !where.empty()) throw ReportError(path + ":" + where);
  toml::table doc;
  try {
    doc = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ReportError(path + ":" + std::to_string(e.source().begin.line) +
                      ": malformed TOML: " + std::string(e.description()));
  }
  const auto* arr = doc.get("model");
  if (!arr || !arr->is_array_of_tables())
    throw ReportError(path + ":1: expected [[model]] tables (name, params, optional [[model.published]])");
  std::vector<ModelSize> out;
  for (const auto& node : *arr->as_array()) {
    const auto& t = *node.as_table();
    for (const auto& [k, v] : t)
      if (k.str() != "name" && k.str() != "params" && k.str() != "published" && k.str() != "note")
        fail(path, v, "unknown key '" + std::string(k.str()) + "' (expected name, params, note, published)");
    ModelSize m;
    m.name = need_string(path, t, "name");
    m.params = need_positive(path, t, "params");
    if (const auto* pub = t.get("published")) {
      if (!pub->is_array_of_tables()) fail(path, *pub, "published: expected [[model.published]] tables");
      for (const auto& pn : *pub->as_array()) {
        const auto& pt = *pn.as_table();
        PublishedSize p;
        p.states = need_string(path, pt, "states");
        if (safetensors_dtype(p.states).empty())
          fail(path, *pt.get("states"), "states: expected fp32, bf16 or fp16, got '" + p.states + "'");
        p.gb = need_positive(path, pt, "gb");
        p.source = need_string(path, pt, "source", false);
        m.published.push_back(p);
      }
    }
    out.push_back(m);
  }
  std::stable_sort(out.begin(), out.end(), [](const ModelSize& a, const ModelSize& b) { return a.params < b.params; });
  return out;
}

bool published_applies(const PublishedSize& p, const Combo& c) {
  const std::string d = safetensors_dtype(p.states);
  auto is = [&](const char* kind, const std::string& dtype) {
    auto it = c.dtypes.find(kind);
    return it != c.dtypes.end() && it->second == dtype;
  };
  // Published sizes are Megatron's uncompressed checkpoints (PR 2790's 222 / 164 GB).
  return c.compress == "none" && is("model", "BF16") && is("master_param", "F32") && !c.dtypes.count("remainder") &&
         is("exp_avg", d) && is("exp_avg_sq", d);
}

std::vector<ProjectionRow> project(const std::vector<ModelSize>& models, const std::vector<Combo>& combos) {
  std::vector<ProjectionRow> out;
  for (size_t m = 0; m < models.size(); ++m)
    for (size_t c = 0; c < combos.size(); ++c) {
      if (combos[c].num_params == 0) continue;   // nothing measured per parameter
      ProjectionRow r;
      r.model = m;
      r.combo = c;
      r.bytes = combos[c].payload_per_param * models[m].params;
      r.gb = r.bytes / 1e9;
      for (const auto& p : models[m].published)
        if (published_applies(p, combos[c])) r.published = &p;
      if (r.published) {
        r.published_diff_pct = 100.0 * (r.gb - r.published->gb) / r.published->gb;
        const auto* base = published_fp32(models[m]);
        r.has_published_reduction = base != nullptr && combos[c].has_reduction;
        if (r.has_published_reduction) {
          r.published_reduction_pct = 100.0 * (1.0 - r.published->gb / base->gb);
          r.delta_pp = combos[c].payload_reduction_pct - r.published_reduction_pct;
        }
      }
      out.push_back(r);
    }
  return out;
}

namespace {

// "157.0 GB published 164.0 (-4.3 %); reduction 28.57 % vs 26.13 % (+2.45 pp)" for one row that
// has a published size, "" otherwise.
std::string published_text(const ProjectionRow& r, const Combo& c) {
  if (!r.published) return "";
  std::string s = r.published->states + " states: published " + fmt("%.1f", r.published->gb) + " GB, projected " +
                  fmt("%.1f", r.gb) + " (" + fmt("%+.1f %%", r.published_diff_pct) + ")";
  if (r.has_published_reduction && r.published->states != "fp32")
    s += "; reduction " + reduction_text(c.payload_reduction_pct) + " vs " + reduction_text(r.published_reduction_pct) +
         " (" + fmt("%+.2f pp", r.delta_pp) + ")";
  return s;
}

}   // namespace

Table projection_table(const std::vector<ModelSize>& models, const std::vector<Combo>& combos,
                       const std::vector<ProjectionRow>& rows) {
  Table t;
  t.header = {"model",
              "parameters",
              "save policy",
              "storage configurations",
              "projected GB",
              "smallest configuration",
              "published sizes that apply"};
  t.right = {false, true, false, true, true, false, false};
  // One row per model and save policy, in the order the rows come (models by size, policies as
  // first measured); every configuration with full precision is in projection.csv.
  std::vector<std::pair<size_t, std::string>> order;
  std::map<std::pair<size_t, std::string>, std::vector<const ProjectionRow*>> groups;
  for (const auto& r : rows) {
    const auto key = std::make_pair(r.model, combos[r.combo].policy_label());
    if (!groups.count(key)) order.push_back(key);
    groups[key].push_back(&r);
  }
  for (const auto& key : order) {
    const auto& g = groups[key];
    const auto [lo, hi] = std::minmax_element(g.begin(), g.end(), [](const ProjectionRow* a, const ProjectionRow* b) {
      return a->gb < b->gb;
    });
    std::string published;
    for (const auto* r : g)
      if (const std::string p = published_text(*r, combos[r->combo]); !p.empty())
        published += (published.empty() ? "" : "; ") + p;
    const std::string& label = combos[(*lo)->combo].label;
    const size_t colon = label.find(": ");
    const auto& m = models[key.first];
    t.rows.push_back(
        {m.name, fmt("%.4g", m.params / 1e9) + " B", key.second, std::to_string(g.size()),
         g.size() == 1 ? fmt("%.1f", (*lo)->gb) : fmt("%.1f", (*lo)->gb) + " \u2013 " + fmt("%.1f", (*hi)->gb),
         colon == std::string::npos ? label : label.substr(colon + 2), published.empty() ? kDash : published});
  }
  return t;
}

std::string projection_csv(const std::vector<ModelSize>& models, const std::vector<Combo>& combos,
                           const std::vector<ProjectionRow>& rows) {
  std::string out =
      "model,params,policy,storage,payload_bytes_per_param,projected_bytes,projected_gb,reduction_vs_fp32_pct,"
      "published_gb,projected_vs_published_pct,published_reduction_pct,reduction_difference_pp\n";
  auto num = [](bool have, double v) { return have ? fmt("%.17g", v) : std::string(); };
  for (const auto& r : rows) {
    const auto& c = combos[r.combo];
    out += csv_field(models[r.model].name) + "," + fmt("%.17g", models[r.model].params) + "," + csv_field(c.policy) +
           "," + csv_field(c.label) + "," + fmt("%.17g", c.payload_per_param) + "," + fmt("%.17g", r.bytes) + "," +
           fmt("%.17g", r.gb) + "," + num(c.has_reduction, c.payload_reduction_pct) + "," +
           num(r.published != nullptr, r.published ? r.published->gb : 0) + "," +
           num(r.published != nullptr, r.published_diff_pct) + "," +
           num(r.has_published_reduction, r.published_reduction_pct) + "," +
           num(r.has_published_reduction, r.delta_pp) + "\n";
  }
  return out;
}

}   // namespace rh::report
