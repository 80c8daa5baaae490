// The fuzz entry points: one per parser that reads files from outside. The libFuzzer targets
// (fuzz_target.cpp, built by scripts/fuzz.sh with clang) and the corpus replay tests (built
// normally, run by CTest) call the same functions.
// Each returns kAccepted when the input parsed, kRefused when it was refused with the parser's
// own error type (CheckpointError, ScenarioError, std::invalid_argument); any other exception
// (std::bad_alloc, nlohmann's type_error, std::out_of_range, ...) escapes: a finding.
#pragma once
#include <cstddef>
#include <cstdint>

namespace rh::fuzz {

enum Outcome { kAccepted = 0, kRefused = 1 };

Outcome safetensors_header(const uint8_t* data, size_t size);   // parse_safetensors (whole file bytes)
Outcome manifest(const uint8_t* data, size_t size);             // parse_manifest_text + check_counters
Outcome pointer(const uint8_t* data, size_t size);              // parse_pointer_text
Outcome scenario(const uint8_t* data, size_t size);             // load_scenarios_text (needs rh_core)

}   // namespace rh::fuzz
