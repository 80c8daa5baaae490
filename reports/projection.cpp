// models.toml and the projection table; see projection.h.
#include "reports/projection.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cctype>

#include "harness/checkpoint/json_guard.h"
#include "reports/data_files.h"
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

}  // namespace

std::string default_models_file() { return data_file("reports/models.toml"); }

std::vector<ModelSize> load_models(const std::string& path) {
  const std::string text = read_run_file(path, 4u << 20);   // no FIFO, no /dev/zero
  // ASCII only: toml++ 3.3.0 has undefined behaviour on some non-ASCII code points (json_guard.h).
  if (const auto where = ckpt::non_ascii_position(text); !where.empty()) throw ReportError(path + ":" + where);
  toml::table doc;
  try {
    doc = toml::parse(text, path);
  } catch (const toml::parse_error& e) {
    throw ReportError(path + ":" + std::to_string(e.source().begin.line) + ": malformed TOML: " +
                      std::string(e.description()));
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
  return is("model", "BF16") && is("master_param", "F32") && !c.dtypes.count("remainder") && is("exp_avg", d) &&
         is("exp_avg_sq", d);
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

Table projection_table(const std::vector<ModelSize>& models, const std::vector<Combo>& combos,
                       const std::vector<ProjectionRow>& rows) {
  Table t;
  t.header = {"model", "parameters", "storage (save policy: dtype per key)", "measured bytes/param",
              "projected bytes", "projected GB", "reduction vs fp32 policy", "published GB",
              "projected vs published", "published reduction", "reduction difference"};
  t.right.assign(t.header.size(), true);
  t.right[0] = t.right[2] = false;
  for (const auto& r : rows) {
    const auto& m = models[r.model];
    const auto& c = combos[r.combo];
    const bool is_ref = c.reference == static_cast<int>(c.scenario);
    t.rows.push_back({m.name, fmt("%.4g", m.params / 1e9) + " B", c.label, fmt("%.4f", c.payload_per_param),
                      fmt("%.0f", r.bytes), fmt("%.1f", r.gb),
                      is_ref ? "reference" : c.has_reduction ? reduction_text(c.payload_reduction_pct) : kDash,
                      r.published ? fmt("%.1f", r.published->gb) : kDash,
                      r.published ? fmt("%+.1f %%", r.published_diff_pct) : kDash,
                      r.has_published_reduction ? reduction_text(r.published_reduction_pct) : kDash,
                      r.has_published_reduction ? fmt("%+.2f pp", r.delta_pp) : kDash});
  }
  return t;
}

}  // namespace rh::report
