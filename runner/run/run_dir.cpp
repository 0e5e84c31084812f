// A run's directory (see run_dir.h).
#include "runner/run/run_dir.h"

#include <filesystem>
#include <fstream>
#include <optional>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"
#include "runner/plan/relayout.h"
#include "runner/run/run_lock.h"

namespace fs = std::filesystem;

namespace runner {

RunPaths run_paths(const Recipe& r, const std::string& cli_run_dir) {
  RunPaths p;
  p.run_dir = !cli_run_dir.empty() ? cli_run_dir
              : !r.train.run_dir.empty() ? r.train.run_dir
                                         : (fs::path("runs") / r.name).string();
  p.checkpoint_dir = r.checkpoint.dir.empty() ? (fs::path(p.run_dir) / "checkpoints").string() : r.checkpoint.dir;
  return p;
}

std::string source_run_dir(const std::string& src) {
  const fs::path p = fs::absolute(fs::path(src)).lexically_normal();
  if (fs::is_directory(p)) return p.string();
  const fs::path dir = p.parent_path();
  return (dir.filename() == "checkpoints" ? dir.parent_path() : dir).string();
}

std::string checkpoint_phrase(int64_t step) {
  return step >= 0 ? fmt::format("checkpoint {}", step) : std::string("no checkpoint yet");
}

std::string resumed_phrase(int64_t step) {
  return step >= 0 ? fmt::format("resumed from step {}", step) : std::string("started over from step 0 (no checkpoint yet)");
}

std::string run_tokenizer_dir(const std::string& run_dir) { return (fs::path(run_dir) / "tokenizer").string(); }

ResumeRequest prepare_resume(const std::string& run_dir, const std::vector<std::string>& overrides, int64_t step,
                             bool strict) {
  if (!fs::is_directory(run_dir))
    throw UserError({run_dir, 0, 0}, "not a run directory", "pass the directory `runner train` wrote (runs/NAME)");
  // Something `runner train` leaves in every run directory, from its lock on: otherwise this is
  // another directory, said as `runner status` says it, and nothing is written in it (taking
  // the lock below would leave a runner.lock behind).
  bool a_run = false;
  for (const char* f : {"recipe.yaml", "metrics.jsonl", "events.jsonl", "runner.lock", "checkpoints"})
    a_run = a_run || fs::exists(fs::path(run_dir) / f);
  if (!a_run)
    throw UserError({run_dir, 0, 0}, "not a run directory (no recipe.yaml, metrics.jsonl or checkpoints/)",
                    "pass the directory `runner train` wrote (runs/NAME, or its --run-dir)");
  // The checkpoint directory: the run's resolved recipe may place it elsewhere.
  const fs::path saved = fs::path(run_dir) / "recipe.yaml";
  std::string ckpt_dir = run_paths(Recipe{}, run_dir).checkpoint_dir;
  if (fs::exists(saved)) ckpt_dir = run_paths(load_recipe(saved.string()), run_dir).checkpoint_dir;
  std::optional<ResumePoint> point = choose_resume_point(ckpt_dir, step, strict);
  if (!point) {
    // A live owner that has not written its first checkpoint yet: name it, as `runner train`
    // does (its temporary file is a write in flight, not left over).
    if (auto owner = RunLock::holder(run_dir)) RunLock::throw_in_use(run_dir, *owner);
    // A run killed before its first checkpoint left its temporary file: remove it.
    if (auto lock = RunLock::try_take(run_dir)) cleanup_stale(ckpt_dir);
    throw UserError({ckpt_dir, 0, 0}, "no checkpoint to resume from (the run stopped before its first checkpoint)",
                    fs::exists(saved) ? fmt::format("start it again: `runner train {} --run-dir {}` (its stored "
                                                    "recipe) or `runner train RECIPE --run-dir {}`",
                                                    saved.string(), run_dir, run_dir)
                                      : "start the run with `runner train RECIPE`");
  }
  ResumeRequest req{load_recipe_text(read_recipe_text(point->path), saved.string(), overrides), *point, {}};
  const std::vector<std::string> again = rederive_for_new_layout(req.recipe);
  if (!again.empty())
    req.notes.push_back(fmt::format("the overrides change the layout of step {}'s checkpoint: {} derived again for the "
                                    "new layout, global batch {}", point->step, fmt::join(again, " and "),
                                    req.recipe.batch.global));
  return req;
}

std::vector<nlohmann::json> read_jsonl(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    try {
      out.push_back(nlohmann::json::parse(line));
    } catch (const nlohmann::json::exception&) {
      // a line torn by a kill
    }
  }
  return out;
}

}  // namespace runner
