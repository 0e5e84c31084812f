// The resume chooser (see resume.h).
#include "runner/checkpoint/resume.h"

#include <algorithm>
#include <filesystem>
#include <stdexcept>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "parallel/comm.h"
#include "runner/agree.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/isolated.h"
#include "runner/checkpoint/state_shards.h"
#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

std::vector<std::string> resume_candidates(const std::string& dir, int64_t step, spdlog::logger& log) {
  const std::vector<int64_t> steps = list_checkpoint_steps(dir);
  const std::string latest = read_latest(dir);
  if (steps.empty() && latest.empty()) return {};
  int64_t first = -1;
  if (step >= 0) {
    if (std::find(steps.begin(), steps.end(), step) == steps.end()) {
      std::string have;
      for (auto x : steps) have += (have.empty() ? "" : ", ") + std::to_string(x);
      throw UserError(SourceLoc{dir, 0, 0},
                      fmt::format("no checkpoint for step {} (this directory holds steps: {})", step, have.empty() ? "none" : have),
                      "pick one of those with --step, or omit --step to resume from LATEST");
    }
    first = step;
  } else if (latest.empty()) {
    log.warn("{} has no valid LATEST (a crash before the first LATEST was written, or it was removed); trying the newest "
             "step file",
             dir);
    first = steps.back();
  } else {
    parse_checkpoint_file_name(latest, &first);
  }
  std::vector<std::string> out{checkpoint_file_name(first)};
  for (auto it = steps.rbegin(); it != steps.rend(); ++it)
    if (*it < first) out.push_back(checkpoint_file_name(*it));
  return out;
}

std::optional<ResumePoint> choose_resume_point(const std::string& checkpoint_dir, int64_t step, bool strict,
                                               std::shared_ptr<spdlog::logger> log) {
  const std::vector<std::string> cands =
      resume_candidates(checkpoint_dir, step, log ? *log : *spdlog::default_logger_raw());
  if (cands.empty()) return std::nullopt;
  ResumePoint point;
  std::vector<std::string> failures;
  for (const std::string& name : cands) {
    const std::string path = (fs::path(checkpoint_dir) / name).string();
    try {
      verify_checkpoint_isolated(path);
    } catch (const UserError& e) {
      if (strict) throw;
      failures.push_back(e.what());
      point.skipped.push_back(fmt::format("checkpoint {} does not verify: {}", path, e.what()));
      continue;
    }
    point.path = path;
    parse_checkpoint_file_name(name, &point.step);
    if (!point.skipped.empty())
      point.skipped.push_back(fmt::format("resuming from {} (step {}) instead of {}: newer checkpoints did not verify "
                                          "(see above; --strict makes this an error)",
                                          path, point.step, cands[0]));
    return point;
  }
  std::string all;
  for (auto& f : failures) all += "\n  " + f;
  throw UserError(SourceLoc{checkpoint_dir, 0, 0}, "no checkpoint in this directory verifies:" + all,
                  "check them with `runner inspect FILE`; to start over, use a new run directory");
}

int64_t load_resume_point(const ResumePoint& point, const Plan& plan, parallel::Grid& grid, TrainState& st,
                          std::shared_ptr<spdlog::logger> log) {
  const bool multi = grid.world_size() > 1;
  int64_t step = -1;
  agree(grid.world(), [&] {
    const bool fp32_state = st.params.values.empty() || st.params.values[0].dtype() == ops::DType::F32;
    if (!multi && fp32_state) {  // the logical tensors are this rank's tensors
      load_checkpoint_file(point.path, st);
      step = st.step;
    } else {
      // Each rank reads the logical tensors of its own parameters and keeps its slice, so a
      // checkpoint of any layout resumes on this one.
      const parallel::Coords c = grid.coords();
      TrainState t = logical_template(*plan.layout, c.pp, grid.rank(), grid.world_size());
      load_checkpoint_file(point.path, t, /*subset=*/true);
      step = t.step;
      const int64_t threads = st.omp_threads;
      load_local_from_logical(*plan.layout, c.pp, c.tp, t, st);
      st.omp_threads = threads;  // this run's, not the checkpoint's
    }
    (log ? *log : *spdlog::default_logger_raw()).info("resumed from {} (step {})", point.path, step);
  });
  if (multi) {  // every rank must continue from the same step
    int64_t lo = step, hi = step;
    grid.world().allreduce_min(&lo, 1);
    grid.world().allreduce_max(&hi, 1);
    if (lo != hi)
      throw std::runtime_error(fmt::format("ranks loaded different checkpoints (steps {} to {}); is the checkpoint "
                                           "directory on a file system all ranks share?", lo, hi));
  }
  return step;
}

}  // namespace runner
