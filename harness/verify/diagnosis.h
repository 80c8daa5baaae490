// An external cell's diagnosis (external_check.h): where its resume first goes wrong, one name per
// case, with the fixed wording of the cause it points to. The check names the first that applies,
// in this order: nondeterministic, before-save, saved-state, round-trip, after-load,
// lossy-save / not-in-checkpoint / not-restored / resumed-metrics, final-state, metadata; none
// when nothing differs. Its code is what
// result.json, summary.csv and the verdict say; scenario files assert it with expect_diagnosis.
// LibTorch-free.
#pragma once
#include <string>

namespace rh {

enum class Diagnosis {
  none,                // nothing compared differs
  nondeterministic,    // two uninterrupted runs differ: resume is not judged
  before_save,         // the interrupted run differs from the uninterrupted one before any save
  saved_state,         // the checkpoint saved at K differs from the uninterrupted run's at K
  round_trip,          // load K, train nothing, save: the checkpoint changes
  after_load,          // the probed state right after load differs from the state at K
  not_in_checkpoint,   // the resumed run differs while its probed state after load was identical
  resumed_metrics,     // the resumed run differs (the saved state not known to be identical)
  final_state,         // every metric is equal, the final checkpoint differs
  not_restored,        // the resumed run differs while the saved checkpoint is identical
  lossy_save,          // ... and it holds optimizer state narrower than its parameters
  metadata,            // only non-tensor metadata differs; every tensor and metric is equal
  within_noise,        // trainer.noise: every metric within the run-to-run spread
  beyond_noise,        // trainer.noise: a metric differs beyond it
};

// "none", "nondeterministic", "before-save", "saved-state", "round-trip", "after-load",
// "not-in-checkpoint", "resumed-metrics", "final-state", "not-restored", "lossy-save", "metadata", "within-noise", "beyond-noise".
const char* to_string(Diagnosis d);
// The cause the diagnosis points to, in words, which follows the cell's facts in its explanation
// ("<facts>: <cause>"); "" for none and resumed-metrics, whose explanation is the facts alone.
const char* cause_of(Diagnosis d);

// Whether `s` is one of the codes above, and the codes as a list ("none, nondeterministic, ...").
bool is_diagnosis_code(const std::string& s);
std::string diagnosis_codes();

}   // namespace rh
