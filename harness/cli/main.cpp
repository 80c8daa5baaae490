// resume-harness: the command-line tool. Every subcommand is registered in cli/commands.cpp and
// run by tool_main; all logic lives in the library (rh_core), so the tests exercise the same code.
// Exit codes: 0 success, 1 a check/scenario missed its expectation or a checkpoint is damaged,
// 2 bad input (flags, scenario files, checkpoints that cannot be loaded), 3 a data-parallel peer
// failed or timed out (the launcher reports which rank failed first), 4 the disk failed (no space,
// quota, I/O error, read-only filesystem; the message names the path). SIGTERM, SIGINT or SIGHUP
// end it with 128 + the signal, after every process it started is stopped (process/supervise.h).
#include "harness/cli/commands.h"
#include "harness/process/supervise.h"
#include "harness/train/env.h"

int main(int argc, char** argv) {
  rh::pin_cross_machine_numerics(argv);   // may re-execute this process (env.h)
  rh::terminate_children_on_signal();
  return rh::tool_main(argc, argv);
}
