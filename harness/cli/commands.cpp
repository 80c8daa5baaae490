// Every subcommand, registered here (train, inspect, check, matrix, report); see commands.h.
#include "harness/cli/commands.h"

#include <CLI/CLI.hpp>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>
#include <filesystem>
#include <iostream>
#include <set>
#include <sstream>
#include <stdexcept>

#include "harness/checkpoint/manifest.h"
#include "harness/cli/inspect_external.h"
#include "harness/checkpoint/manifest_reader.h"
#include "harness/ranks/group.h"
#include "harness/ranks/launcher.h"
#include "harness/process/prestart.h"
#include "harness/process/process.h"
#include "harness/base/text.h"
#include "harness/checkpoint/checked_io.h"
#include "harness/base/version.h"
#include "harness/train/env.h"
#include "harness/train/job.h"
#include "harness/verify/matrix.h"
#include "harness/verify/merge.h"
#include "harness/base/suggest.h"
#include "harness/base/data_files.h"
#include "reports/report.h"

namespace rh {
namespace {

constexpr const char* kDefaultScenarioFile = "scenarios/default.toml";
constexpr int kExitDisk = 4;   // an I/O failure of the disk (harness/base/text.h DiskError)

// What the parsed flags fill in, one member per subcommand.
struct CommandState {
  CLI::App* train_cmd = nullptr;
  TrainJob job;
  std::string policy = "native", fault = "none", compress = "none", save_root, save_plan;
  std::vector<std::string> overrides;
  std::set<std::string> config_keys;   // "section.key" set by --config
  int nproc = 1;
  CLI::App* inspect_cmd = nullptr;
  std::string inspect_dir;
  bool inspect_quiet = false, report_quiet = false;   // -q: the exit code alone
  bool inspect_verbose = false;                       // inspect -v: files and training state too
  bool inspect_json = false;                          // inspect --json
  MatrixOptions check, matrix;
  std::string shard;   // matrix --shard I/N
  bool list = false;   // check/matrix --list
  bool no_report = false;
  CLI::App* check_cmd = nullptr;
  CLI::App* matrix_cmd = nullptr;
  ReportCommand report;
};

void register_train(CLI::App& app, CommandState& state) {
  auto* train = state.train_cmd = app.add_subcommand("train", "train a run, optionally stopping, saving or resuming");
  TrainJob& job = state.job;
  train
      ->add_option("--out", job.out_dir,
                   "output directory for metrics.csv, timing.csv, "
                   "fingerprints.csv")
      ->default_val("runs/train");
  train
      ->add_option_function<std::string>(
          "--config",
          [&state](const std::string& file) { state.job.cfg = load_run_config_file(file, &state.config_keys); },
          "run config JSON (as written to config.json / manifests); later flags override it")
      ->trigger_on_parse();
  train->add_option("--save-at", job.save_at, "save a checkpoint after this iteration and go on");
  train->add_option("--stop-at", job.stop_at, "stop after this iteration (default: --train-iters)");
  train->add_option("--load", job.load,
                    "resume from this checkpoint root or iter_ directory "
                    "(writes load_result.json into --out); model, optimizer and "
                    "training settings not given as flags are the checkpoint's");
  train->add_option("--fault", state.fault, "deliberate fault on load (for the resume check; needs --load)")
      ->check(CLI::IsMember(fault_names()))
      ->default_str("none");
  train->add_flag("--allow-lossy", job.allow_lossy, "accept lossy conversions on load");
  train->add_flag("--exact-master-conversion", job.exact_master_conversion,
                  "not upstream: convert a checkpoint's master mode on load exactly (int16 remainder + bf16 "
                  "weight <-> fp32/fp16 master, a widened fp32 remainder back to int16) where upstream "
                  "TransformerEngine fails its set_scaled_state dtype assertion");
  train->add_flag("--exact-rebucket", job.exact_rebucket,
                  "not upstream: load a dp_reshardable checkpoint saved with another bucket layout "
                  "(--ddp-bucket-size) by re-cutting its states exactly, where Megatron's "
                  "load_parameter_state_from_dp_reshardable asserts the per-bucket sizes equal");
  train->add_flag("--dump-states", job.dump_states, "write lossless state dumps for comparison");
  auto* tq = train->add_flag("-q,--quiet", job.quiet, "print nothing but errors");
  train
      ->add_flag("-v,--verbose", job.verbose,
                 "also print the bytes per key of each checkpoint saved and the "
                 "seconds per phase at the end")
      ->excludes(tq);
  train
      ->add_option("--nproc", state.nproc,
                   "data parallel: start N local worker processes (ranks) of this command; under "
                   "torchrun or srun leave it out, the ranks come from the environment")
      ->check(CLI::Range(1, 256));
  train
      ->add_option("--dist-timeout", job.dist_timeout_s,
                   "seconds a data-parallel rendezvous or collective waits before failing")
      ->check(CLI::PositiveNumber);
  train->add_option("--save-compress", state.compress, "none | zstd: byte planes + zstd blocks, lossless")
      ->check(CLI::IsMember({"none", "zstd"}));
  train->add_option("--save", state.save_root, "checkpoint root to save into when stopping");
  train->add_option("--save-policy", state.policy, ckpt::save_policy_help())
      ->check(CLI::IsMember(ckpt::save_policy_names()));
  train->add_option("--save-override", state.overrides,
                    "KEY=DTYPE: write optimizer key (master_param, exp_avg, exp_avg_sq) in DTYPE");
  train->add_option("--save-plan", state.save_plan,
                    "JSON file of several checkpoints to write of the same state (root, policy, "
                    "overrides, compress each; docs/running.md, 'Shared baselines')");
  add_run_options(*train, job.cfg);
}

void add_matrix_options(CLI::App& command, MatrixOptions& options, const std::string& default_run_dir, bool& list) {
  options.jobs = static_cast<int>(std::clamp(std::thread::hardware_concurrency(), 1u, 64u));
  command.add_option("-j,--jobs", options.jobs, "scenarios run at a time (default: this machine's cores)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  command.add_flag("--list", list, "print the scenarios this selects (filter and --shard applied), run nothing");
  auto* quiet = command.add_flag_callback(
      "-q,--quiet", [&options] { options.verbosity = 0; }, "print only the scenarios that failed and the closing line");
  command
      .add_flag_callback(
          "-v,--verbose", [&options] { options.verbosity = 2; }, "also print each scenario's directory")
      ->excludes(quiet);
  command.add_option("--junit", options.junit_path, "also write junit.xml to PATH (CI test reports)");
  command.add_option("--run-dir", options.run_dir, "run directory")->default_str(default_run_dir);
  command.add_flag("--keep-checkpoints", options.keep_checkpoints,
                   "keep each scenario's checkpoint in the run directory");
  command.add_option("--golden", options.golden_dir, "compare each baseline's metrics bitwise with golden CSVs in DIR");
  command.add_flag("--update-golden", options.update_golden, "rewrite the golden CSVs instead of comparing");
}

void register_check_and_matrix(CLI::App& app, CommandState& state) {
  // Both take the scenario file as -f/--file; matrix also as its first argument (matrix FILE).
  state.check.file = kDefaultScenarioFile;
  state.check_cmd = app.add_subcommand("check", "run the resume check of one scenario (or those matching a filter)");
  state.check_cmd
      ->add_option("SCENARIO", state.check.filter,
                   "canonical scenario name, a substring of names, or a glob with * (required but with --list, "
                   "which alone lists every scenario of the file)");
  state.check_cmd->add_option("-f,--file", state.check.file, "scenario file")->capture_default_str();
  add_matrix_options(*state.check_cmd, state.check, "runs/check", state.list);
  state.matrix_cmd = app.add_subcommand("matrix", "run every scenario of a matrix file and write a run directory");
  auto* pos = state.matrix_cmd->add_option("FILE", state.matrix.file, "scenario file, e.g. scenarios/default.toml");
  state.matrix_cmd->add_option("-f,--file", state.matrix.file, "scenario file (the same as FILE)")->excludes(pos);
  state.matrix_cmd->add_option("--filter", state.matrix.filter, "only scenarios matching this name/substring/glob");
  state.matrix_cmd->add_flag("--no-report", state.no_report, "do not write report.md / report.html at the end");
  state.matrix_cmd
      ->add_option("--shard", state.shard,
                   "I/N: run only the I-th of N parts (cells sharing a baseline stay together; every runner "
                   "computes the same split); merge the parts with `report --merge`. Writes no report");
  add_matrix_options(*state.matrix_cmd, state.matrix, "runs/<file stem>", state.list);
}

// train --load: every run-config flag not given (nor set by --config) takes the checkpoint's
// saved value, as Megatron's --use-checkpoint-args; a given model flag that contradicts the saved
// model is refused naming both values. Other given differences (a new schedule, other state
// dtypes, a master-mode conversion) are the loader's to accept or refuse, and are listed.
void adopt_checkpoint_config(CommandState& state) {
  TrainJob& job = state.job;
  std::string mpath;
  nlohmann::json manifest;
  try {
    mpath =
        (std::filesystem::path(ckpt::detail::resolve_checkpoint_dir(job.load)) / ckpt::detail::kManifestFile).string();
    manifest = ckpt::detail::read_manifest_file(mpath);   // verified by the load itself
  } catch (const ckpt::CheckpointError&) {
    return;   // the load itself reports what is missing or damaged, with its exit code
  }
  if (!manifest.is_object() || !manifest.contains("run_config")) return;
  auto given = [&state](const std::string& section, const std::string& key, const std::string& flag) {
    auto count = [&](const std::string& f) {
      const CLI::Option* o = state.train_cmd->get_option_no_throw(f);
      return o != nullptr && o->count() > 0;
    };
    return state.config_keys.count(section + "." + key) > 0 || count(flag) || count("--no-" + flag.substr(2));
  };
  const auto changes = adopt_saved_config(job.cfg, manifest["run_config"], given, mpath + ": run_config");
  std::string listed;
  for (const auto& c : changes) {
    if (c.section == "model")
      throw ckpt::CheckpointError("config mismatch: " + mpath + " was saved with " + c.flag + "=" + c.saved +
                                  ", this run has " + c.flag + "=" + c.now +
                                  " (leave the flag out to resume with the saved value)");
    listed += " " + c.flag + "=" + c.now + " (saved " + c.saved + ")";
  }
  const char* rank = std::getenv("RANK");   // one line per run: rank 0's, not the launcher's
  if (!listed.empty() && !job.quiet && state.nproc <= 1 && (rank == nullptr || std::string(rank) == "0"))
    std::cout << "train: resuming with settings that differ from the checkpoint's:" << listed << "\n";
}

int run_train_command(CommandState& state, int argc, char** argv) {
  TrainJob& job = state.job;
  if (!job.load.empty()) adopt_checkpoint_config(state);
  job.fault = parse_fault(state.fault);
  job.remainders_flag_given = state.train_cmd->get_option("--store-param-remainders")->count() > 0;
  if (!state.save_root.empty()) {
    SaveTarget t{state.save_root, ckpt::parse_save_policy_args(state.policy, state.overrides)};
    t.policy.compress = ckpt::parse_compression(state.compress);
    job.saves.push_back(t);
  }
  if (!state.save_plan.empty())
    for (const auto& t : read_save_plan(state.save_plan)) job.saves.push_back(t);
  if (state.nproc > 1) {
    if (dist::launched_by_environment())
      throw std::invalid_argument("--nproc " + std::to_string(state.nproc) +
                                  ": WORLD_SIZE (or SLURM_NTASKS) is set, so a launcher already started the ranks");
    std::vector<std::string> args;   // the same command for every rank, without --nproc
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--nproc") {
        ++i;
        continue;
      }
      if (a.rfind("--nproc=", 0) == 0) continue;
      args.push_back(a);
    }
    return dist::launch_local(state.nproc, args, std::min(30.0, job.dist_timeout_s));
  }
  return run_train(job);
}

// A scenario file or golden directory as given (relative to the working directory), else the
// installed copy beside the tool: share/resume-harness/<given>, then .../scenarios/<given>, so
// `check -f ci.toml` and `--golden scenarios/golden/ci` work from any directory.
std::string installed_or_given(const std::string& given) {
  std::error_code ec;
  if (given.empty() || std::filesystem::path(given).is_absolute() || std::filesystem::exists(given, ec)) return given;
  for (const std::string& cand : {data_file(given), data_file("scenarios/" + given)})
    if (cand != given && std::filesystem::exists(cand, ec)) return cand;
  return given;   // refused later, naming what was given
}

int run_matrix_command(CommandState& state, CLI::App* cmd, MatrixOptions& options) {
  if (options.file.empty())
    throw std::invalid_argument(std::string(cmd->get_name()) + ": give the scenario file (FILE or -f FILE)");
  if (cmd == state.check_cmd && options.filter.empty() && !state.list)
    throw std::invalid_argument(
        "check: give a SCENARIO (a name, a substring of names or a glob with *); `check -f FILE --list` lists them");
  // ./scenarios/default.toml or ./FILE, else the copy beside the tool (an install).
  options.file = installed_or_given(options.file);
  if (!options.update_golden) options.golden_dir = installed_or_given(options.golden_dir);
  options.tool = self_executable();
  options.progress_tty = isatty(STDOUT_FILENO) != 0;
  // Resumed runs start from a worker forked now, before any scenario is read or trained
  // (process/prestart.h); RH_NO_PRESTART=1 starts each by exec instead.
  const char* no_prestart = std::getenv("RH_NO_PRESTART");
  if (!(no_prestart && std::string(no_prestart) == "1")) start_prestarted_worker(&tool_main);
  if (cmd == state.check_cmd && options.run_dir.empty()) options.run_dir = "runs/check";
  if (cmd == state.matrix_cmd && !state.shard.empty()) options.shard = parse_shard(state.shard);
  if (state.list) {
    for (const auto& n : list_matrix(options)) std::cout << n << "\n";   // refuses a filter that selects nothing
    return 0;
  }
  auto matrix = run_matrix(options, std::cout);
  if (cmd == state.check_cmd)
    for (const auto& result : matrix.results) {
      if (options.verbosity == 0 && result.passed) continue;
      std::cout << result.name << ": " << result.verdict << "\n";
      if (!result.explanation.empty())
        std::cout << "  diagnosis: " << result.diagnosis << ": " << result.explanation << "\n";
      for (const auto& n : result.notes) std::cout << "  note: " << n << "\n";
    }
  if (cmd == state.matrix_cmd && !state.no_report && !options.shard.active()) {
    const std::string dir = options.run_dir.empty() ? default_run_dir(options.file) : options.run_dir;
    std::ostream nowhere(nullptr);
    if (write_report(dir, "", options.verbosity == 0 ? nowhere : std::cout, /*md_image_links=*/false,
                     /*verbose=*/options.verbosity == 2) == 2)
      return 2;
  }
  return matrix.exit_code;
}


// report --merge OUT_DIR SHARD_DIR...: merge.h, then the report of the merged run directory.
int run_merge_command(const ReportCommand& rc) {
  const std::filesystem::path out = rc.merge.front();
  std::vector<std::filesystem::path> shards(rc.merge.begin() + 1, rc.merge.end());
  const MergeResult merged = merge_shards(out, shards, std::cout);   // MergeError: exit 2 (bad input)
  if (write_report(out.string(), rc.models_file, std::cout, rc.md_image_links, rc.verbose) == 2) return 2;
  return merged.failed ? 1 : 0;
}

// "resume-harness frobnicate": CLI11 would say only that an argument was not expected.
std::string unknown_subcommand(const CLI::App& app, int argc, char** argv) {
  if (argc < 2 || argv[1][0] == '-') return "";
  std::string names;
  std::vector<std::string> list;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    if (sub->check_name(argv[1])) return "";
    names += (names.empty() ? "" : ", ") + sub->get_name();
    list.push_back(sub->get_name());
  }
  return std::string("unknown subcommand '") + argv[1] + "'" + did_you_mean(argv[1], list) + "; the subcommands are " +
         names + " (resume-harness --help)";
}

void register_commands(CLI::App& app, CommandState& state) {
  register_train(app, state);
  state.inspect_cmd = app.add_subcommand(
      "inspect", "verify a checkpoint and list its tensors (a torch or DCP checkpoint: its tensors and values)");
  state.inspect_cmd->add_option("CKPT_DIR", state.inspect_dir, "checkpoint root or iter_ directory; or a torch.save file, a directory of them, a "
                                "torch.distributed.checkpoint directory or safetensors files (listed as the "
                                "external-trainer check reads them)")
      ->required();
  auto* iq =
      state.inspect_cmd->add_flag("-q,--quiet", state.inspect_quiet, "print nothing but errors: the exit code says it");
  state.inspect_cmd
      ->add_flag("--json", state.inspect_json,
                 "print what inspect finds as one JSON object on stdout (keys in docs/running.md, "
                 "\"inspect --json\"); the exit code is the same")
      ->excludes(iq);
  state.inspect_cmd
      ->add_flag("-v,--verbose", state.inspect_verbose,
                 "also list each file (bytes, XXH3-64, checksummed blocks) and the saved training state "
                 "(iteration, samples, scheduler, generators, data-parallel shards)")
      ->excludes(iq)
      ->excludes("--json");
  register_check_and_matrix(app, state);
  register_report_command(app, state.report);
  auto* rq = state.report.cmd->add_flag("-q,--quiet", state.report_quiet, "print nothing but errors");
  state.report.cmd->add_flag("-v,--verbose", state.report.verbose, "also name what was read and every file written")
      ->excludes(rq);
}

// inspect; with -q only a damaged or bad-input verdict is printed (the exit code says the rest).
// A torch.save file, a directory of them, a DCP directory or safetensors files that are not the
// tool's own checkpoint: listed as the external-trainer check reads them (inspect_external.h).
int run_inspect_command(CommandState& state) {
  if (is_external_checkpoint(state.inspect_dir)) {
    if (state.inspect_json)
      throw std::invalid_argument("inspect --json: " + state.inspect_dir +
                                  " is not one of this tool's checkpoints (no manifest.json); --json lists only "
                                  "those (leave --json out to list a torch or DCP checkpoint)");
    return inspect_external(state.inspect_dir, std::cout, state.inspect_quiet);
  }
  if (state.inspect_json) {   // the object on stdout; a refusal's one line on stderr too, as without --json
    std::ostringstream doc;
    const int rc = ckpt::inspect_checkpoint(state.inspect_dir, doc, /*json=*/true);
    std::cout << doc.str();
    if (rc != 0) {
      const nlohmann::json j = nlohmann::json::parse(doc.str());
      std::cerr << kErrorPrefix << j.value("error", std::string()) << "\n";
    }
    return rc;
  }
  if (!state.inspect_quiet)
    return ckpt::inspect_checkpoint(state.inspect_dir, std::cout, /*json=*/false, /*verbose=*/state.inspect_verbose);
  std::ostringstream listing;
  const int rc = ckpt::inspect_checkpoint(state.inspect_dir, listing);
  std::istringstream lines(listing.str());
  for (std::string line; std::getline(lines, line);)
    if (rc != 0 && (line.rfind("DAMAGED", 0) == 0 || line.rfind(kErrorPrefix, 0) == 0)) std::cout << line << "\n";
  return rc;
}

int run_command(CommandState& state, int argc, char** argv) {
  if (*state.train_cmd) return run_train_command(state, argc, argv);
  std::ostream nowhere(nullptr);   // -q: a stream that drops what is written to it
  if (*state.inspect_cmd) return run_inspect_command(state);
  if (*state.check_cmd) return run_matrix_command(state, state.check_cmd, state.check);
  if (*state.matrix_cmd) return run_matrix_command(state, state.matrix_cmd, state.matrix);
  if (state.report.active() && !state.report.merge.empty()) return run_merge_command(state.report);
  if (state.report.active()) return run_report_command(state.report, state.report_quiet ? nowhere : std::cout);
  return 2;
}

}   // namespace

// CLI11 prints an option taking several values as "TYPE x N"; where the type name already says
// what it takes ("RUN_A RUN_B", "OUT_DIR SHARD_DIR..."), the count is left out.
class HelpFormatter : public CLI::Formatter {
 public:
  std::string make_option_opts(const CLI::Option* opt) const override {
    std::string opts = CLI::Formatter::make_option_opts(opt);
    if (opt->get_type_name().find(' ') != std::string::npos) {
      const std::string count = " x " + std::to_string(opt->get_expected());
      if (const size_t at = opts.find(opt->get_type_name() + count); at != std::string::npos)
        opts.erase(at + opt->get_type_name().size(), count.size());
    }
    return opts;
  }
};

int tool_main(int argc, char** argv) {
  set_tool_entry(&tool_main);   // the launcher's ranks run it in forks of this process (process.h)
  CLI::App app{"resume-harness: proves (or disproves) that a training run resumes bit for bit"};
  app.formatter(std::make_shared<HelpFormatter>());
  app.require_subcommand(1);
  app.set_version_flag(
      "--version", [] { return describe(runtime_info()); },
      "print the version, git commit, LibTorch, BLAS and its core, then exit");
  app.failure_message([](const CLI::App* a, const CLI::Error& e) {
    std::string where = a->get_parent() ? a->get_name() + " " : "";
    // An unknown flag: the closest of this subcommand's flags, if one is close.
    std::string hint;
    if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr) {
      std::vector<std::string> flags;
      std::vector<const CLI::App*> apps{a};
      for (const CLI::App* sub : a->get_subcommands()) apps.push_back(sub);   // the one given
      for (const CLI::App* ap : apps)
        for (const CLI::Option* opt : ap->get_options()) {
          for (const auto& l : opt->get_lnames()) flags.push_back("--" + l);
          for (const auto& s : opt->get_snames()) flags.push_back("-" + s);
        }
      // An unknown flag comes first: the words after it (its value, the scenario) are extras only
      // because the flag was not known.
      for (const auto& extra : a->remaining(/*recurse=*/true)) {
        if (extra.rfind("-", 0) != 0 || extra == "-") continue;
        const std::string flag = extra.substr(0, extra.find('='));
        // The extras reach the top-level app: name the subcommand they were given to.
        const std::string sub = a->get_parent()                ? a->get_name()
                                : !a->get_subcommands().empty() ? a->get_subcommands().front()->get_name()
                                                                : std::string();
        return std::string(kErrorPrefix) + (sub.empty() ? "" : sub + ": ") + "unknown option '" + flag + "'" + did_you_mean(flag, flags) +
               " (run with --help for the options)\n";
      }
    }
    return std::string(kErrorPrefix) + where + e.what() + hint + " (run with --help for the options)\n";
  });
  CommandState state;
  register_commands(app, state);
  if (const std::string bad = unknown_subcommand(app, argc, argv); !bad.empty()) {
    std::cerr << kErrorPrefix << bad << "\n";
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;
  } catch (const std::exception& e) {   // thrown while parsing, e.g. by --config's loader
    std::cerr << kErrorPrefix << e.what() << "\n";
    return 2;
  }
  try {
    return run_command(state, argc, argv);
  } catch (const dist::DistError& e) {   // a peer failed: not this rank's input
    std::cerr << kErrorPrefix << ckpt::printable_text(e.what()) << "\n";
    return is_disk_error_message(e.what()) ? kExitDisk : 3;
  } catch (const ckpt::CheckpointError& e) {
    // A damaged checkpoint exits 1 as `inspect` does; a valid one this run refuses is bad input.
    std::cerr << kErrorPrefix << ckpt::printable_text(e.what()) << "\n";
    if (is_disk_error_message(e.what())) return kExitDisk;
    return e.damaged ? 1 : 2;
  } catch (const std::exception& e) {
    // The disk (ENOSPC, EDQUOT, EIO, EROFS), also when a save passed the error between ranks as
    // text, is not bad input.
    std::cerr << kErrorPrefix << ckpt::printable_text(e.what()) << "\n";   // a path need not be UTF-8
    return dynamic_cast<const DiskError*>(&e) != nullptr || is_disk_error_message(e.what()) ? kExitDisk : 2;
  }
}

}   // namespace rh
