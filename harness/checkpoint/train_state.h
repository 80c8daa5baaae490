// Everything besides tensors that a resumed run needs to continue exactly: the iteration, the
// data position, the LR schedule's own counter, and every random-number generator's state.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace rh::ckpt {

struct LRScheduleState {
  double max_lr = 0.0;
  double min_lr = 0.0;
  int64_t warmup_iters = 0;
  int64_t decay_iters = 0;      // total schedule length, fixed by config, not by where a run stops
  int64_t num_steps = 0;        // steps taken so far (the counter a "reset LR schedule" fault zeroes)
};

struct TrainState {
  int64_t iteration = 0;          // completed iterations
  int64_t consumed_samples = 0;   // data position: index of the next sample to read
  LRScheduleState lr;
  std::map<std::string, std::vector<uint8_t>> rng_states;  // generator name -> get_state() bytes
};

}  // namespace rh::ckpt
