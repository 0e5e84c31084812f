// A training job's processes (see mpi_job.h).
#include "runner/train/mpi_job.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <array>
#include <optional>
#include <string>

#include <filesystem>
#include <fstream>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ops/gemm_path.h"
#include "parallel/grid.h"
#if defined(RUNNER_HAVE_NCCL)
#include "parallel/cuda/gpu_comm.h"
#endif
#include "runner/agree.h"
#include "runner/atomic_output.h"
#include "runner/device/device.h"
#include "runner/errors.h"
#include "runner/perf/search.h"
#include "runner/run/restart.h"
#include "runner/run/run_dir.h"
#include "runner/run/slurm.h"

namespace runner {

namespace {

// Prints this rank's message, named by its coordinates, and stops the whole job.
[[noreturn]] void fail_job(parallel::Grid& grid, const std::string& message, int code) {
  std::fprintf(stderr, "[rank %d %s] %s\n", grid.rank(), grid.name().c_str(), message.c_str());
  std::fflush(stderr);
  record_rank_exit(code);  // the batch script's restart check reads it (srun sees only the abort's kill)
  grid.world().abort(code);
  std::_Exit(code);  // not reached (abort() is [[noreturn]], which GCC does not see through a virtual call)
}

// The world communicator for the run's device (parallel/comm.h: tensors go through
// Communicator::tensors()). The CUDA backend: NCCL, or MPI staging through host memory when
// RUNNER_HOST_STAGED_COMM=1, when two ranks share a GPU, or in a build without NCCL. Any other
// device: MPI, whose tensors() the Grid sets up for the device (direct on the CPU, staged on
// cpu-strict).
std::unique_ptr<parallel::Communicator> device_world(std::unique_ptr<parallel::Communicator> world, ops::Backend& be) {
  if (std::string(be.name()) != "cuda") return world;
#if defined(RUNNER_HAVE_NCCL)
  return parallel::gpu_world(std::move(world));
#else
  return world;
#endif
}

// One process started by hand, with a layout of several ranks: it needs a launcher. (The
// plan would otherwise derive dp from hardware:'s device count and complain about that.)
void need_launcher(const Recipe& r) {
  const int64_t ranks = std::max<int64_t>(1, r.parallel.dp) * r.parallel.tp * r.parallel.pp;
  if (ranks <= 1) return;
  const char* key = r.parallel.tp > 1 ? "parallel.tp" : r.parallel.pp > 1 ? "parallel.pp" : "parallel.dp";
  throw UserError(r.loc(key),
                  fmt::format("this layout (dp {} x tp {} x pp {}) needs {} ranks, but this is one process, not started by "
                              "mpirun or srun", r.parallel.dp > 0 ? std::to_string(r.parallel.dp) : std::string("1"),
                              r.parallel.tp, r.parallel.pp, ranks),
                  fmt::format("launch it as `mpirun -np {} runner ...` (or `srun -n {}`){}", ranks, ranks,
                              r.parallel.dp > 0 ? "" : "; more ranks add data parallelism (dp derived from them)"));
}

// ZeRO-2 and 3 are planned (the ledger, the cost model, the search) but the trainer's
// gradient sync shards only the optimizer state: refused before any work, on every rank alike.
void refuse_unrun_zero(const Recipe& r) {
  if (r.parallel.zero < 2) return;
  throw UserError(r.loc("parallel.zero"),
                  fmt::format("parallel.zero: {} is planned but not yet run by the trainer", r.parallel.zero),
                  "use 1 (optimizer state sharded over dp) or 0 to train; `runner plan` shows what zero 2 and 3 "
                  "would hold");
}

}  // namespace

Launch::Launch(int* argc, char*** argv) {
  if (!parallel::mpi_launched()) return;
  parallel::init_mpi(argc, argv);
  world_ = parallel::mpi_world();
  rank_ = world_->rank();
  size_ = world_->size();
}

Launch::~Launch() { parallel::finalize_mpi(); }

namespace {

// The paths a run directory recorded (gemm_paths.json) when it holds checkpoints to continue
// from: {bf16, f16} as 0 (sgemm) / 1 (oneDNN); -1 where nothing is recorded.
std::array<int8_t, 2> recorded_paths(const std::string& run_dir) {
  namespace fs = std::filesystem;
  std::array<int8_t, 2> out{-1, -1};
  const fs::path file = fs::path(run_dir) / "gemm_paths.json";
  std::error_code ec;
  if (!fs::exists(file, ec)) return out;
  try {
    auto j = nlohmann::json::parse(std::ifstream(file));
    const char* keys[2] = {"bf16", "f16"};
    for (int k = 0; k < 2; ++k)
      if (j.contains(keys[k]) && j[keys[k]].contains("path"))
        out[static_cast<size_t>(k)] = j[keys[k]]["path"].get<std::string>().rfind("onednn", 0) == 0 ? 1 : 0;
  } catch (const std::exception&) {
    // unreadable: measure again (only bit-exactness across the resume is at stake)
  }
  return out;
}

}  // namespace

void Launch::agree_gemm_paths(const std::string& run_dir) {
  if (ops::gemm_paths_on_device()) return;  // a GPU run: cuBLASLt's paths, set with the backend, nothing to agree
  ops::GemmMode mode;
  try {
    mode = ops::gemm_mode_from_env();
  } catch (const std::invalid_argument& e) {
    throw UserError({}, e.what(), "set RUNNER_GEMM_PATH to auto, onednn or sgemm, or unset it");
  }
  if (mode != ops::GemmMode::Auto) return;  // forced alike on every rank: gemm_paths() resolves it
  // Rank 0 decides: the recorded paths, or its measurement.
  int8_t choice[2] = {-1, -1};
  std::optional<ops::GemmPaths> mine;
  if (rank_ == 0) {
    auto rec = recorded_paths(run_dir);
    if (rec[0] < 0 || rec[1] < 0) {
      mine = ops::gemm_paths();
      choice[0] = mine->bf16.path == ops::GemmPath::OneDnn;
      choice[1] = mine->f16.path == ops::GemmPath::OneDnn;
    } else {
      choice[0] = rec[0];
      choice[1] = rec[1];
    }
  }
  if (world_) world_->broadcast(choice, sizeof(choice), 0);
  if (mine) return;  // rank 0's own measurement stands
  // Resolve without measuring, then take the agreed paths where this rank can run them.
  ops::GemmPaths p = ops::choose_gemm_paths(ops::GemmMode::Sgemm);
  p.mode = ops::GemmMode::Auto;
  for (auto [c, agreed] : {std::pair{&p.bf16, choice[0]}, std::pair{&p.f16, choice[1]}}) {
    c->path = agreed == 1 && c->onednn_available ? ops::GemmPath::OneDnn : ops::GemmPath::Sgemm;
    c->why = agreed == 1 && !c->onednn_available ? "oneDNN was agreed but is unavailable on this rank"
             : rank_ == 0                         ? "as recorded in the run directory (a bit-exact continuation)"
                                                  : "rank 0's choice";
  }
  ops::set_gemm_paths(p);
}

int Launch::train(const Plan& p, const TrainOptions& opts, ops::Backend& be) {
  if (!world_) return run_training(p, opts, be);
  parallel::Grid grid(device_world(std::move(world_), be),
                      {static_cast<int>(p.dp), static_cast<int>(p.tp), static_cast<int>(p.pp)}, &be);
  try {
    return run_training(p, opts, grid, be);
  } catch (const SilentExit& e) {
    return e.code;
  } catch (const AgreedUserError& e) {
    std::fprintf(stderr, "%s\n", e.what());
    return kExitUserError;
  } catch (const UserError& e) {  // this rank's alone: the others may be waiting in a collective
    fail_job(grid, e.what(), kExitUserError);
  } catch (const std::exception& e) {
    fail_job(grid, std::string("error: ") + e.what(), 1);
  }
}

int Launch::train_recipe(Recipe recipe, TrainOptions opts, bool elastic) {
  refuse_unrun_zero(recipe);
  std::string search_json;
  if (recipe.parallel.search) {  // searched among the stages the trainer runs
    opts.resume_notes.emplace_back();
    recipe = searched_recipe(recipe, world_size(), "the job's ranks", &opts.resume_notes.back(), &search_json, 1);
  }
  recipe = fit_allocation(recipe, world_size(), elastic, &opts.resume_notes);
  if (!world_) need_launcher(recipe);
  ops::Backend& be = select_backend(recipe);
  const std::string run_dir = run_paths(recipe, opts.run_dir).run_dir;
  if (!search_json.empty() && rank() == 0) {
    std::filesystem::create_directories(run_dir);
    // Whole or absent: a reader (runner report, a resume's notes) never sees half of it.
    write_file_atomic((std::filesystem::path(run_dir) / "search.json").string(), search_json);
  }
  if (recipe.precision.compute != FloatFormat::fp32) agree_gemm_paths(run_dir);
  return train(make_plan(recipe, world_size()), opts, be);
}

int Launch::resume_run(const std::string& run_dir, const std::vector<std::string>& sets, TrainOptions opts) {
  ResumeRequest req = prepare_resume(run_dir, sets, opts.resume_step, opts.strict);
  refuse_unrun_zero(req.recipe);
  if (!world_) need_launcher(req.recipe);
  ops::Backend& be = select_backend(req.recipe);
  opts.run_dir = run_dir;
  opts.resume = true;
  opts.resume_point = req.point;
  opts.resume_notes = req.notes;
  if (req.recipe.precision.compute != FloatFormat::fp32) agree_gemm_paths(run_dir);
  return train(make_plan(req.recipe, world_size()), opts, be);
}

}  // namespace runner
