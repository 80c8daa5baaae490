// Reading a matrix run directory with fast-cpp-csv-parser; see run_data.h. Every field is read as
// text and converted here with strtod/strtoull (correctly rounded, whole field consumed), because
// fccp's own float parser is not correctly rounded and the report must show the CSV's numbers.
#include "reports/run_data.h"

// fccp's error types copy file names with strncpy into fixed buffers; GCC's truncation warning
// about that is in the library, not here.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstringop-truncation"
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <tuple>

#include "harness/base/input.h"
#include "harness/verify/scenario_name.h"

namespace fs = std::filesystem;

namespace rh::report {
namespace {

template <size_t N>
using Fields = std::array<std::string, N>;

template <size_t N>
struct Row {
  unsigned line;
  Fields<N> f;
};

// Every row of a CSV (text, read from path) with the named columns (extra columns are ignored, so
// a harness that adds columns stays readable). RFC 4180 (csv_parse): a quoted field may hold a
// line break, as csv_field writes one (a failure text with a newline once made the matrix's own
// summary.csv unreadable here). Errors are "path:line: malformed CSV: what".
template <size_t N>
std::vector<Row<N>> parse_csv(const std::string& path, const std::string& text,
                              const std::array<const char*, N>& cols) {
  std::vector<CsvRecord> recs;
  try {
    recs = csv_parse(text);
  } catch (const std::invalid_argument& e) {
    throw ReportError(path + ":" + e.what() + " (malformed CSV)");
  }
  auto bad = [&](unsigned line, const std::string& what) {
    throw ReportError(path + ":" + std::to_string(line) + ": malformed CSV: " + what);
  };
  if (recs.empty()) bad(1, "no header line");
  std::array<size_t, N> at{};
  for (size_t c = 0; c < N; ++c) {
    const auto& h = recs[0].fields;
    const auto it = std::find(h.begin(), h.end(), std::string(cols[c]));
    if (it == h.end()) bad(recs[0].line, std::string("Missing column '") + cols[c] + "' in the header");
    at[c] = static_cast<size_t>(it - h.begin());
  }
  const size_t width = recs[0].fields.size();
  std::vector<Row<N>> out;
  for (size_t r = 1; r < recs.size(); ++r) {
    const auto& f = recs[r].fields;
    if (f.size() != width)
      bad(recs[r].line, std::to_string(f.size()) + " columns, the header has " + std::to_string(width));
    Row<N> row{recs[r].line, {}};
    for (size_t c = 0; c < N; ++c) row.f[c] = f[at[c]];
    out.push_back(std::move(row));
  }
  return out;
}

// The same, reading path first (as hostile input: read_run_file).
template <size_t N>
std::vector<Row<N>> read_csv(const std::string& path, const std::array<const char*, N>& cols) {
  return parse_csv<N>(path, read_run_file(path), cols);
}

[[noreturn]] void bad_field(const std::string& path, unsigned line, const std::string& column,
                            const std::string& expected, const std::string& got) {
  throw ReportError(path + ":" + std::to_string(line) + ": column " + column + ": expected " + expected + ", got '" +
                    got + "'");
}

uint64_t parse_u64(const std::string& s, const std::string& path, unsigned line, const std::string& column) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
    bad_field(path, line, column, "a non-negative integer", s);
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), nullptr, 10);
  if (errno == ERANGE) bad_field(path, line, column, "an integer below 2^64", s);
  return v;
}

// The line (1-based) of byte offset `byte` in text, for JSON parse errors.
size_t line_of(const std::string& text, size_t byte) {
  size_t line = 1;
  for (size_t i = 0; i < byte && i < text.size(); ++i) line += text[i] == '\n';
  return line;
}

nlohmann::json read_json_file(const fs::path& p) {
  const std::string text = read_run_file(p.string());
  // nlohmann's parser recurses per level: summary.json nested 200,000 deep overflowed the stack.
  if (const size_t at = json_depth_violation(text.data(), text.size()); at != std::string::npos)
    throw ReportError(p.string() + ":" + std::to_string(line_of(text, at)) + ": nesting deeper than " +
                      std::to_string(kMaxJsonDepth) + " levels (refused before parsing)");
  // A key named twice in one object is refused naming it (nlohmann keeps the last silently).
  const auto unique = unique_keys_callback([&p](const std::string& key) {
    throw ReportError(p.string() + ": duplicate key '" + quote_text(key) +
                      "' in one object (each key may appear once)");
  });
  try {
    return nlohmann::json::parse(text, unique);
  } catch (const nlohmann::json::parse_error& e) {
    throw ReportError(p.string() + ":" + std::to_string(line_of(text, e.byte)) + ": malformed JSON: " + e.what());
  }
}

// A scenario's directory as summary.json names it: relative, below the run directory, no "..",
// "." or empty part, no NUL (summary.json is input: "dir": "/etc" or "../.." once read outside).
std::string checked_rel_dir(const std::string& dir, const std::string& summary, const std::string& scenario) {
  auto bad = [&](const std::string& why) {
    throw ReportError(summary + ": scenario '" + quote_text(scenario) + "': dir '" + quote_text(dir) + "' " + why +
                      " (expected a path inside the run directory, such as scenarios/NAME)");
  };
  if (dir.empty()) bad("is empty");
  if (dir.find('\0') != std::string::npos) bad("holds a NUL byte");
  if (dir[0] == '/') bad("is absolute");
  size_t pos = 0;
  while (pos <= dir.size()) {
    const size_t slash = std::min(dir.find('/', pos), dir.size());
    const std::string part = dir.substr(pos, slash - pos);
    if (part.empty() || part == "." || part == "..") bad("has a '" + part + "' part");
    pos = slash + 1;
  }
  return dir;
}

int64_t json_int(const nlohmann::json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number_integer() ? j[key].get<int64_t>() : -1;
}

}   // namespace

std::string read_run_file(const std::string& path, uint64_t max_bytes) {
  try {
    return read_regular_file(path, max_bytes);
  } catch (const std::exception& e) {
    throw ReportError(e.what());
  }
}

void write_report_file(const std::string& path, const std::string& text) {
  try {
    write_text(path, text);
  } catch (const DiskError&) {
    throw;   // exit 4, naming the path and the disk
  } catch (const WriteError&) {
    throw ReportError(path + ": cannot write");
  }
}

const std::vector<std::string>& ulp_kinds() {
  static const std::vector<std::string> k = {"model", "master_param", "remainder", "exp_avg", "exp_avg_sq", "scale"};
  return k;
}

const std::vector<std::string>& disk_kinds() {
  static const std::vector<std::string> k = {"model",      "master_param", "remainder", "exp_avg",
                                             "exp_avg_sq", "scale",        "metadata"};
  return k;
}

Num parse_num(const std::string& text, const std::string& path, unsigned line, const std::string& column) {
  char* end = nullptr;
  const double v = text.empty() ? 0 : std::strtod(text.c_str(), &end);
  if (text.empty() || end == nullptr || *end != '\0') bad_field(path, line, column, "a number", text);
  return {text, v};
}

std::vector<SummaryRow> read_summary_csv(const std::string& path) {
  if (!fs::exists(path))
    throw ReportError(path + ": missing; expected a run directory written by `resume-harness matrix`");
  const std::string csv = read_run_file(path);   // parsed twice below, read once
  const auto rows = parse_csv<22>(path, csv,
                                  {"scenario",
                                   "expectation",
                                   "passed",
                                   "outcome",
                                   "verdict",
                                   "first_divergence",
                                   "max_abs_dloss",
                                   "max_ulp_model",
                                   "max_ulp_master_param",
                                   "max_ulp_remainder",
                                   "max_ulp_exp_avg",
                                   "max_ulp_exp_avg_sq",
                                   "max_ulp_scale",
                                   "checkpoint_bytes",
                                   "bytes_per_param",
                                   "num_params",
                                   "save_policy",
                                   "fault",
                                   "exp_avg_dtype",
                                   "exp_avg_sq_dtype",
                                   "master_mode",
                                   "seconds"});
  std::vector<SummaryRow> out;
  for (const auto& [line, f] : rows) {
    SummaryRow r;
    r.line = line;
    r.scenario = f[0];
    r.expectation = f[1];
    if (f[2] != "0" && f[2] != "1") bad_field(path, line, "passed", "0 or 1", f[2]);
    r.passed = f[2] == "1";
    try {
      r.outcome = parse_outcome(f[3]);
    } catch (const std::invalid_argument&) {
      bad_field(path, line, "outcome", "identical, within-tolerance, diverged, load-refused or error", f[3]);
    }
    r.verdict = f[4];
    r.first_divergence = f[5];
    r.max_abs_dloss = parse_num(f[6], path, line, "max_abs_dloss");
    for (size_t k = 0; k < ulp_kinds().size(); ++k) {
      const std::string col = "max_ulp_" + ulp_kinds()[k];
      if (f[7 + k].empty()) continue;   // the key kind is not in this checkpoint
      r.max_ulp[ulp_kinds()[k]] = {f[7 + k], static_cast<double>(parse_u64(f[7 + k], path, line, col))};
    }
    r.checkpoint_bytes = {f[13], static_cast<double>(parse_u64(f[13], path, line, "checkpoint_bytes"))};
    r.bytes_per_param = parse_num(f[14], path, line, "bytes_per_param");
    r.num_params = {f[15], static_cast<double>(parse_u64(f[15], path, line, "num_params"))};
    r.save_policy = f[16];
    r.fault = f[17];
    r.exp_avg_dtype = f[18];
    r.exp_avg_sq_dtype = f[19];
    r.master_mode = f[20];
    r.seconds = parse_num(f[21], path, line, "seconds");
    if (r.scenario.empty()) bad_field(path, line, "scenario", "a scenario name", "");
    r.raw_bytes_per_param = r.bytes_per_param;
    out.push_back(r);
  }
  const std::string header = csv.substr(0, csv.find('\n'));
  if (header.find(",raw_bytes_per_param") != std::string::npos) {
    const auto extra = parse_csv<2>(path, csv, {"compress", "raw_bytes_per_param"});
    for (size_t i = 0; i < extra.size() && i < out.size(); ++i) {
      const auto& [line, f] = extra[i];
      if (f[0] != "none" && f[0] != "zstd") bad_field(path, line, "compress", "none or zstd", f[0]);
      out[i].compress = f[0];
      out[i].raw_bytes_per_param = parse_num(f[1], path, line, "raw_bytes_per_param");
    }
  }
  if (header.find(",diagnosis") != std::string::npos) {   // runs before external diagnoses had none
    const auto extra = parse_csv<3>(path, csv, {"external", "diagnosis", "explanation"});
    for (size_t i = 0; i < extra.size() && i < out.size(); ++i) {
      const auto& [line, f] = extra[i];
      if (f[0] != "0" && f[0] != "1") bad_field(path, line, "external", "0 or 1", f[0]);
      out[i].external = f[0] == "1";
      out[i].diagnosis = f[1];
      out[i].explanation = f[2];
    }
  }
  return out;
}

std::vector<DiskRow> read_disk_csv(const std::string& path) {
  std::vector<DiskRow> out;
  for (const auto& [line, f] : read_csv<6>(path, {"file", "key", "kind", "dtype", "numel", "bytes"})) {
    bool known = false;
    for (const auto& k : disk_kinds()) known = known || k == f[2];
    if (!known)
      bad_field(path, line, "kind", "model, master_param, remainder, exp_avg, exp_avg_sq, scale or metadata", f[2]);
    out.push_back({f[0], f[1], f[2], f[3], parse_u64(f[4], path, line, "numel"), parse_u64(f[5], path, line, "bytes")});
  }
  return out;
}

std::vector<StateRow> read_state_csv(const std::string& path) {
  std::vector<StateRow> out;
  for (const auto& [line, f] : read_csv<9>(path, {"phase", "key", "kind", "dtype_saved", "dtype_loaded", "numel",
                                                  "bit_equal_fraction", "max_abs_diff", "max_ulp"})) {
    if (f[0] != "after_load" && f[0] != "final" && f[0] != "determinism" && f[0] != "round_trip")
      bad_field(path, line, "phase", "after_load, final, determinism or round_trip", f[0]);
    StateRow r;
    r.phase = f[0];
    r.key = f[1];
    r.kind = f[2];
    r.dtype_saved = f[3];
    r.dtype_loaded = f[4];
    r.numel = parse_u64(f[5], path, line, "numel");
    r.bit_equal_fraction = parse_num(f[6], path, line, "bit_equal_fraction").value;
    r.max_abs_diff = parse_num(f[7], path, line, "max_abs_diff").value;
    r.max_ulp = parse_u64(f[8], path, line, "max_ulp");
    out.push_back(r);
  }
  return out;
}

int64_t check_metrics_compare_csv(const std::string& path) {
  const auto rows = read_csv<10>(path, {"iteration", "metric", "baseline", "baseline_hex", "resumed", "resumed_hex",
                                        "abs_diff", "rel_diff", "ulp", "bit_equal"});
  static const char* names[] = {"iteration", "metric",      "baseline", "baseline_hex",
                                "resumed",   "resumed_hex", "abs_diff", "rel_diff"};
  for (const auto& [line, f] : rows) {
    parse_u64(f[0], path, line, "iteration");
    for (size_t c = 2; c < 8; ++c) parse_num(f[c], path, line, names[c]);
    parse_u64(f[8], path, line, "ulp");
    if (f[9] != "0" && f[9] != "1") bad_field(path, line, "bit_equal", "0 or 1", f[9]);
  }
  return static_cast<int64_t>(rows.size());
}

void check_metrics_csv(const std::string& path) {
  // The format of harness/train/metrics.h; the plots read the hex columns, so those must parse.
  const auto rows = read_csv<9>(path, {"iteration", "consumed_samples", "lm_loss_hex", "aux_loss_hex", "total_loss_hex",
                                       "grad_norm_hex", "lr_hex", "num_zeros", "lm_loss"});
  static const char* names[] = {"iteration",     "consumed_samples", "lm_loss_hex", "aux_loss_hex", "total_loss_hex",
                                "grad_norm_hex", "lr_hex",           "num_zeros",   "lm_loss"};
  for (const auto& [line, f] : rows) {
    parse_u64(f[0], path, line, names[0]);
    parse_u64(f[1], path, line, names[1]);
    for (size_t c = 2; c < 7; ++c) parse_num(f[c], path, line, names[c]);
    parse_u64(f[7], path, line, names[7]);
  }
}

RunData load_run(const std::string& dir) {
  RunData run;
  run.dir = dir;
  const fs::path root(dir);
  if (!fs::is_directory(root)) throw ReportError(dir + ": not a directory (expected a matrix run directory)");
  const auto rows = read_summary_csv((root / "summary.csv").string());

  std::map<std::string, nlohmann::json> entries;   // summary.json scenarios by name
  if (fs::exists(root / "summary.json")) {
    const auto js = read_json_file(root / "summary.json");
    run.has_summary_json = true;
    if (js.contains("environment")) run.environment = js["environment"];
    if (js.contains("file") && js["file"].is_string()) run.matrix_file = js["file"].get<std::string>();
    if (js.contains("seconds") && js["seconds"].is_number()) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.1f", js["seconds"].get<double>());
      run.total_seconds = buf;
    }
    if (js.contains("scenarios") && js["scenarios"].is_array())
      for (const auto& s : js["scenarios"])
        if (s.is_object() && s.contains("name") && s["name"].is_string()) entries[s["name"].get<std::string>()] = s;
  }

  for (const auto& r : rows) {
    ScenarioData s;
    s.row = r;
    s.group = r.scenario.substr(0, r.scenario.find('/'));
    static const nlohmann::json none;
    const auto found = entries.find(r.scenario);
    const nlohmann::json& e = found != entries.end() ? found->second : none;
    s.rel_dir = e.contains("dir") && e["dir"].is_string()
                    ? checked_rel_dir(e["dir"].get<std::string>(), (root / "summary.json").string(), r.scenario)
                    : "scenarios/" + safe_name(r.scenario);
    const fs::path sd = root / s.rel_dir;
    // A scenario that errored early has no directory at all: one look instead of six (a run of
    // 100,000 such rows spent a second in stat calls). On an error, each file is looked at as before.
    std::error_code ec;
    const bool dir_there = fs::exists(sd, ec) || ec;
    auto present = [&](const char* name) {
      if (dir_there && fs::exists(sd / name)) return true;
      s.missing.push_back(name);
      return false;
    };
    nlohmann::json result;
    if (present("result.json")) result = read_json_file(sd / "result.json");
    for (const nlohmann::json* j : std::array<const nlohmann::json*, 2>{&e, &result})
      if (s.config.is_null() && j->is_object() && j->contains("config") && (*j)["config"].is_object())
        s.config = (*j)["config"];
    s.save_at = json_int(result, "save_at") >= 0 ? json_int(result, "save_at") : json_int(e, "save_at");
    s.iterations = json_int(result, "iterations") >= 0 ? json_int(result, "iterations") : json_int(e, "iterations");
    if ((s.has_disk = present("disk.csv"))) s.disk = read_disk_csv((sd / "disk.csv").string());
    if ((s.has_state = present("state_compare.csv"))) s.state = read_state_csv((sd / "state_compare.csv").string());
    if ((s.has_metrics_compare = present("metrics_compare.csv")))
      s.metric_rows = check_metrics_compare_csv((sd / "metrics_compare.csv").string());
    if ((s.has_baseline = present("baseline/metrics.csv"))) check_metrics_csv((sd / "baseline/metrics.csv").string());
    if ((s.has_resumed = present("resumed/metrics.csv"))) check_metrics_csv((sd / "resumed/metrics.csv").string());
    run.scenarios.push_back(std::move(s));
  }
  return run;
}

}   // namespace rh::report
