// Fuzz entry point of the scenario loader (needs rh_core; see entries.h).
#include <string>

#include "harness/checkpoint/errors.h"
#include "harness/verify/scenario.h"
#include "tests/fuzz/entries.h"

namespace rh::fuzz {

Outcome scenario(const uint8_t* data, size_t size) {
  try {
    const auto all = load_scenarios_text(std::string(reinterpret_cast<const char*>(data), size), "fuzz.toml");
    for (const auto& s : all) (void)safe_name(s.name);   // every accepted name maps to a directory
    return kAccepted;
  } catch (const std::invalid_argument&) {   // ScenarioError and the config layer's errors
    return kRefused;
  } catch (const ckpt::CheckpointError&) {
    return kRefused;
  }
}

}   // namespace rh::fuzz
