// The start-up banner, the run files and the end event (startup.h).
#include "runner/train/startup.h"

#include <algorithm>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include <unistd.h>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/spdlog.h>

#include "ops/backend.h"
#include "ops/gemm_path.h"
#include "runner/observe/console_sink.h"
#include "runner/perf/gemm_report.h"
#include "runner/run/slurm.h"
#include "runner/signals.h"
#include "runner/train/optimizer.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

// Ranks on one machine share its cores: without train.threads or OMP_NUM_THREADS, each of L
// local ranks gets cores/L threads (OpenMP's default would give every rank all the cores, and
// ranks that wait in a collective on a descheduled thread slow down many-fold). When the
// launcher bound the rank to fewer cores, OpenMP's default already follows that binding.
void share_cores_between_local_ranks() {
  int local = 1;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"})
    if (const char* e = std::getenv(v)) {
      local = std::max(1, std::atoi(e));  // Slurm's "4(x2)" form: the leading count is this node's
      break;
    }
  if (local <= 1) return;
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int share = std::max(1, cores / local);
  if (share < ops::num_threads()) ops::set_num_threads(share);
}

// Which GEMM path each format of the run takes, and a warning when 16-bit compute is slower
// than fp32 here (runner/perf/gemm_report.h).
void print_gemm_paths(spdlog::logger& log, FloatFormat compute) {
  const GemmReport g = gemm_report(compute);
  for (size_t i = 0; i < g.lines.size(); ++i)
    log.info("  {}{}{}", i == 0 ? "GEMM       " : "             ", g.lines[i],
             i == 0 && compute != FloatFormat::fp32 ? " (recorded in gemm_paths.json)" : "");
  if (!g.warning.empty()) log.warn("  {}", g.warning);
}

}  // namespace

void choose_threads(const Recipe& r) {
  if (r.train.threads > 0) ops::set_num_threads(static_cast<int>(r.train.threads));
  else if (!std::getenv("OMP_NUM_THREADS")) share_cores_between_local_ranks();
}

void default_passive_waiting(char** argv) {
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv("GOMP_SPINCOUNT")) return;  // the user's choice stands
  if (::setenv("OMP_WAIT_POLICY", "PASSIVE", 1) != 0) return;
  ::execv("/proc/self/exe", argv);
  // No /proc (or exec refused): the runtime's own default, which spins a while before it sleeps.
  ::unsetenv("OMP_WAIT_POLICY");
}

std::shared_ptr<spdlog::logger> open_run_log(const std::string& run_dir, const parallel::Grid& grid, bool to_stdout) {
  fs::create_directories(run_dir);
  const std::string file = (fs::path(run_dir) / fmt::format("log.rank{}.txt", grid.rank())).string();
  auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(file);
  std::vector<spdlog::sink_ptr> sinks{file_sink};
  // A console that goes away (a pipe's reader exits) stops its own lines; the file goes on.
  if (to_stdout) sinks.push_back(stdout_console_sink(file_sink, file));
  auto log = std::make_shared<spdlog::logger>("runner", sinks.begin(), sinks.end());
  // Ranks are named by their grid coordinates.
  log->set_pattern(grid.world_size() > 1 ? fmt::format("%H:%M:%S [{}] %v", grid.name()) : std::string("%H:%M:%S %v"));
  log->flush_on(spdlog::level::info);
  return log;
}

void print_startup(spdlog::logger& log, const Plan& plan, const parallel::Grid& grid, const StartupFacts& f) {
  const Recipe& r = plan.recipe;
  const bool multi = grid.world_size() > 1;
  log.info("runner {} | run dir {}", RUNNER_VERSION, f.run_dir);
  if (multi)
    log.info("  grid       {} ranks = dp {} x tp {} x pp {} (tp fastest, then dp, then pp) | this rank {} | "
             "{} gradient bucket(s){}",
             grid.world_size(), plan.dp, plan.tp, plan.pp, grid.name(), f.buckets, f.zero1 ? " | ZeRO-1" : "");
  std::istringstream table(plan.table());
  for (std::string line; std::getline(table, line);) log.info("{}", line);
  log.info("  data       {}", f.data);
  const char* wait = std::getenv("OMP_WAIT_POLICY");
  log.info("  threads    {}{} (OpenMP, {}; OpenBLAS shares the pool)", ops::num_threads(), multi ? " per rank" : "",
           wait ? fmt::format("OMP_WAIT_POLICY={}", wait) : std::string("the runtime's wait policy"));
  log.info("  MFU        against {:.1f} GFLOP/s{}: {}", f.peak_flops / 1e9,
           multi ? fmt::format(" over {} ranks", grid.world_size()) : std::string(), f.peak_source);
  log.info("  precision  {}", f.precision);
  print_gemm_paths(log, r.precision.compute);
  log.info("  optimizer  adamw lr {:g} betas ({:g}, {:g}) wd {:g} clip {:g} | schedule {} warmup {}", r.optimizer.lr,
           r.optimizer.beta1, r.optimizer.beta2, r.optimizer.weight_decay, r.optimizer.grad_clip,
           to_string(r.optimizer.schedule.kind), r.optimizer.schedule.warmup_steps);
}

std::string precision_line(const PrecisionConfig& p, const LossScaler& scaler, double scale, bool diagnose) {
  if (p.compute == FloatFormat::fp32) return "fp32 (weights, activations, gradients, optimizer)";
  std::string line = fmt::format("{} weights and activations | {} | gradients accumulated in {} | Adam moments fp32",
                                 to_string(p.compute), keeps_masters(p) ? "fp32 master weights" : "no master copy (same)",
                                 to_string(p.grad_accum));
  if (scaler.active()) {
    const LossScaleConfig& c = scaler.config();
    line += p.loss_scale.mode == LossScaleMode::dynamic
                ? fmt::format(" | loss scale dynamic from {:g} (x{:g} every {} clean steps, x{:g} on overflow, min {:g}, "
                              "stop after {} overflows in a row)", scale, c.growth_factor, c.growth_interval,
                              c.backoff_factor, c.min_scale, c.max_consecutive_skips)
                : fmt::format(" | loss scale static {:g}", scale);
  } else if (p.compute == FloatFormat::fp16) {
    line += " | no loss scaling (mode none)";
  }
  if (diagnose) line += " | gradient range diagnostics on";
  return line;
}

std::string resolved_recipe_yaml(const Plan& plan) {
  Recipe rr = plan.recipe;
  rr.batch = {plan.global, plan.micro, plan.accum};
  rr.parallel.dp = plan.dp;
  return recipe_to_yaml(rr);
}

void write_run_files(const Plan& plan, const std::string& run_dir) {
  std::ofstream(fs::path(run_dir) / "recipe.yaml") << resolved_recipe_yaml(plan);
  std::ofstream(fs::path(run_dir) / "plan.json") << plan.to_json().dump(2) << "\n";
  if (plan.recipe.precision.compute != FloatFormat::fp32)
    std::ofstream(fs::path(run_dir) / "gemm_paths.json") << ops::gemm_paths().to_json() << "\n";
}

void append_end_event(const std::string& run_dir, const char* cause, int64_t step, int code) {
  nlohmann::json j{{"event", "end"}, {"cause", cause}, {"step", step}, {"exit_code", code}};
  if (code == kExitPreempted)
    j["signal"] = stop_signal_name();
  append_run_event(run_dir, j);
}

}  // namespace runner
