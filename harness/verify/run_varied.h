// Values the harness itself varies between an external cell's runs, recognized in what a trainer
// saved (external_checkpoints.h): the directories it gives each run ({save_dir}, {load_dir},
// {run_dir}), the iteration count it gives the interrupted run ({iterations} = K), and the
// user's own difference between `command` and `resume_command` (--init_from=scratch / resume).
// Trainers save their arguments (Megatron its whole args namespace, nanoGPT-style scripts a config
// dict), so two runs identical in every tensor differ in these texts; they compare as the
// placeholder or argument they came from. Numeric state is never matched this way unless it is
// the value of an argument of the same name (a saved `train_iters` equal to --train-iters).
// LibTorch-free.
#pragma once
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace rh::external {

// What the harness gave one run: its placeholder values and its argument list, before and after
// expansion (command or resume_command, then trainer.args).
struct RunSide {
  std::map<std::string, std::string> vars;
  std::vector<std::string> argv_template, argv;
};

// A saved leaf's text as the bridge writes it ("str:/x/save", "int:20", "path:...", "bool:true")
// under `key` ("config/out_dir"). When a_text (saved by run a) and b_text (run b) differ only by
// what the harness varied between the runs, returns what they were matched as: "{save_dir}",
// "{iterations}", "argument max_iters={iterations}", "argument init_from (command: scratch,
// resume_command: resume)". nullopt when they differ otherwise.
std::optional<std::string> harness_varied(const std::string& key, const std::string& a_text,
                                          const std::string& b_text, const RunSide& a, const RunSide& b);

// A flag's name as a saved key's last component would spell it: leading dashes dropped, '-' as
// '_', lower case ("--Train-Iters" -> "train_iters").
std::string flag_key(const std::string& name);

// A glob over saved keys: '*' any run of characters ('/' included), '?' one character.
bool key_glob_match(const std::string& glob, const std::string& key);

}   // namespace rh::external
