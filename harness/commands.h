// Subcommands beyond train/inspect (check, matrix, report), registered on the tool's CLI11 app
// by the rooms that own them, and small shared flag parsers.
#pragma once
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"

namespace CLI {
class App;
}

namespace rh {

// Parses "--save-policy" and "KEY=DTYPE" overrides; throws std::invalid_argument.
ckpt::SavePolicy parse_policy(const std::string& policy, const std::vector<std::string>& overrides);

void register_commands(CLI::App& app);
// Runs whichever registered subcommand was parsed; returns its exit code.
int run_commands(CLI::App& app);

}  // namespace rh
