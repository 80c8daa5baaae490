// The one exception type of the checkpoint layer, in its own header so the safetensors and file
// helpers can raise it without pulling in the optimizer. Messages name the file, the tensor or key,
// what was found and what was expected.
#pragma once
#include <stdexcept>
#include <string>

namespace rh::ckpt {

// Raised for every problem with a checkpoint on disk or its compatibility; the message names the
// file, the tensor or key, and what was expected.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace rh::ckpt
