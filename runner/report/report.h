// `runner report RUN_DIR`: one self-contained RUN_DIR/report.html (inline SVG, no scripts,
// fonts or network) from what a run directory holds: metrics.jsonl (step, eval, monitor,
// alert and summary records), plan.json, recipe.yaml and profile.json when there is one.
// A run still in progress works (no summary, a cut last line is skipped), and so does a
// multi-rank one (per-rank breakdown and profile.rankR.json files).
#pragma once
#include <filesystem>
#include <string>

namespace runner {

struct ReportInfo {
  std::filesystem::path path;  // RUN_DIR/report.html
  int steps = 0;               // step records read
  int skipped_lines = 0;       // lines that did not parse (a run still writing its last one)
  bool finished = false;       // a summary record was there
  bool profiled = false;       // profile.json was there
};

// Throws UserError when RUN_DIR is not a run directory (no metrics.jsonl or no step record).
ReportInfo write_report(const std::filesystem::path& run_dir);

}  // namespace runner
