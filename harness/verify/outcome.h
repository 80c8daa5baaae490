// The verdict type of a resume check: what the check found, one name per case. check.cpp decides
// it, the matrix writes it into result.json, summary.csv and summary.json, and the report and
// `report --compare` read it back through parse_outcome. LibTorch-free (the reports room uses it).
#pragma once
#include <string>

namespace rh {

enum class Outcome {
  identical,          // every metric and state after resume equals the uninterrupted run's, bit for bit
  within_tolerance,   // differs, within the tolerance the scenario declares
  diverged,           // differs (what a deliberate fault must give)
  load_refused,       // the resumed run refused the checkpoint (load_result.json says why)
  error,              // the check itself could not run (a child crashed, a file was missing)
  nondeterministic,   // an external trainer's uninterrupted runs differ from each other: resume is not judged
};

// "identical", "within-tolerance", "diverged", "load-refused", "error", "nondeterministic": the names in every file.
const char* to_string(Outcome o);
// The inverse; throws std::invalid_argument naming the text and the valid names.
Outcome parse_outcome(const std::string& s);

// An external cell's diagnosis: diagnosis.h.

}   // namespace rh
