// The one exception type of the checkpoint layer, in its own header so the safetensors and file
// helpers can raise it without pulling in the optimizer. Messages name the file, the tensor or key,
// what was found and what was expected.
#pragma once
#include <stdexcept>
#include <string>
#include <utility>

namespace rh::ckpt {

// Raised for every problem with a checkpoint on disk or its compatibility; the message names the
// file, the tensor or key, and what was expected.
struct CheckpointError : std::runtime_error {
  using std::runtime_error::runtime_error;
  CheckpointError(const std::string& message, std::string file_, std::string tensor_ = "")
      : std::runtime_error(message), file(std::move(file_)), tensor(std::move(tensor_)) {}
  // Where known, for load_result.json: the file (its path) and the tensor or key the error is about.
  std::string file, tensor;
  // The checkpoint itself is damaged (what `inspect` refuses: a checksum, a truncated, missing or
  // malformed file; exit 1), not a valid checkpoint this run refuses (exit 2).
  bool damaged = false;
};

}   // namespace rh::ckpt
