// The resume check; see check.h.
#include "harness/check.h"

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "harness/checkpoint/manifest.h"
#include "harness/checkpoint/manifest_reader.h"
#include "harness/checkpoint/safetensors.h"
#include "harness/metrics.h"
#include "harness/process.h"

namespace fs = std::filesystem;

namespace rh {
namespace {

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
  if (!f) throw std::runtime_error("cannot write " + p.string());
}


std::vector<std::string> train_args(const CheckOptions& o, const fs::path& cfg,
                                     const fs::path& out) {
  return {o.tool, "train", "--config", cfg.string(), "--out", out.string(), "--dump-states", "--quiet"};
}

std::vector<std::string> nproc_args(int64_t n) {
  if (n <= 1) return {};
  return {"--nproc", std::to_string(n)};
}

// Runs one child training process; throws naming `what` and the log's tail when it fails.
void run_child(const std::vector<std::string>& argv, const fs::path& log, double timeout_s, const char* what) {
  auto pr = run_process(argv, log.string(), timeout_s);
  if (pr.exit_code != 0)
    throw std::runtime_error(std::string(what) + " run exited with " + std::to_string(pr.exit_code) +
                             (pr.timed_out ? " (timed out)" : "") + ": " + tail_of_file(log.string(), 600));
}

// Keys whose fingerprints differ between two fingerprint lists (by key), in a's order.
std::vector<std::string> differing_keys(const std::vector<std::pair<std::string, std::string>>& a,
                                        const std::vector<std::pair<std::string, std::string>>& b) {
  std::map<std::string, std::string> mb(b.begin(), b.end());
  std::vector<std::string> out;
  for (const auto& [k, h] : a) {
    auto it = mb.find(k);
    if (it == mb.end() || it->second != h) out.push_back(k);
  }
  std::map<std::string, std::string> ma(a.begin(), a.end());
  for (const auto& [k, h] : b)
    if (!ma.count(k)) out.push_back(k);
  return out;
}

bool is_optimizer_key(const std::string& k) {
  const auto kind = key_kind(k);
  return kind == "master_param" || kind == "remainder" || kind == "exp_avg" || kind == "exp_avg_sq";
}

uint64_t dir_bytes(const fs::path& p, int64_t* num_params) {
  uint64_t total = 0;
  const fs::path iter = ckpt::detail::resolve_checkpoint_dir(p.string());
  // The checkpoint's files; disk.csv is an accounting report beside them, not checkpoint data.
  for (const auto& e : fs::directory_iterator(iter))
    if (e.is_regular_file() && e.path().filename() != "disk.csv") total += e.file_size();
  if (num_params) {
    *num_params = 0;
    auto f = ckpt::SafetensorsFile::open((iter / "model.safetensors").string());
    if (f.compressed()) f = f.decoded();   // blobs of stored bytes: count the decoded tensors' elements
    for (const auto& t : f.tensors()) *num_params += static_cast<int64_t>(t.numel());
  }
  return total;
}

void write_outputs(const fs::path& dir, const Scenario& s, const CheckResult& r) {
  std::string mc = "iteration,metric,baseline,baseline_hex,resumed,resumed_hex,abs_diff,rel_diff,ulp,bit_equal\n";
  for (const auto& m : r.metric_diffs)
    mc += std::to_string(m.iteration) + "," + m.metric + "," + exact_decimal(m.baseline) + "," + hex_float(m.baseline) +
          "," + exact_decimal(m.resumed) + "," + hex_float(m.resumed) + "," + exact_decimal(m.abs_diff) + "," +
          exact_decimal(m.rel_diff) + "," + std::to_string(m.ulp) + "," + (m.bit_equal ? "1" : "0") + "\n";
  write_text(dir / "metrics_compare.csv", mc);
  std::string sc = "phase,key,kind,dtype_saved,dtype_loaded,numel,bit_equal_fraction,max_abs_diff,max_ulp\n";
  auto rows = [&](const char* phase, const std::vector<TensorDiff>& v) {
    for (const auto& d : v)
      sc += std::string(phase) + "," + d.key + "," + d.kind + "," + d.dtype_a + "," + d.dtype_b + "," +
            std::to_string(d.numel) + "," + exact_decimal(d.bit_equal_fraction) + "," + exact_decimal(d.max_abs_diff) + "," +
            std::to_string(d.max_ulp) + "\n";
  };
  rows("after_load", r.after_load);
  rows("final", r.final_state);
  write_text(dir / "state_compare.csv", sc);
  nlohmann::json j = {{"name", r.name},
                      {"description", s.description},
                      {"expectation", r.expectation},
                      {"reason", s.expect.reason},
                      {"passed", r.passed},
                      {"verdict", r.verdict},
                      {"outcome", r.outcome},
                      {"first_divergence", r.first_divergence},
                      {"load_error", r.load_error},
                      {"max_abs_dloss", r.max_abs_dloss},
                      {"max_ulp_after_load", r.max_ulp_after_load},
                      {"bit_equal_after_load", r.bit_equal_after_load},
                      {"control_fresh_differs", r.control_fresh_differs},
                      {"control_k_differs", r.control_k_differs},
                      {"checkpoint_bytes", r.checkpoint_bytes},
                      {"bytes_per_param", r.bytes_per_param},
                      {"raw_bytes_per_param", r.raw_bytes_per_param},
                      {"num_params", r.num_params},
                      {"seconds", r.seconds},
                      {"save_at", s.save_at},
                      {"dp_size", s.dp_size},
                      {"resume_dp_size", s.resume_dp()},
                      {"after_load_differs", r.after_load_differs},
                      {"iterations", s.cfg.train.iterations},
                      {"save_policy", ckpt::to_string(s.policy.kind)},
                      {"compress", ckpt::to_string(s.policy.compress)},
                      {"fault", to_string(s.fault)},
                      {"config", to_json(s.cfg)}};
  write_text(dir / "result.json", j.dump(2) + "\n");
}

}  // namespace

void judge(const Scenario& s, CheckResult& r) {
  const bool controls_ok = r.control_fresh_differs && r.control_k_differs;
  auto set = [&](bool pass, const std::string& why) {
    r.passed = pass;
    r.verdict = std::string(pass ? "PASS" : "FAIL") + ": " + why;
  };
  if (r.outcome == "error") return set(false, "error: " + r.first_divergence);
  if (!controls_ok && r.outcome != "load-refused")
    return set(false, std::string("negative control failed: ") +
                          (!r.control_fresh_differs ? "a fresh optimizer equals the saved state"
                                                    : "the state at K equals the state at K-1"));
  if (s.resharded() && !r.after_load_differs.empty() && r.outcome != "load-refused" &&
      s.expect.kind != Expectation::Kind::diverge)
    return set(false, "resharded load (" + std::to_string(s.dp_size) + " -> " + std::to_string(s.resume_dp()) +
                          " ranks) is not exact: " + r.after_load_differs + " differs from the saved state");
  const bool identical = r.first_divergence.empty() && r.outcome != "load-refused";
  switch (s.expect.kind) {
    case Expectation::Kind::exact:
      if (identical) return set(true, "bit-exact resume");
      return set(false, "expected bit-exact resume; first divergence: " +
                            (r.outcome == "load-refused" ? "load refused: " + r.load_error : r.first_divergence));
    case Expectation::Kind::diverge:
      if (!identical)
        return set(true, "difference caught as expected: " +
                             (r.outcome == "load-refused" ? "load refused: " + r.load_error : r.first_divergence));
      return set(false, "expected a difference (" + s.expect.reason + ") but the resume was bit-exact");
    case Expectation::Kind::tolerance: {
      if (r.outcome == "load-refused") return set(false, "load refused: " + r.load_error);
      for (const auto& m : r.metric_diffs) {
        // Only the metrics the scenario declares are judged (as Megatron's approximate mode
        // judges lm loss); the others are reported in metrics_compare.csv.
        auto it = s.expect.tolerances.find(m.metric);
        if (m.bit_equal || it == s.expect.tolerances.end()) continue;
        const double bound = it->second.atol + it->second.rtol * std::fabs(m.baseline);
        if (!(m.abs_diff <= bound))
          return set(false, "metric " + m.metric + " at iteration " + std::to_string(m.iteration) + " differs by " +
                                exact_decimal(m.abs_diff) + " > atol + rtol*|baseline| = " + exact_decimal(bound));
      }
      return set(true, identical ? "bit-exact (within any tolerance)"
                                 : "within declared tolerance; first divergence: " + r.first_divergence);
    }
  }
}

CheckResult run_check(const Scenario& s, const CheckOptions& o) {
  CheckResult r;
  r.name = s.name;
  r.expectation = to_string(s.expect.kind);
  const fs::path dir(o.work_dir);
  // The work directory is removed first: never one that names "", ".", ".." or a root.
  {
    const fs::path name = dir.filename();
    if (name.empty() || name == "." || name == ".." || dir.lexically_normal() == dir.root_path())
      throw std::invalid_argument("run_check: work directory '" + o.work_dir +
                                  "' must name a scenario directory (not '', '.', '..' or a root)");
  }
  const auto t0 = std::chrono::steady_clock::now();
  try {
    fs::remove_all(dir);
    fs::create_directories(dir);
    const fs::path cfg = dir / "config.json", ckroot = dir / "checkpoints";
    write_text(cfg, to_json(s.cfg).dump(2) + "\n");
    const int64_t K = s.save_at, N = s.cfg.train.iterations;

    // The baseline runs in this process (it needs no isolation: it is the reference), which
    // saves one LibTorch start-up per check; the resumed run is always a new process. A
    // data-parallel baseline is a launcher process with its ranks.
    if (s.dp_size > 1) {
      auto ba = train_args(o, cfg, dir / "baseline");
      ba.insert(ba.end(), {"--save", ckroot.string(), "--save-at", std::to_string(K), "--save-policy",
                           ckpt::to_string(s.policy.kind), "--save-compress", ckpt::to_string(s.policy.compress)});
      for (const auto& [k, d] : s.policy.overrides) ba.insert(ba.end(), {"--save-override", k + "=" + optim::to_string(d)});
      for (const auto& a : nproc_args(s.dp_size)) ba.push_back(a);
      run_child(ba, dir / "baseline.log", o.timeout_s, "baseline");
    } else {
      TrainJob bj;
      bj.cfg = s.cfg;
      bj.out_dir = (dir / "baseline").string();
      bj.save_root = ckroot.string();
      bj.save_at = K;
      bj.policy = s.policy;
      bj.dump_states = true;
      bj.quiet = true;
      try {
        run_train(bj);
      } catch (const std::exception& e) {
        throw std::runtime_error(std::string("baseline run failed: ") + e.what());
      }
    }

    auto res = train_args(o, cfg, dir / "resumed");
    res.insert(res.end(), {"--load", ckroot.string(), "--fault", to_string(s.fault)});
    if (s.allow_lossy) res.push_back("--allow-lossy");
    for (const auto& a : nproc_args(s.resume_dp())) res.push_back(a);
    auto pr = run_process(res, (dir / "resumed.log").string(), o.timeout_s);
    // Resharded: what the resumed run is compared with is an uninterrupted run at its size.
    const fs::path ref_dir = s.resharded() ? dir / "reference" : dir / "baseline";
    if (s.resharded()) {
      auto ra = train_args(o, cfg, ref_dir);
      for (const auto& a : nproc_args(s.resume_dp())) ra.push_back(a);
      run_child(ra, dir / "reference.log", o.timeout_s, "reference");
    }

    r.checkpoint_bytes = dir_bytes(ckroot, &r.num_params);
    r.bytes_per_param = r.num_params ? static_cast<double>(r.checkpoint_bytes) / static_cast<double>(r.num_params) : 0;
    const fs::path iter = ckpt::detail::resolve_checkpoint_dir(ckroot.string());
    r.raw_checkpoint_bytes = r.checkpoint_bytes;
    const nlohmann::json manifest = ckpt::detail::read_manifest_file((iter / ckpt::detail::kManifestFile).string());
    for (const auto& f : manifest["files"])
      if (f.contains("compress")) r.raw_checkpoint_bytes += f["raw_bytes"].get<uint64_t>() - f["stored_bytes"].get<uint64_t>();
    r.raw_bytes_per_param =
        r.num_params ? static_cast<double>(r.raw_checkpoint_bytes) / static_cast<double>(r.num_params) : 0;
    if (fs::exists(iter / "disk.csv")) fs::copy_file(iter / "disk.csv", dir / "disk.csv");

    const auto fb = read_fingerprints((dir / "baseline" / "fingerprints.csv").string());
    const auto fc = s.resharded() ? read_fingerprints((ref_dir / "fingerprints.csv").string()) : fb;
    // Negative control 2: the state at K differs from the state at K-1.
    for (const auto& k : differing_keys(fb.at(K), fb.at(K - 1)))
      r.control_k_differs = r.control_k_differs || is_optimizer_key(k);

    if (pr.exit_code == 2 && !pr.timed_out) {
      r.outcome = "load-refused";
      const std::string log = tail_of_file((dir / "resumed.log").string(), 800);
      const auto e = log.rfind("error: ");
      r.load_error = e == std::string::npos ? log : log.substr(e + 7);
      while (!r.load_error.empty() && (r.load_error.back() == '\n' || r.load_error.back() == '\r')) r.load_error.pop_back();
      r.first_divergence = "load refused";
      r.control_fresh_differs = true;   // nothing was loaded; the control is moot
    } else if (pr.exit_code != 0) {
      throw std::runtime_error("resumed process exited with " + std::to_string(pr.exit_code) +
                               (pr.timed_out ? " (timed out)" : "") + ": " + tail_of_file((dir / "resumed.log").string(), 600));
    } else {
      const auto fr = read_fingerprints((dir / "resumed" / "fingerprints.csv").string());
      // Negative control 1: a fresh optimizer (before loading) differs from the saved state.
      for (const auto& k : differing_keys(fr.at(-1), fc.at(K)))
        r.control_fresh_differs = r.control_fresh_differs || is_optimizer_key(k);
      // Right after load: the fingerprints (same layout only), and the dumps joined across shards.
      if (!s.resharded()) {
        auto after = differing_keys(fb.at(K), fr.at(K));
        if (!after.empty()) r.first_divergence = "after load: " + after.front();
      }
      r.after_load = compare_state_dumps((dir / "baseline" / "state_at_save").string(),
                                         (dir / "resumed" / "state_after_load").string());
      for (const auto& d : r.after_load)
        if (!d.identical() && r.after_load_differs.empty()) r.after_load_differs = d.key;
      if (s.resharded() && !r.after_load_differs.empty()) r.first_divergence = "after load: " + r.after_load_differs;
      for (const auto& d : r.after_load) {
        auto& u = r.max_ulp_after_load[d.kind];
        u = std::max(u, d.max_ulp);
        auto it = r.bit_equal_after_load.find(d.kind);
        if (it == r.bit_equal_after_load.end() || d.bit_equal_fraction < it->second)
          r.bit_equal_after_load[d.kind] = d.bit_equal_fraction;
      }
      // Every metric of K+1..N.
      const auto mb = read_metrics_csv((ref_dir / "metrics.csv").string());
      const auto mr = read_metrics_csv((dir / "resumed" / "metrics.csv").string());
      if (mr.size() != static_cast<size_t>(N - K))
        throw std::runtime_error("resumed run wrote " + std::to_string(mr.size()) + " metric rows, expected " +
                                 std::to_string(N - K));
      for (int64_t i = K + 1; i <= N; ++i) {
        const auto& b = mb.at(static_cast<size_t>(i - 1));
        const auto& q = mr.at(static_cast<size_t>(i - K - 1));
        for (const auto& name : metric_names()) {
          MetricDiff d;
          d.iteration = i;
          d.metric = name;
          d.baseline = metric_value(b, name);
          d.resumed = metric_value(q, name);
          d.bit_equal = std::memcmp(&d.baseline, &d.resumed, sizeof(double)) == 0;
          d.abs_diff = std::fabs(d.baseline - d.resumed);
          if (std::isnan(d.abs_diff)) d.abs_diff = d.bit_equal ? 0 : std::numeric_limits<double>::infinity();
          d.rel_diff = d.baseline != 0 ? d.abs_diff / std::fabs(d.baseline) : (d.abs_diff == 0 ? 0 : INFINITY);
          // lm/aux/total losses are fp32 values; grad norm and lr are doubles.
          d.ulp = (name == "grad_norm" || name == "lr" || name == "num_zeros")
                      ? ulp_distance(d.baseline, d.resumed)
                      : ulp_distance(static_cast<float>(d.baseline), static_cast<float>(d.resumed));
          if (name == "lm_loss") r.max_abs_dloss = std::max(r.max_abs_dloss, d.abs_diff);
          if (!d.bit_equal && r.first_divergence.empty())
            r.first_divergence = "iteration " + std::to_string(i) + ": metric " + name;
          r.metric_diffs.push_back(d);
        }
        if (r.first_divergence.empty()) {
          auto keys = differing_keys(fc.at(i), fr.at(i));
          if (!keys.empty()) r.first_divergence = "iteration " + std::to_string(i) + ": " + keys.front();
        }
      }
      r.final_state = compare_state_dumps((ref_dir / "state_final").string(),
                                          (dir / "resumed" / "state_final").string());
      for (const auto& d : r.final_state)
        if (!d.identical() && r.first_divergence.empty()) r.first_divergence = "final state: " + d.key;
      r.outcome = r.first_divergence.empty() ? "identical" : "diverged";
    }
    if (!o.keep_checkpoints) {
      fs::remove_all(ckroot);
      for (const char* run : {"baseline", "resumed", "reference"})
        for (const char* d : {"state_at_save", "state_after_load", "state_final"}) fs::remove_all(dir / run / d);
    }
  } catch (const std::exception& e) {
    r.outcome = "error";
    r.first_divergence = e.what();
  }
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  judge(s, r);
  if (r.outcome == "diverged" && s.expect.kind == Expectation::Kind::tolerance && r.passed)
    r.outcome = "within-tolerance";
  try {
    write_outputs(dir, s, r);
  } catch (const std::exception& e) {
    r.passed = false;
    r.verdict = std::string("FAIL: cannot write results: ") + e.what();
  }
  return r;
}

}  // namespace rh
