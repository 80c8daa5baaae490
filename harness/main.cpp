// resume-harness: the command-line tool. Subcommands parse flags into library structs and call
// rh_core; all logic lives in the library so the tests exercise the same code.
// Exit codes: 0 success, 1 a check/scenario missed its expectation or a checkpoint is damaged,
// 2 bad input (flags, scenario files, checkpoints that cannot be loaded), 3 a data-parallel peer
// failed or timed out (the launcher reports which rank failed first).
#include <CLI/CLI.hpp>

#include <iostream>

#include "harness/checkpoint/checkpoint.h"
#include "harness/commands.h"
#include "harness/dist.h"
#include "harness/env.h"
#include "harness/run.h"
#include "harness/version.h"

namespace {

void add_save_options(CLI::App& app, rh::TrainJob& job, std::string& policy,
                      std::vector<std::string>& overrides, std::string& compress) {
  app.add_option("--save-compress", compress, "none | zstd: byte planes + zstd blocks, lossless")
      ->check(CLI::IsMember({"none", "zstd"}));
  app.add_option("--save", job.save_root, "checkpoint root to save into when stopping");
  app.add_option("--save-policy", policy, "native | fp32 | per_key")
      ->check(CLI::IsMember({"native", "fp32", "per_key"}));
  app.add_option("--save-override", overrides,
                 "KEY=DTYPE: write optimizer key (master_param, exp_avg, exp_avg_sq) in DTYPE");
}

// "resume-harness frobnicate": CLI11 would say only that an argument was not expected.
std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  std::string names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->check_name(argv[1])) return "";
    names += (names.empty() ? "" : ", ") + sub->get_name();
  }
  return std::string("unknown subcommand '") + argv[1] + "'; the subcommands are " + names +
         " (resume-harness --help)";
}

}  // namespace

int main(int argc, char** argv) {
  rh::pin_cross_machine_numerics(argv);
  CLI::App app{"resume-harness: proves (or disproves) that a training run resumes bit for bit"};
  app.require_subcommand(1);
  app.set_version_flag("--version", [] { return rh::describe(rh::runtime_info()); },
                       "print the version, git commit, LibTorch, BLAS and its core, then exit");
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string where = a->get_parent() ? a->get_name() + " " : "";
    return std::string(rh::kErrorPrefix) + where + e.what() + " (run with --help for the options)\n";
  });

  rh::TrainJob job;
  std::string policy = "native", fault = "none", compress = "none";
  std::vector<std::string> overrides;
  auto* train = app.add_subcommand("train", "train a run, optionally stopping, saving or resuming");
  train->add_option("--out", job.out_dir, "output directory for metrics.csv, timing.csv, "
                                          "fingerprints.csv")->default_val("reports/train");
  train->add_option_function<std::string>(
           "--config",
           [&job](const std::string& file) { job.cfg = rh::load_run_config_file(file); },
           "run config JSON (as written to config.json / manifests); later flags override it")
      ->trigger_on_parse();
  train->add_option("--save-at", job.save_at, "save a checkpoint after this iteration and go on");
  train->add_option("--stop-at", job.stop_at, "stop after this iteration (default: --train-iters)");
  train->add_option("--load", job.load, "resume from this checkpoint root or iter_ directory");
  train->add_option("--fault", fault, "deliberate fault on load (for the resume check; needs --load)")
      ->check(CLI::IsMember(rh::fault_names()))
      ->default_str("none");
  train->add_flag("--allow-lossy", job.allow_lossy, "accept lossy conversions on load");
  train->add_flag("--dump-states", job.dump_states, "write lossless state dumps for comparison");
  train->add_flag("--quiet", job.quiet, "print nothing but errors");
  int nproc = 1;
  train->add_option("--nproc", nproc,
                    "data parallel: start N local worker processes (ranks) of this command; under "
                    "torchrun or srun leave it out, the ranks come from the environment")
      ->check(CLI::Range(1, 256));
  train->add_option("--dist-timeout", job.dist_timeout_s,
                    "seconds a data-parallel rendezvous or collective waits before failing")
      ->check(CLI::PositiveNumber);
  add_save_options(*train, job, policy, overrides, compress);
  rh::add_run_options(*train, job.cfg);

  std::string inspect_dir;
  auto* inspect = app.add_subcommand("inspect", "verify a checkpoint and list its tensors");
  inspect->add_option("CKPT_DIR", inspect_dir, "checkpoint root or iter_ directory")->required();

  rh::register_commands(app);

  if (const std::string bad = unknown_subcommand(app, argc, argv); !bad.empty()) {
    std::cerr << rh::kErrorPrefix << bad << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {   // thrown while parsing, e.g. by --config's loader
    std::cerr << rh::kErrorPrefix << e.what() << "\n";
    return 2;
  }
  try {
    if (*train) {
      job.fault = rh::parse_fault(fault);
      job.remainders_flag_given = train->get_option("--store-param-remainders")->count() > 0;
      job.policy = rh::parse_policy(policy, overrides);
      job.policy.compress = rh::ckpt::parse_compression(compress);
      if (nproc > 1) {
        if (rh::dist::launched_by_environment())
          throw std::invalid_argument("--nproc " + std::to_string(nproc) +
                                      ": WORLD_SIZE (or SLURM_NTASKS) is set, so a launcher already started the ranks");
        std::vector<std::string> args;   // the same command for every rank, without --nproc
        for (int i = 1; i < argc; ++i) {
          const std::string a = argv[i];
          if (a == "--nproc") { ++i; continue; }
          if (a.rfind("--nproc=", 0) == 0) continue;
          args.push_back(a);
        }
        return rh::dist::launch_local(nproc, args, std::min(30.0, job.dist_timeout_s));
      }
      return rh::run_train(job);
    }
    if (*inspect) return rh::ckpt::inspect_checkpoint(inspect_dir, std::cout);
    return rh::run_commands(app);
  } catch (const rh::dist::DistError& e) {   // a peer failed: not this rank's input
    std::cerr << rh::kErrorPrefix << e.what() << "\n";
    return 3;
  } catch (const std::exception& e) {
    std::cerr << rh::kErrorPrefix << e.what() << "\n";
    return 2;
  }
}
