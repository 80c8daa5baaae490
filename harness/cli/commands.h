// Every subcommand of the tool, registered on its CLI11 app in one place (train, inspect, check,
// matrix, report).
#pragma once
#include <string>
#include <vector>

#include "harness/checkpoint/checkpoint.h"

namespace rh {

// The tool with its argv: registers every subcommand on a new CLI11 app, parses, runs the one
// given and maps errors to exit codes (0 ok, 1 a scenario missed its expectation or a checkpoint
// is damaged, 2 bad input, 3 a data-parallel peer failed). main() is this after pinning the
// numerics; the pre-started worker (process/prestart.h) runs it in its children.
int tool_main(int argc, char** argv);

}   // namespace rh
