// The local launcher behind `train --nproc N`: starts N ranks of this executable with torchrun's
// variables set, through the one child-process runner (process.h).
#pragma once
#include <string>
#include <vector>

namespace rh::dist {

// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it, close).
int free_local_port();

// Starts N worker processes of this executable with `args` (argv without the executable and
// without --nproc) and RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a free local port)
// set, waits for all of them, and returns 0 when every rank succeeded. When a rank fails the
// others get `grace_s` seconds to notice (their collectives fail) and are then killed; the launcher
// prints which rank failed first and how, and returns that rank's exit code (2 stays 2: bad input
// or a refused load; a rank killed by a signal is a peer failure: 3). Workers die with the
// launcher (PR_SET_PDEATHSIG).
int launch_local(int nproc, const std::vector<std::string>& args, double grace_s);

}   // namespace rh::dist
