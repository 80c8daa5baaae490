// One training process; see run.h.
#include "harness/run.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "harness/dist.h"
#include "harness/env.h"
#include "harness/schedule.h"
#include "harness/trainer.h"

namespace fs = std::filesystem;

namespace rh {

const std::vector<std::string>& fault_names() {
  static const std::vector<std::string> names = {
      "none",           "skip_rng_restore",  "skip_data_position_restore", "reset_step_counter",
      "skip_exp_avg_restore", "reset_lr_schedule", "drop_remainders", "lossy_dtype_override",
      "reset_wd_schedule", "wrong_lr_decay_style", "skip_expert_bias_restore"};
  return names;
}

std::string to_string(Fault f) { return fault_names().at(static_cast<size_t>(f)); }

Fault parse_fault(const std::string& s) {
  const auto& names = fault_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == s) return static_cast<Fault>(i);
  std::string all;
  for (const auto& n : names) all += (all.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown fault '" + s + "' (expected one of: " + all + ")");
}

namespace {

void write_text(const fs::path& p, const std::string& s) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << s;
  if (!f) throw std::runtime_error("cannot write " + p.string());
}

std::string fingerprint_rows(int64_t iteration, const std::vector<std::pair<std::string, uint64_t>>& fp) {
  std::string out;
  char buf[32];
  for (const auto& [key, h] : fp) {
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out += std::to_string(iteration) + "," + key + "," + buf + "\n";
  }
  return out;
}

// Saves the trainer's state under `root` with `policy`.
ckpt::SaveResult save_state(const Trainer& tr, const fs::path& root, const ckpt::SavePolicy& policy,
                            dist::Group* group) {
  ckpt::SaveInput in;
  in.group = group;
  in.model = &tr.model();
  in.optimizer = &tr.optimizer();
  auto st = tr.state();
  in.state = &st;
  in.run_config = to_json(tr.config());
  in.policy = policy;
  return ckpt::save_checkpoint(root.string(), in);
}

// A lossless dump of the in-memory state (native policy), for the state comparisons.
void dump_state(const Trainer& tr, const fs::path& root, dist::Group* group) {
  save_state(tr, root, {ckpt::SavePolicyKind::native, {}}, group);
}

// This rank's fingerprints; data parallel, rank 0 returns every rank's: the keys that differ by
// rank (optimizer parts, generators) of rank r > 0 get the suffix "@rank<r>".
std::vector<std::pair<std::string, uint64_t>> all_fingerprints(const Trainer& tr, dist::Group* group) {
  auto fp = tr.fingerprints();
  if (!group) return fp;
  std::string mine;
  for (const auto& [k, h] : fp) mine += k + "," + std::to_string(h) + "\n";
  const auto all = group->all_gather_strings(mine);
  for (size_t r = 1; r < all.size(); ++r) {
    std::istringstream in(all[r]);
    std::string line;
    while (std::getline(in, line)) {
      const auto comma = line.rfind(',');
      const std::string key = line.substr(0, comma);
      if (key.rfind("model/", 0) == 0 || (key.rfind("state/", 0) == 0 && key.rfind("state/rng.", 0) != 0)) continue;
      fp.emplace_back(key + "@rank" + std::to_string(r), std::stoull(line.substr(comma + 1)));
    }
  }
  return fp;
}

}  // namespace

int run_train(const TrainJob& job) {
  const RunConfig& cfg = job.cfg;
  validate(cfg);
  configure_determinism(static_cast<int>(cfg.train.threads));
  const int64_t stop = job.stop_at < 0 ? cfg.train.iterations : job.stop_at;
  if (stop > cfg.train.iterations || stop < 0)
    throw std::invalid_argument("--stop-at " + std::to_string(stop) + " is outside [0, " +
                                std::to_string(cfg.train.iterations) + "]");
  // Every flag is checked before anything is built or written (config.json, the model).
  if (job.save_at < -1 || job.save_at == 0)
    throw std::invalid_argument("--save-at " + std::to_string(job.save_at) + ": expected an iteration >= 1");
  if (job.save_at >= 0 && job.save_root.empty())
    throw std::invalid_argument("--save-at needs --save (the checkpoint root)");
  if (job.save_at > stop)
    throw std::invalid_argument("--save-at " + std::to_string(job.save_at) + " is after the last iteration " +
                                std::to_string(stop));
  if (job.fault != Fault::none && job.load.empty())
    throw std::invalid_argument("--fault " + to_string(job.fault) + " acts on load: it needs --load");
  if (!job.load.empty()) {
    std::error_code ec;
    if (!fs::exists(job.load, ec))
      throw std::invalid_argument("--load " + job.load + ": no such file or directory");
  }
  std::unique_ptr<dist::Group> group;
  const dist::Placement place = dist::placement_from_environment();
  if (place.world_size > 1)
    group = std::make_unique<dist::Group>(place, std::chrono::milliseconds(static_cast<int64_t>(job.dist_timeout_s * 1000)));
  const bool lead = place.rank == 0;
  const bool quiet = job.quiet || !lead;
  const fs::path out(job.out_dir);
  const bool write_out = lead && !job.out_dir.empty();
  if (write_out) fs::create_directories(out);
  const auto info = runtime_info();
  if (!quiet) {
    std::cout << describe(info) << "\n";
    if (!info.blas_is_openblas)
      std::cout << "WARNING: OpenBLAS is not the BLAS in use; runs are about 12x slower\n";
    std::cout << describe(cfg);
  }

  Trainer tr(cfg, group.get());
  if (!quiet) {
    if (group) std::cout << "data parallel: " << place.world_size << " ranks (" << place.source << ")\n";
    std::cout << tr.model().describe() << "\n" << tr.optimizer().describe() << "\n";
    if (job.remainders_flag_given && !tr.optimizer().remainders_note().empty())
      std::cout << "WARNING: --store-param-remainders: " << tr.optimizer().remainders_note() << "\n";
  }
  if (write_out) write_text(out / "config.json", to_json(cfg).dump(2) + "\n");
  auto fingerprint_now = [&](int64_t iteration) {
    const auto fp = all_fingerprints(tr, group.get());
    return lead ? fingerprint_rows(iteration, fp) : std::string();
  };

  std::string fingerprints = "iteration,key,xxh3\n";
  if (!job.load.empty()) {
    // Negative control material: the fresh state, before anything is loaded.
    fingerprints += fingerprint_now(-1);
    ckpt::LoadOptions opts;
    opts.allow_lossy = job.allow_lossy;
    if (job.fault == Fault::skip_exp_avg_restore) opts.skip_keys.insert("exp_avg");
    if (job.fault == Fault::drop_remainders) opts.skip_keys.insert("remainder");
    if (job.fault == Fault::skip_expert_bias_restore) opts.skip_keys.insert("buffers");
    ckpt::TrainState st = tr.state();
    ckpt::LoadReport report;
    std::string err;
    try {
      report = ckpt::load_checkpoint(job.load, tr.model(), tr.optimizer(), st, to_json(cfg), opts);
    } catch (const std::exception& e) {
      if (!group) throw;
      err = e.what();
    }
    if (group) {   // every rank refuses if one does, with the first refusal's reason
      const auto all = group->all_gather_strings(err);
      for (size_t r = 0; r < all.size(); ++r)
        if (!all[r].empty()) throw ckpt::CheckpointError("rank " + std::to_string(r) + ": " + all[r]);
      tr.optimizer().sync_params();   // a conversion may have written only the owned parts
    }
    // Megatron's load_checkpoint hands state_dict['opt_param_scheduler'] to the scheduler this
    // run built (checkpointing.py load_checkpoint -> OptimizerParamScheduler.load_state_dict):
    // every saved value is checked against this run's, or taken from one side by the flags.
    st.opt_param_scheduler = load_scheduler_state(scheduler_from_config(cfg), st.opt_param_scheduler,
                                                  scheduler_args_from_config(cfg), "checkpoint " + report.dir);
    if (job.fault == Fault::skip_data_position_restore) st.consumed_samples = 0;
    if (job.fault == Fault::reset_lr_schedule) st.opt_param_scheduler.num_steps = 0;
    if (job.fault == Fault::reset_wd_schedule) {
      st.opt_param_scheduler.start_wd = st.opt_param_scheduler.end_wd = cfg.optim.weight_decay;
      st.opt_param_scheduler.wd_incr_style = "constant";
    }
    if (job.fault == Fault::wrong_lr_decay_style)
      st.opt_param_scheduler.lr_decay_style = st.opt_param_scheduler.lr_decay_style == "cosine" ? "linear" : "cosine";
    if (job.fault == Fault::reset_step_counter)
      for (size_t g = 0; g < tr.optimizer().num_groups(); ++g) tr.optimizer().set_step_count(g, 0);
    tr.set_state(st, /*restore_rng=*/job.fault != Fault::skip_rng_restore);
    if (!quiet) {
      char took[96];
      std::snprintf(took, sizeof took, "; verified in %.3f s, restored in %.3f s", report.verify_seconds,
                    report.apply_seconds);
      std::cout << "loaded " << report.dir << " (iteration " << report.iteration << took << ")\n";
      for (const auto& c : report.conversions) std::cout << "  conversion: " << c << "\n";
      if (job.fault != Fault::none) std::cout << "  fault injected: " << to_string(job.fault) << "\n";
    }
    if (job.dump_states && !job.out_dir.empty()) dump_state(tr, out / "state_after_load", group.get());
    fingerprints += fingerprint_now(tr.iteration());
  } else {
    fingerprints += fingerprint_now(0);
  }

  auto save = [&](const char* dump_name) {
    if (job.dump_states && !job.out_dir.empty()) dump_state(tr, out / dump_name, group.get());
    const auto res = save_state(tr, job.save_root, job.policy, group.get());
    if (!quiet)
      std::printf("saved %s: %llu bytes, %.3f bytes/param\n", res.dir.c_str(),
                  static_cast<unsigned long long>(res.total_bytes), res.bytes_per_param);
  };

  std::vector<IterMetrics> rows;
  while (tr.iteration() < stop) {
    auto m = tr.train_iteration();
    rows.push_back(m);
    fingerprints += fingerprint_now(m.iteration);
    if (!quiet) {
      std::printf("iter %4lld | lm loss %.6f | aux loss %.6f | grad norm %.4f | lr %.3e | "
                  "num zeros %lld | %.0f tokens/s\n",
                  static_cast<long long>(m.iteration), static_cast<double>(m.lm_loss),
                  static_cast<double>(m.aux_loss), m.grad_norm, m.lr,
                  static_cast<long long>(m.num_zeros), m.tokens_per_s);
      std::fflush(stdout);
    }
    if (m.iteration == job.save_at) save("state_at_save");
  }
  if (!job.save_root.empty() && job.save_at < 0) save("state_at_save");
  if (job.dump_states && !job.out_dir.empty()) dump_state(tr, out / "state_final", group.get());
  if (write_out) {
    write_metrics_csv((out / "metrics.csv").string(), rows);
    write_timing_csv((out / "timing.csv").string(), rows);
    write_text(out / "fingerprints.csv", fingerprints);
  }
  return 0;
}

}  // namespace rh
