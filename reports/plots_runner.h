// Drawing the report's PNG plots: writes the plot inputs (plots/index.csv, plots/storage.csv,
// derived from the same parsed values as the tables) and runs reports/plots.py, which reads only
// CSVs. The interpreter is $RH_PYTHON (default /usr/bin/python3, which has Debian's matplotlib),
// the script $RH_PLOTS_SCRIPT (default reports/plots.py in the data directory, harness/base/data_files.h). Plotting never fails the
// report: a missing interpreter or matplotlib gives a clear message and the tables are written.
#pragma once
#include <string>
#include <vector>

#include "reports/tables.h"

namespace rh::report {

// File names of the plots, in the order the report shows them (under RUN_DIR/plots/).
inline constexpr const char* kLossPlot = "loss_curves.png";
inline constexpr const char* kDlossPlot = "dloss.png";
inline constexpr const char* kDiskPlot = "disk_bytes.png";
inline constexpr const char* kUlpPlot = "ulp_heatmap.png";

struct PlotOutcome {
  bool ok = false;
  std::string message;                // why plots are missing, or "" when ok
  std::vector<std::string> written;   // "plots/<name>.png" that exist afterwards
};

// Exit status of plots.py when matplotlib cannot be imported.
inline constexpr int kNoMatplotlibExit = 3;

void write_plot_inputs(const RunData& run, const std::vector<Combo>& combos);
PlotOutcome run_plots(const RunData& run);

}   // namespace rh::report
