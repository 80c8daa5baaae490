// Golden metrics: the CI gate compares every baseline's metrics.csv bit for bit with a committed
// CSV (scenarios/golden/ci/<safe name>.csv), so a change in what training computes fails CI even
// when every resume stays exact.
#pragma once
#include <string>

namespace rh {

// "" if the two metrics CSVs are bit-identical, else the first difference
// ("iteration 3: lm_loss golden 0x1.6p+2 vs run 0x1.5p+2").
std::string compare_golden(const std::string& golden_csv, const std::string& actual_csv);

// The golden step of one check: with update, copies actual over golden and returns ""; else ""
// when they match, or the failing verdict's text ("no golden metrics ...", "baseline differs from
// golden ...: <difference>", "golden comparison: <error>").
std::string golden_failure(const std::string& golden_csv, const std::string& actual_csv, bool update);

}   // namespace rh
