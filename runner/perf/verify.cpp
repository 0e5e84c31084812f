// Trial runs of the search's top layouts (verify.h): each candidate's recipe, resolved, is
// trained for a few steps in its own run directory at the search's world size, and its median
// step time (warm-up dropped) re-ranks the candidates. The trials are separate processes under
// the launcher the user would use (srun in a Slurm allocation, mpirun elsewhere), so what is
// measured is the layout as `runner train` would run it, not an in-process approximation.
#include "runner/perf/verify.h"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <thread>

#include <fmt/format.h>

#include "runner/errors.h"
#include "runner/recipe/recipe.h"

namespace fs = std::filesystem;

extern char** environ;

namespace runner {

std::string layout_words(const SearchCandidate& c) {
  std::string s = fmt::format("dp {} x tp {} x pp {}", c.dp, c.tp, c.pp);
  if (c.virtual_stages > 1) s += fmt::format(" (v {})", c.virtual_stages);
  s += fmt::format(", micro {} x accum {}", c.micro, c.accum);
  if (c.zero) s += ", zero 1";
  if (c.sequence_parallel) s += ", sp";
  if (c.pp > 1 && !c.schedule.empty()) s += ", " + c.schedule;
  s += ", recompute " + (c.recompute.empty() ? std::string("none") : c.recompute);
  return s;
}

int verify_warmup(int steps) { return steps >= 4 ? 2 : 1; }

std::optional<double> median_step_s(const std::string& metrics_jsonl, int warmup) {
  std::ifstream in(metrics_jsonl);
  std::vector<double> ms;
  std::string line;
  while (std::getline(in, line)) {
    const nlohmann::json j = nlohmann::json::parse(line, nullptr, false);
    // A step record: the step's number, its time and its breakdown (not eval, monitor, summary).
    if (!j.is_object() || !j.contains("breakdown") || !j.contains("step_ms") || !j.contains("step")) continue;
    if (j["step"].get<int64_t>() > warmup) ms.push_back(j["step_ms"].get<double>());
  }
  if (ms.empty()) return std::nullopt;
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return (n % 2 ? ms[n / 2] : 0.5 * (ms[n / 2 - 1] + ms[n / 2])) / 1e3;
}

std::vector<std::string> trial_launcher(int64_t world) {
  if (world <= 1) return {};
  const std::string n = std::to_string(world);
  if (std::getenv("SLURM_JOB_ID")) return {"srun", "-n", n};
  return {"mpirun", "-np", n};
}

namespace {

// The candidate's recipe for a short trial: the search's recipe with its layout filled in
// (SearchCandidate::recipe), few steps, no checkpoints, evaluation of one batch at the end.
Recipe trial_recipe(const SearchCandidate& c, int steps, const fs::path& run_dir) {
  Recipe r = c.recipe;
  r.train.steps = steps;
  r.train.log_every = steps;
  r.train.eval_every = 0;
  r.train.eval_batches = 1;
  r.train.run_dir = run_dir.string();
  r.checkpoint.cadence = CheckpointCadence::never;
  r.checkpoint.every_steps = 0;
  r.checkpoint.every_minutes = 0;
  r.checkpoint.snapshot_every = 0;
  r.checkpoint.spike_threshold = 0;
  r.checkpoint.dir.clear();
  r.profile.steps.clear();
  return r;
}

// Runs `argv` with stdout and stderr into `log`, in its own process group (so a stopped trial
// takes its ranks with it), the variables mpirun needs here set where the user has not. The
// exit status, 128 + signal, or -1 when it ran past `timeout_s` and was stopped. posix_spawn,
// not fork: the search has run threads in this process, and a forked child may only exec.
int run_trial(const std::vector<std::string>& argv, const fs::path& log, double timeout_s) {
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) env.emplace_back(*e);
  const auto set_default = [&](const std::string& name, const std::string& value) {
    if (!std::getenv(name.c_str())) env.push_back(name + "=" + value);
  };
  set_default("OMP_WAIT_POLICY", "PASSIVE");  // ranks sharing cores must not spin in barriers
  set_default("OMPI_MCA_rmaps_base_oversubscribe", "1");
  if (geteuid() == 0) {  // mpirun refuses root without these; the user already runs as root
    set_default("OMPI_ALLOW_RUN_AS_ROOT", "1");
    set_default("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1");
  }
  std::vector<char*> a, e;
  for (const std::string& x : argv) a.push_back(const_cast<char*>(x.c_str()));
  for (const std::string& x : env) e.push_back(const_cast<char*>(x.c_str()));
  a.push_back(nullptr);
  e.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t at;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  posix_spawnattr_init(&at);
  posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP);
  posix_spawnattr_setpgroup(&at, 0);
  pid_t pid = 0;
  const int err = posix_spawnp(&pid, a[0], &fa, &at, a.data(), e.data());
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&at);
  if (err != 0) {
    std::ofstream(log) << "cannot run " << a[0] << ": " << std::strerror(err) << "\n";
    return 127;
  }
  const auto t0 = std::chrono::steady_clock::now();
  for (;;) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid)
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_s) {
      kill(-pid, SIGKILL);
      waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

// The last few non-empty lines of a trial's output, mpirun's own boxed notices left out (they
// say only that a rank failed): what went wrong, for the report.
std::string tail_of(const fs::path& log, size_t lines) {
  std::ifstream in(log);
  std::vector<std::string> all;
  bool boxed = false;
  for (std::string l; std::getline(in, l);) {
    if (l.rfind("-----", 0) == 0) {
      boxed = !boxed;
      continue;
    }
    if (!boxed && l.find_first_not_of(" \t\r") != std::string::npos) all.push_back(l);
  }
  std::string out;
  for (size_t i = all.size() > lines ? all.size() - lines : 0; i < all.size(); ++i) out += (out.empty() ? "" : " | ") + all[i];
  return out;
}

// One trial: the measured median step, or the error. Rank 0 writes metrics.jsonl.
std::optional<double> trial(const SearchCandidate& c, int64_t world, const VerifyOptions& opt, const fs::path& dir,
                            std::string& error) {
  fs::create_directories(dir);
  const fs::path yaml = dir / "candidate.yaml", run_dir = dir / "run", log = dir / "output.txt";
  std::ofstream(yaml) << recipe_to_yaml(trial_recipe(c, opt.steps, run_dir));
  std::vector<std::string> argv = trial_launcher(world);
  for (const std::string& a : {opt.runner, std::string("train"), yaml.string(), std::string("--quiet"),
                               std::string("--run-dir"), run_dir.string()})
    argv.push_back(a);
  const int code = run_trial(argv, log, opt.timeout_s);
  if (code != 0) {
    error = (code < 0 ? fmt::format("stopped after {:.0f} s", opt.timeout_s) : fmt::format("exit {}", code)) + ": " +
            tail_of(log, 3);
    return std::nullopt;
  }
  auto s = median_step_s((run_dir / "metrics.jsonl").string(), verify_warmup(opt.steps));
  if (!s || *s <= 0) error = "no timed steps in " + (run_dir / "metrics.jsonl").string();
  return s && *s > 0 ? s : std::nullopt;
}

// The trials' directory: the user's (kept), or a fresh temporary one.
fs::path make_work_dir(const VerifyOptions& opt) {
  if (!opt.work_dir.empty()) {
    fs::create_directories(opt.work_dir);
    return fs::absolute(opt.work_dir);
  }
  std::string tmpl = (fs::temp_directory_path() / "runner_verify_XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw UserError({}, "cannot create a directory for the --verify trials in " +
                                                     fs::temp_directory_path().string(), "set TMPDIR to a writable directory");
  return tmpl;
}

}  // namespace

VerifyReport verify_layouts(SearchResult& result, const VerifyOptions& opt) {
  if (opt.steps < 2)
    throw UserError({}, fmt::format("--verify-steps {} leaves no step to time (the first is warm-up)", opt.steps),
                    "use --verify-steps 6 or more (at least 2)");
  if (opt.runner.empty()) throw std::logic_error("verify_layouts: no runner executable");
  VerifyReport rep;
  rep.steps = opt.steps;
  rep.warmup = verify_warmup(opt.steps);
  rep.k = std::min<int>(std::max(opt.k, 0), static_cast<int>(result.candidates.size()));
  const fs::path work = make_work_dir(opt);
  const bool keep = opt.keep || !opt.work_dir.empty();
  std::vector<std::string> errors(result.candidates.size());
  for (int i = 0; i < rep.k; ++i) {
    SearchCandidate& c = result.candidates[static_cast<size_t>(i)];
    std::cerr << fmt::format("verify {}/{}: {} ... ", i + 1, rep.k, layout_words(c)) << std::flush;
    c.measured_step_s = trial(c, result.world, opt, work / fmt::format("candidate{}", i + 1), errors[static_cast<size_t>(i)]);
    if (c.measured_step_s)
      std::cerr << fmt::format("{:.3g} s/step (predicted {:.3g})\n", *c.measured_step_s, c.predicted.step_s);
    else
      std::cerr << "failed: " << errors[static_cast<size_t>(i)] << "\n";
  }
  // Measured first, fastest first; then the rest in the search's order.
  std::vector<size_t> order(result.candidates.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const auto &ma = result.candidates[a].measured_step_s, &mb = result.candidates[b].measured_step_s;
    if (ma && mb) return *ma < *mb;
    return ma.has_value() && !mb.has_value();
  });
  std::vector<SearchCandidate> sorted;
  for (size_t i : order) {
    sorted.push_back(std::move(result.candidates[i]));
    rep.errors.push_back(errors[i]);
  }
  result.candidates = std::move(sorted);
  if (keep) {
    rep.work_dir = work.string();
  } else {
    std::error_code ec;
    fs::remove_all(work, ec);
  }
  return rep;
}

std::string verify_table(const SearchResult& result, const VerifyReport& rep) {
  std::string out = fmt::format("verified: the top {} layouts, {} steps each (the first {} not timed), by measured step time\n",
                                rep.k, rep.steps, rep.warmup);
  out += fmt::format("  {:>3}  {:<64} {:>11} {:>11} {:>9}\n", "#", "layout", "predicted s", "measured s", "meas/pred");
  for (size_t i = 0; i < result.candidates.size(); ++i) {
    const SearchCandidate& c = result.candidates[i];
    const std::string& err = i < rep.errors.size() ? rep.errors[i] : std::string();
    if (!c.measured_step_s && err.empty()) continue;  // not run
    out += fmt::format("  {:>3}  {:<64} {:>11.4f} {:>11} {:>9}\n", i + 1, layout_words(c), c.predicted.step_s,
                       c.measured_step_s ? fmt::format("{:.4f}", *c.measured_step_s) : "failed",
                       c.measured_step_s && c.predicted.step_s > 0
                           ? fmt::format("{:.2f}", *c.measured_step_s / c.predicted.step_s) : "-");
    if (!err.empty()) out += "       " + err + "\n";
  }
  if (!rep.work_dir.empty()) out += "  trial runs kept in " + rep.work_dir + "\n";
  return out;
}

void add_verify_json(nlohmann::json& j, const SearchResult& result, const VerifyReport& rep) {
  nlohmann::json& cands = j["search"]["candidates"];
  if (!cands.is_array() || cands.size() != result.candidates.size()) {
    cands = nlohmann::json::array();
    for (const SearchCandidate& c : result.candidates) cands.push_back(c.to_json());
  }
  for (size_t i = 0; i < result.candidates.size(); ++i) {
    const SearchCandidate& c = result.candidates[i];
    nlohmann::json& o = cands[i];
    if (!o.is_object()) o = nlohmann::json::object();
    o["layout"] = layout_words(c);
    o["measured_step_s"] = c.measured_step_s ? nlohmann::json(*c.measured_step_s) : nlohmann::json(nullptr);
    o["measured_over_predicted"] = c.measured_step_s && c.predicted.step_s > 0
                                       ? nlohmann::json(*c.measured_step_s / c.predicted.step_s) : nlohmann::json(nullptr);
    if (i < rep.errors.size() && !rep.errors[i].empty()) o["verify_error"] = rep.errors[i];
  }
  j["search"]["verify"] = {{"k", rep.k}, {"steps", rep.steps}, {"warmup_steps", rep.warmup}, {"world", result.world},
                           {"work_dir", rep.work_dir.empty() ? nlohmann::json(nullptr) : nlohmann::json(rep.work_dir)}};
}

}  // namespace runner
