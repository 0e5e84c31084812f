// `runner status RUN_DIR` (see slurm.h): read-only, from the files a run writes: recipe.yaml,
// metrics.jsonl, events.jsonl and the checkpoint directory.
#include <sys/stat.h>

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"
#include "runner/run/slurm.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

std::vector<nlohmann::json> read_jsonl(const fs::path& path) {
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

std::string age(double seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 90) return fmt::format("{:.0f} s", seconds);
  if (seconds < 5400) return fmt::format("{:.0f} min", seconds / 60);
  if (seconds < 172800) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} days", seconds / 86400);
}

// Why the job that started with `start` ended, from the record after it (none: killed).
std::string cause_of(const nlohmann::json* end) {
  if (!end) return "killed without a stop record (SIGKILL, a crash, a node loss or a time limit without warning)";
  const std::string cause = end->value("cause", "?");
  if (cause == "preempted")
    return fmt::format("preempted by {} at step {} (checkpoint written)", end->value("signal", "a signal"),
                       end->value("step", int64_t{-1}));
  return fmt::format("{} at step {} (exit {})", cause, end->value("step", int64_t{-1}), end->value("exit_code", 0));
}

// The recipe as resolved: name (into s), the total steps and the checkpoint directory.
void status_recipe(const fs::path& dir, nlohmann::json& s, int64_t& total, fs::path& ckpt_dir) {
  try {
    YAML::Node y = YAML::LoadFile((dir / "recipe.yaml").string());
    s["name"] = y["name"] ? y["name"].as<std::string>() : "";
    if (y["train"] && y["train"]["steps"]) total = y["train"]["steps"].as<int64_t>();
    if (y["checkpoint"] && y["checkpoint"]["dir"] && !y["checkpoint"]["dir"].as<std::string>().empty())
      ckpt_dir = y["checkpoint"]["dir"].as<std::string>();
  } catch (const YAML::Exception&) {
    // no or unreadable recipe.yaml: what the other files say still holds
  }
  s["total_steps"] = total;
}

// Steps: metrics.jsonl, one record per step (the end-of-run summary has "summary").
struct StepRecords {
  int64_t last_step = 0;
  std::vector<double> step_ms;
  bool summary = false;
};

StepRecords status_steps(const fs::path& dir, nlohmann::json& s, double now) {
  StepRecords r;
  double loss = 0;
  for (const auto& j : read_jsonl(dir / "metrics.jsonl")) {
    if (j.contains("summary")) r.summary = true;
    if (!j.contains("step") || !j.contains("loss") || !j.contains("step_ms")) continue;
    r.last_step = std::max(r.last_step, j["step"].get<int64_t>());
    loss = j["loss"].get<double>();
    r.step_ms.push_back(j["step_ms"].get<double>());
  }
  s["last_step"] = r.last_step;
  if (!r.step_ms.empty()) s["last_loss"] = loss;
  struct stat mst{};
  if (::stat((dir / "metrics.jsonl").c_str(), &mst) == 0) s["last_step_age_s"] = now - static_cast<double>(mst.st_mtime);
  return r;
}

// The last checkpoint: LATEST, else the newest step file.
void status_checkpoint(const fs::path& ckpt_dir, nlohmann::json& s, double now) {
  std::string latest = read_latest(ckpt_dir.string());
  if (latest.empty()) {
    auto steps = list_checkpoint_steps(ckpt_dir.string());
    if (!steps.empty()) latest = checkpoint_file_name(steps.back());
  }
  if (latest.empty()) return;
  int64_t st = -1;
  parse_checkpoint_file_name(latest, &st);
  nlohmann::json c{{"file", (ckpt_dir / latest).string()}, {"step", st}};
  struct stat cst{};
  if (::stat((ckpt_dir / latest).c_str(), &cst) == 0) c["age_s"] = now - static_cast<double>(cst.st_mtime);
  s["checkpoint"] = c;
}

// Starts and stops: events.jsonl gives the restarts, the last start's layout and the state.
std::string status_events(const fs::path& dir, nlohmann::json& s, bool summary) {
  const std::vector<nlohmann::json> events = read_jsonl(dir / "events.jsonl");
  std::vector<size_t> starts;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].value("event", "") == "start") starts.push_back(i);
  nlohmann::json restarts = nlohmann::json::array();
  for (size_t k = 0; k + 1 < starts.size(); ++k) {
    const nlohmann::json* end = nullptr;
    for (size_t i = starts[k] + 1; i < starts[k + 1]; ++i)
      if (events[i].value("event", "") == "end") end = &events[i];
    nlohmann::json r{{"cause", cause_of(end)}, {"restarted_at", events[starts[k + 1]].value("time", "")},
                     {"resumed_from", events[starts[k + 1]].value("resumed_from", int64_t{-1})}};
    for (const auto& n : events[starts[k + 1]].value("notes", nlohmann::json::array())) r["notes"].push_back(n);
    restarts.push_back(r);
  }
  s["restarts"] = restarts;
  std::string state = summary ? "done" : "running or killed";
  if (!starts.empty()) {
    const nlohmann::json& last = events[starts.back()];
    s["layout"] = {{"world", last.value("world", int64_t{0})}, {"dp", last.value("dp", int64_t{0})},
                   {"tp", last.value("tp", int64_t{0})},       {"pp", last.value("pp", int64_t{0})},
                   {"global", last.value("global", int64_t{0})}, {"micro", last.value("micro", int64_t{0})},
                   {"accum", last.value("accum", int64_t{0})}};
    if (last.contains("slurm")) s["slurm"] = last["slurm"];
    for (size_t i = starts.back() + 1; i < events.size(); ++i)
      if (events[i].value("event", "") == "end")
        state = events[i].value("cause", "") == "done" ? "done" : "stopped: " + cause_of(&events[i]);
  }
  s["state"] = state;
  return state;
}

}  // namespace

nlohmann::json run_status_json(const std::string& run_dir) {
  const fs::path dir(run_dir);
  if (!fs::is_directory(dir) || (!fs::exists(dir / "recipe.yaml") && !fs::exists(dir / "metrics.jsonl")))
    throw UserError({run_dir, 0, 0}, "not a run directory (no recipe.yaml or metrics.jsonl)",
                    "pass the directory `runner train` wrote (runs/NAME, or its --run-dir)");
  nlohmann::json s{{"run_dir", run_dir}};
  const double now = static_cast<double>(std::time(nullptr));
  int64_t total = 0;
  fs::path ckpt_dir = dir / "checkpoints";
  status_recipe(dir, s, total, ckpt_dir);
  const StepRecords steps = status_steps(dir, s, now);
  status_checkpoint(ckpt_dir, s, now);
  const std::string state = status_events(dir, s, steps.summary);

  // ETA: the mean of the last (up to) 50 steps' times over the steps left.
  if (total > 0 && steps.last_step < total && !steps.step_ms.empty() && state.rfind("done", 0) != 0) {
    const size_t n = std::min<size_t>(50, steps.step_ms.size());
    double ms_sum = 0;
    for (size_t i = steps.step_ms.size() - n; i < steps.step_ms.size(); ++i) ms_sum += steps.step_ms[i];
    const double per_step = ms_sum / static_cast<double>(n) / 1e3;
    s["eta_s"] = per_step * static_cast<double>(total - steps.last_step);
    s["step_s"] = per_step;
  }
  return s;
}

std::string run_status(const std::string& run_dir) {
  const nlohmann::json s = run_status_json(run_dir);
  std::ostringstream o;
  o << fmt::format("run         {}{}\n", s["run_dir"].get<std::string>(),
                   s.value("name", "").empty() ? "" : " (" + s["name"].get<std::string>() + ")");
  o << fmt::format("state       {}\n", s["state"].get<std::string>());
  const int64_t total = s["total_steps"].get<int64_t>(), last = s["last_step"].get<int64_t>();
  std::string step = total > 0 ? fmt::format("{} / {} ({:.0f}%)", last, total, 100.0 * last / total) : std::to_string(last);
  if (s.contains("last_loss")) step += fmt::format(", loss {:.4f}", s["last_loss"].get<double>());
  if (s.contains("last_step_age_s")) step += fmt::format(", recorded {} ago", age(s["last_step_age_s"].get<double>()));
  o << "last step   " << step << "\n";
  if (s.contains("checkpoint")) {
    const auto& c = s["checkpoint"];
    o << fmt::format("checkpoint  step {} ({}){}\n", c["step"].get<int64_t>(), c["file"].get<std::string>(),
                     c.contains("age_s") ? ", written " + age(c["age_s"].get<double>()) + " ago" : "");
  } else {
    o << "checkpoint  none yet\n";
  }
  if (s.contains("layout")) {
    const auto& l = s["layout"];
    o << fmt::format("layout      {} ranks = dp {} x tp {} x pp {}, global batch {} = micro {} x dp x accum {}\n",
                     l["world"].get<int64_t>(), l["dp"].get<int64_t>(), l["tp"].get<int64_t>(), l["pp"].get<int64_t>(),
                     l["global"].get<int64_t>(), l["micro"].get<int64_t>(), l["accum"].get<int64_t>());
  }
  if (s.contains("slurm")) {
    const auto& j = s["slurm"];
    o << fmt::format("slurm       job {} ({}), restart count {}, nodes {}, {} task(s)\n", j.value("job_id", ""),
                     j.value("job_name", ""), j.value("restart_count", int64_t{0}), j.value("node_list", ""),
                     j.value("ntasks", int64_t{0}));
  } else {
    o << "slurm       not run under Slurm\n";
  }
  o << fmt::format("restarts    {}\n", s["restarts"].size());
  int k = 0;
  for (const auto& r : s["restarts"]) {
    o << fmt::format("  {:>3}. {}; resumed from step {} at {}\n", ++k, r["cause"].get<std::string>(),
                     r["resumed_from"].get<int64_t>(), r["restarted_at"].get<std::string>());
    if (r.contains("notes"))
      for (const auto& n : r["notes"]) o << "       " << n.get<std::string>() << "\n";
  }
  if (s.contains("eta_s"))
    o << fmt::format("eta         {} ({} steps left at {:.3f} s per step, the mean of the last steps)\n",
                     age(s["eta_s"].get<double>()), total - last, s["step_s"].get<double>());
  else
    o << "eta         " << (s["state"] == "done" ? "done" : "unknown (no steps recorded)") << "\n";
  return o.str();
}

}  // namespace runner
