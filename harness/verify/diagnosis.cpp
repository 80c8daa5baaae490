// The diagnoses' table; see diagnosis.h.
#include "harness/verify/diagnosis.h"

namespace rh {

namespace {

struct DiagnosisRow {
  Diagnosis diagnosis;
  const char* code;
  const char* cause;
};

// In the enum's order (to_string indexes it).
constexpr DiagnosisRow kDiagnoses[] = {
    {Diagnosis::none, "none", ""},
    {Diagnosis::nondeterministic, "nondeterministic",
     "the trainer is not reproducible, so resume is not judged. Seed every RNG, use deterministic algorithms, and "
     "pin threads (e.g. --deterministic-mode, CUBLAS_WORKSPACE_CONFIG, one data-loader order)"},
    {Diagnosis::before_save, "before-save",
     "its computation depends on the number of iterations it is given (e.g. an LR schedule over --iters; give the "
     "schedule its own length and stop with an exit interval) or on the save itself"},
    {Diagnosis::saved_state, "saved-state", "what is saved depends on stopping there"},
    {Diagnosis::round_trip, "round-trip", "the load (or the save) does not restore that state exactly"},
    {Diagnosis::after_load, "after-load",
     "it is not saved, or not restored, or restored and then changed (e.g. a re-seed)"},
    {Diagnosis::not_in_checkpoint, "not-in-checkpoint",
     "what differs is not in the state probed after load: data order or position, an RNG stream or mode the probe "
     "does not see, or a schedule derived from the process start"},
    {Diagnosis::resumed_metrics, "resumed-metrics", ""},
    {Diagnosis::final_state, "final-state",
     "a state that does not (yet) reach the logged metrics was not resumed exactly"},
    {Diagnosis::not_restored, "not-restored",
     "the state the resumed run computes with is not the uninterrupted run's: not saved (data position, an RNG "
     "stream), saved lossily in both runs, or restored into the wrong place (optimizer state by position); the "
     "probe (trainer.probe) tells which"},
    {Diagnosis::lossy_save, "lossy-save",
     "optimizer state saved narrower than it is held loses bits at every save: the uninterrupted run goes on with "
     "the wide copy, the resumed run with the narrowed one; save it in the dtype it is held in"},
    {Diagnosis::metadata, "metadata",
     "every tensor and every logged metric is equal; if the value is expected to vary between runs (a time, a host "
     "name), declare its key in trainer.checkpoint.ignore with the reason"},
    {Diagnosis::within_noise, "within-noise",
     "the trainer is not bitwise reproducible; judged against its own run-to-run spread, the resume changes "
     "nothing measurable"},
    {Diagnosis::beyond_noise, "beyond-noise",
     "more than the trainer's own run-to-run noise: the resume changes the computation (add the checkpoint "
     "comparison or the probe on a deterministic setting to find what)"},
};

const DiagnosisRow& row_of(Diagnosis d) { return kDiagnoses[static_cast<int>(d)]; }

}   // namespace

const char* to_string(Diagnosis d) { return row_of(d).code; }

const char* cause_of(Diagnosis d) { return row_of(d).cause; }

bool is_diagnosis_code(const std::string& s) {
  for (const auto& row : kDiagnoses)
    if (s == row.code) return true;
  return false;
}

std::string diagnosis_codes() {
  std::string out;
  for (const auto& row : kDiagnoses) out += (out.empty() ? "" : ", ") + std::string(row.code);
  return out;
}

}   // namespace rh
