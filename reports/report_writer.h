// The throwing core of write_report (report.h), exposed so tests can inspect what was produced
// and catch the ReportError itself rather than parse stderr.
#pragma once
#include <ostream>
#include <string>
#include <vector>

#include "reports/plots_runner.h"

namespace rh::report {

struct ReportFiles {
  std::string markdown, html;   // paths written
  PlotOutcome plots;
};

// Reads run_dir, draws the plots, writes report.md and report.html; progress lines go to log.
// Throws ReportError for a run directory (or models file) that is missing or malformed.
// md_image_links: report.md links plots/*.png as images instead of naming them (document.h);
// verbose: log also names what was read and every file written.
ReportFiles generate_report(const std::string& run_dir, const std::string& models_file, std::ostream& log,
                            bool md_image_links = false, bool verbose = false);

}   // namespace rh::report
