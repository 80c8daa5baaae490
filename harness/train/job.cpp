// One training process; see job.h. run_train reads as its phases: check the flags, join the
// data-parallel group, build the trainer, resume (writing load_result.json), train and save,
// write the outputs. Faults, save plans, load results and fingerprints have files of their own.
#include "harness/train/job.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "harness/base/no_follow.h"
#include "harness/base/phases.h"
#include "harness/base/text.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/ranks/group.h"
#include "harness/train/env.h"
#include "harness/train/fingerprints.h"
#include "harness/train/schedule.h"
#include "harness/train/trainer.h"

namespace fs = std::filesystem;

namespace rh {

namespace {

// Saves the trainer's state under `root` with `policy`.
ckpt::SaveResult save_state(const Trainer& trainer, const std::string& root, const ckpt::SavePolicy& policy,
                            dist::Group* group) {
  ckpt::SaveInput save_input;
  save_input.group = group;
  save_input.model = &trainer.model();
  save_input.optimizer = &trainer.optimizer();
  auto train_state = trainer.state();
  save_input.state = &train_state;
  save_input.run_config = to_json(trainer.config());
  save_input.policy = policy;
  return ckpt::save_checkpoint(root, save_input);
}

// A lossless dump of the in-memory state (native policy), for the state comparisons.
void dump_state(const Trainer& trainer, const fs::path& root, dist::Group* group) {
  save_state(trainer, root.string(), {ckpt::SavePolicyKind::native, {}}, group);
}

// Every flag is checked before anything is built or written (config.json, the model).
void check_job(const TrainJob& job, int64_t stop) {
  const RunConfig& cfg = job.cfg;
  if (stop > cfg.train.iterations || stop < 0)
    throw std::invalid_argument("--stop-at " + std::to_string(stop) + " is outside [0, " +
                                std::to_string(cfg.train.iterations) + "]");
  if (job.save_at < -1 || job.save_at == 0)
    throw std::invalid_argument("--save-at " + std::to_string(job.save_at) + ": expected an iteration >= 1");
  if (job.save_at >= 0 && job.saves.empty())
    throw std::invalid_argument("--save-at needs --save (the checkpoint root)");
  if (job.save_at > stop)
    throw std::invalid_argument("--save-at " + std::to_string(job.save_at) + " is after the last iteration " +
                                std::to_string(stop));
  if (job.fault != Fault::none && job.load.empty())
    throw std::invalid_argument("--fault " + to_string(job.fault) + " acts on load: it needs --load");
  if (!job.load.empty()) {
    std::error_code ec;
    if (!fs::exists(job.load, ec)) throw std::invalid_argument("--load " + job.load + ": no such file or directory");
  }
  // Everything this job writes into --out (the state dumps are checkpoint roots): a planted link
  // there would have its target overwritten.
  if (!job.out_dir.empty())
    refuse_symlinks_below(job.out_dir, {"config.json", "metrics.csv", "timing.csv", "fingerprints.csv", "phases.json",
                                        kLoadResultFile, "state_at_save", "state_after_load", "state_final"});
}

// What one process of the job holds while it runs.
struct Run {
  explicit Run(const TrainJob& j) : job(j) {}
  const TrainJob& job;
  std::unique_ptr<dist::Group> group;
  bool lead = true, quiet = false, write_out = false;
  fs::path out;
  std::unique_ptr<Trainer> tr;
  std::string fingerprints = "iteration,key,xxh3\n";
  PhaseTimes phases;   // phases.json (base/phases.h)

  void fingerprint(int64_t iteration) {
    PhaseTimes::Scope timed(phases, "fingerprint");
    const auto fp = all_fingerprints(*tr, group.get());
    if (lead) fingerprints += fingerprint_rows(iteration, fp);
  }
  void dump(const char* name) {
    PhaseTimes::Scope timed(phases, "dump");
    if (job.dump_states && !job.out_dir.empty()) dump_state(*tr, out / name, group.get());
  }
};

// Joins the data-parallel group (if the environment places this process in one), builds the
// trainer and prints what it runs.
void start(Run& run) {
  const TrainJob& job = run.job;
  const dist::Placement place = dist::placement_from_environment();
  if (place.world_size > 1)
    run.group =
        std::make_unique<dist::Group>(place,
                                      std::chrono::milliseconds(static_cast<int64_t>(job.dist_timeout_s * 1000)));
  run.lead = place.rank == 0;
  run.quiet = job.quiet || !run.lead;
  run.out = job.out_dir;
  run.write_out = run.lead && !job.out_dir.empty();
  if (run.write_out) fs::create_directories(run.out);
  const auto info = runtime_info();
  if (!run.quiet) {
    std::cout << describe(info) << "\n";
    if (!info.blas_is_openblas) std::cout << "WARNING: OpenBLAS is not the BLAS in use; runs are about 12x slower\n";
    std::cout << describe(job.cfg);
  }
  run.tr = std::make_unique<Trainer>(job.cfg, run.group.get());
  if (!run.quiet) {
    if (run.group) std::cout << "data parallel: " << place.world_size << " ranks (" << place.source << ")\n";
    std::cout << run.tr->model().describe() << "\n" << run.tr->optimizer().describe() << "\n";
    if (job.remainders_flag_given && !run.tr->optimizer().remainders_note().empty())
      std::cout << "WARNING: --store-param-remainders: " << run.tr->optimizer().remainders_note() << "\n";
  }
  if (run.write_out) write_text((run.out / "config.json").string(), to_json(job.cfg).dump(2) + "\n");
}

// Loads the checkpoint into the trainer's model and optimizer; every rank refuses if one does,
// with the first refusal's reason.
ckpt::LoadReport load_into(Run& run, ckpt::TrainState& train_state) {
  const TrainJob& job = run.job;
  ckpt::LoadOptions opts;
  opts.allow_lossy = job.allow_lossy;
  opts.exact_master_conversion = job.exact_master_conversion;
  opts.exact_rebucket = job.exact_rebucket;
  opts.skip_keys = fault_skip_keys(job.fault);
  ckpt::LoadReport report;
  optim::RankOutcome mine;   // a failure's flag: the checkpoint is damaged
  try {
    report = ckpt::load_checkpoint(job.load, run.tr->model(), run.tr->optimizer(), train_state, to_json(job.cfg), opts);
  } catch (const std::exception& e) {
    if (!run.group) throw;
    const auto* checkpoint_error = dynamic_cast<const ckpt::CheckpointError*>(&e);
    mine.ok = false;
    mine.error = e.what();
    mine.flag = checkpoint_error && checkpoint_error->damaged;
  }
  if (run.group) {
    const optim::Agreement agreement = optim::agree(run.group.get(), mine);
    if (!agreement.ok()) {
      ckpt::CheckpointError refusal(agreement.failure());
      refusal.damaged = agreement.flag;
      throw refusal;
    }
    run.tr->optimizer().sync_params();   // a conversion may have written only the owned parts
  }
  return report;
}

void write_load_result(const Run& run, const nlohmann::json& result) {
  if (run.write_out) rh::write_load_result(run.out.string(), run.job.load, result);
}

const char* error_kind(const std::exception& e) {
  if (dynamic_cast<const dist::DistError*>(&e)) return "peer";
  if (dynamic_cast<const ckpt::CheckpointError*>(&e)) return "checkpoint";
  if (dynamic_cast<const std::invalid_argument*>(&e)) return "input";
  return "internal";
}

// phases.json: seconds per phase of this process (rank 0's; `ranks` processes ran alike), the
// iterations it trained, its fsync seconds (inside save and dump) and its total from run_train's
// start.
void write_phases(Run& run, size_t iterations, std::chrono::steady_clock::duration total, double fsync_s) {
  nlohmann::json phases_json = {{"ranks", run.group ? run.group->size() : 1},
                                {"iterations", iterations},
                                {"seconds", run.phases.seconds()},
                                {"fsync", fsync_s},
                                {"total", std::chrono::duration<double>(total).count()}};
  write_text((run.out / "phases.json").string(), ckpt::dump_text(phases_json, 2) + "\n");
}

// The load itself, timed as phase "load": the checkpoint into the model and optimizer, the
// scheduler state checked against this run's, the faults, load_result.json either way.
void load_and_restore(Run& run) {
  PhaseTimes::Scope timed(run.phases, "load");
  const TrainJob& job = run.job;
  ckpt::TrainState train_state = run.tr->state();
  ckpt::LoadReport report;
  try {
    report = load_into(run, train_state);
    // Megatron's load_checkpoint hands state_dict['opt_param_scheduler'] to the scheduler this
    // run built (checkpointing.py load_checkpoint -> OptimizerParamScheduler.load_state_dict):
    // every saved value is checked against this run's, or taken from one side by the flags.
    train_state.opt_param_scheduler =
        load_scheduler_state(scheduler_from_config(job.cfg), train_state.opt_param_scheduler,
                             scheduler_args_from_config(job.cfg), "checkpoint " + report.dir);
  } catch (const std::exception& e) {
    nlohmann::json refused = {{"status", "refused"}, {"error_kind", error_kind(e)}, {"message", e.what()}};
    if (const auto* checkpoint_error = dynamic_cast<const ckpt::CheckpointError*>(&e)) {
      refused["damaged"] = checkpoint_error->damaged;   // what inspect refuses too (exit 1), not this run's refusal (2)
      if (!checkpoint_error->file.empty()) refused["file"] = checkpoint_error->file;
      if (!checkpoint_error->tensor.empty()) refused["tensor"] = checkpoint_error->tensor;
    }
    write_load_result(run, refused);
    throw;
  }
  inject_state_fault(job.fault, job.cfg, *run.tr, train_state);
  run.tr->set_state(train_state, /*restore_rng=*/!spec_of(job.fault).fresh_rng);
  write_load_result(run, {{"status", "loaded"}, {"iteration", report.iteration}, {"conversions", report.conversions}});
  if (!run.quiet) {
    char took[96];
    std::snprintf(took, sizeof took, "; verified in %.3f s, restored in %.3f s", report.verify_seconds,
                  report.apply_seconds);
    std::cout << "loaded " << report.dir << " (iteration " << report.iteration << took << ")\n";
    for (const auto& c : report.conversions) std::cout << "  conversion: " << c << "\n";
    if (job.fault != Fault::none) std::cout << "  fault injected: " << to_string(job.fault) << "\n";
  }
}

// Resumes from job.load: the fresh state's fingerprints (negative-control material), the load,
// the state dump after it and the fingerprints at K.
void resume(Run& run) {
  run.fingerprint(-1);
  load_and_restore(run);
  run.dump("state_after_load");
  run.fingerprint(run.tr->iteration());
}

// The state dump, then every checkpoint of the plan, one after the other (a save only reads
// the state: the fingerprints of the next iteration prove it).
void save_all(Run& run) {
  run.dump("state_at_save");
  PhaseTimes::Scope timed(run.phases, "save");
  for (const auto& target : run.job.saves) {
    const auto saved = save_state(*run.tr, target.root, target.policy, run.group.get());
    if (!run.quiet)
      std::printf("saved %s: %llu bytes, %.3f bytes/param\n", saved.dir.c_str(),
                  static_cast<unsigned long long>(saved.total_bytes), saved.bytes_per_param);
    if (!run.quiet && run.job.verbose)
      for (const auto& [key, bytes] : saved.bytes_per_key)
        std::printf("  %-16s %14llu bytes\n", key.c_str(), static_cast<unsigned long long>(bytes));
  }
}

std::vector<IterMetrics> train_until(Run& run, int64_t stop) {
  std::vector<IterMetrics> rows;
  while (run.tr->iteration() < stop) {
    const auto t0 = std::chrono::steady_clock::now();
    auto metrics = run.tr->train_iteration();
    run.phases.add("train", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    rows.push_back(metrics);
    run.fingerprint(metrics.iteration);
    if (!run.quiet) {
      std::printf(
          "iter %4lld | lm loss %.6f | aux loss %.6f | grad norm %.4f | lr %.3e | "
          "num zeros %lld | %.0f tokens/s\n",
          static_cast<long long>(metrics.iteration), static_cast<double>(metrics.lm_loss),
          static_cast<double>(metrics.aux_loss), metrics.grad_norm, metrics.lr,
          static_cast<long long>(metrics.num_zeros), metrics.tokens_per_s);
      std::fflush(stdout);
    }
    if (metrics.iteration == run.job.save_at) save_all(run);
  }
  return rows;
}

}   // namespace

int run_train(const TrainJob& job) {
  validate(job.cfg);
  configure_determinism(static_cast<int>(job.cfg.train.threads));
  const int64_t stop = job.stop_at < 0 ? job.cfg.train.iterations : job.stop_at;
  check_job(job, stop);
  const auto t0 = std::chrono::steady_clock::now();
  const double fsync0 = ckpt::fsync_seconds();
  Run run(job);
  {
    PhaseTimes::Scope timed(run.phases, "setup");
    start(run);
  }
  if (!job.load.empty()) {
    resume(run);
  } else {
    run.fingerprint(0);
  }
  const auto rows = train_until(run, stop);
  if (!job.saves.empty() && job.save_at < 0) save_all(run);
  run.dump("state_final");
  if (run.write_out) {
    PhaseTimes::Scope timed(run.phases, "outputs");
    write_metrics_csv((run.out / "metrics.csv").string(), rows);
    write_timing_csv((run.out / "timing.csv").string(), rows);
    write_text((run.out / "fingerprints.csv").string(), run.fingerprints);
  }
  if (run.write_out)
    write_phases(run, rows.size(), std::chrono::steady_clock::now() - t0, ckpt::fsync_seconds() - fsync0);
  if (!run.quiet && job.verbose) {   // the same seconds as phases.json
    std::printf("seconds per phase (this process):");
    for (const auto& [phase, seconds] : run.phases.seconds()) std::printf(" %s %.3f", phase.c_str(), seconds);
    std::printf("; fsync %.3f; total %.3f\n", ckpt::fsync_seconds() - fsync0,
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  return 0;
}

}   // namespace rh
