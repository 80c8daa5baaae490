// Accuracy and disk-size reports of a matrix run directory: report.md, report.html (plots
// embedded) and PNG plots drawn by reports/plots.py. Reads only what the harness wrote
// (summary.csv, per-scenario CSVs, disk.csv), never the harness's in-memory state.
#pragma once
#include <ostream>
#include <string>
#include <vector>

namespace CLI {
class App;
}

namespace rh {

struct ReportCommand {
  CLI::App* cmd = nullptr;
  std::string run_dir;
  std::string compare_a, compare_b;   // --compare RUN_A RUN_B
  std::string models_file;            // projection models (default reports/models.toml)
  bool md_image_links = false;        // --md-image-links: report.md links plots/*.png as images
  bool json = false;                  // --compare --json: one JSON object instead of Markdown
  bool verbose = false;               // -v: also name what was read and every file written
  std::vector<std::string> merge;     // --merge OUT_DIR SHARD_DIR...: run by the cli room (harness/verify/merge.h),
                                      // which then writes the report into OUT_DIR
  bool active() const;
};

void register_report_command(CLI::App& app, ReportCommand& rc);
int run_report_command(const ReportCommand& rc, std::ostream& out);

// Writes report.md / report.html / plots into run_dir. Returns 0, or 2 for a malformed run dir
// (the error names the file and line).
int write_report(const std::string& run_dir, std::ostream& out);
// The same with the projection models taken from models_file ("" = reports/models.toml); with
// md_image_links, report.md links the plots as images (see render_markdown in document.h); with
// verbose, out also gets what was read and every file written.
int write_report(const std::string& run_dir, const std::string& models_file, std::ostream& out,
                 bool md_image_links = false, bool verbose = false);

}   // namespace rh
