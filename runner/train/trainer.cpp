// The training loop of one rank, on any layout: data -> the step's forward and backward passes
// (RankModel) -> clip -> AdamW -> log (RunMetrics), evaluate, checkpoint (CheckpointPolicy).
// Everything a user can get wrong is checked before the run directory is touched
// (invariant 6), and every rank agrees on such an error before any rank stops.
#include "runner/train/train.h"

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "ops/backend.h"
#include "ops/convert.h"
#include "ops/gemm_path.h"
#include "ops/peak.h"
#include "ops/rng.h"
#include "runner/agree.h"
#include "runner/checkpoint/policy.h"
#include "runner/run/run_lock.h"
#include "runner/data/data.h"
#include "runner/signals.h"
#include "runner/state.h"
#include "runner/train/evaluate.h"
#include "runner/observe/metrics.h"
#include "runner/train/optimizer.h"
#include "runner/train/precision.h"
#include "runner/observe/profile.h"
#include "runner/train/rank_model.h"
#include "runner/run/slurm.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

// Options the trainer does not implement yet are refused, never ignored.
void check_supported(const Plan& p, int64_t grid_world) {
  const Recipe& r = p.recipe;
  if (p.world != grid_world)
    throw UserError(r.loc("parallel"),
                    fmt::format("this recipe's layout needs {} ranks (dp {} x tp {} x pp {}), but {} {} running", p.world,
                                p.dp, p.tp, p.pp, grid_world, grid_world == 1 ? "process is" : "processes are"),
                    fmt::format("launch it with `mpirun -np {} runner train ...` (or `srun -n {}`), or set the parallel "
                                "degrees for {} rank{}", p.world, p.world, grid_world, grid_world == 1 ? "" : "s"));
}

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

// Fault injection for tests, read once from the environment.
struct Faults {
  // RUNNER_FAULT_FAIL_RANK=R, RUNNER_FAULT_FAIL_STEP=N: world rank R fails in the middle of
  // step N, as a crashed kernel or a lost node would.
  int64_t fail_rank = env("RUNNER_FAULT_FAIL_RANK"), fail_step = env("RUNNER_FAULT_FAIL_STEP");
  // RUNNER_FAULT_NAN_STEP=N: the first time step N runs, its loss and gradients become NaN, as a
  // numerical blow-up would make them.
  int64_t nan_step = env("RUNNER_FAULT_NAN_STEP");
  // RUNNER_FAULT_INF_STEP=N (and RUNNER_FAULT_INF_COUNT=K, default 1): steps N .. N+K-1 get
  // one gradient element of the last parameter set to +inf (the loss stays finite), as an fp16
  // overflow in the backward would.
  int64_t inf_step = env("RUNNER_FAULT_INF_STEP"), inf_count = std::max<int64_t>(1, env("RUNNER_FAULT_INF_COUNT"));
  // RUNNER_FAULT_NOISE_STEP=N: step N's batch is random tokens with random targets, as a
  // corrupt shard would be (a loss and gradient-norm spike, for the monitoring's tests).
  int64_t noise_step = env("RUNNER_FAULT_NOISE_STEP");
  // RUNNER_FAULT_STEP_SLEEP_MS=N: each step takes N ms longer (a slow machine; numbers unchanged),
  // so a test's signals, which take a while to arrive, land where they were aimed (tests/slurm/).
  int64_t step_sleep_ms = env("RUNNER_FAULT_STEP_SLEEP_MS");
  static int64_t env(const char* name) { return std::getenv(name) ? std::atoll(std::getenv(name)) : -1; }
};

class Trainer {
 public:
  Trainer(const Plan& p, TrainOptions o, parallel::Grid& g, ops::Backend& b)
      : plan(p), r(p.recipe), opts(std::move(o)), grid(g), be(b) {}
  // The grid outlives the trainer: its communicators must not report to our sink after us
  // (a profiled step left by an exception).
  ~Trainer() { grid.set_trace(nullptr); }

  int run() {
    install_signal_handlers();
    open_inputs();
    paths = run_paths(r, opts.run_dir);
    take_run_lock();
    if (r.train.threads > 0) ops::set_num_threads(static_cast<int>(r.train.threads));
    else if (!std::getenv("OMP_NUM_THREADS")) share_cores_between_local_ranks();
    build();
    setup_logging();
    ckpt = std::make_unique<CheckpointPolicy>(plan, grid, paths.checkpoint_dir, log);
    metrics = std::make_unique<RunMetrics>(plan, grid, log);
    if (lock && !lock->took_over().empty())
      log->warn("took over the lock of a previous owner that is gone ({}): {}", lock->took_over(), lock->path());
    maybe_resume();
    ckpt->remove_stale_files();
    if (profile_window.on() && resumed_from >= profile_window.from) {  // a resume inside the window profiles the rest
      if (resumed_from >= profile_window.to) profile_window = {};
      else profile_window.from = resumed_from + 1;
    }
    write_run_files();
    // Each start and stop of a job on this run directory (runner status reads them).
    if (lead()) append_run_event(paths.run_dir, start_event(plan, grid.world_size(), resumed_from, opts.resume_notes));
    // MFU is against the peak of all ranks together.
    if (plan.peak_flops > 0) {
      metrics->set_peak_flops(plan.peak_flops * grid.world_size());
    } else {
      double v = ops::measure_cpu_gemm_peak_flops();
      grid.world().allreduce_sum(&v, 1);
      metrics->set_peak_flops(v);
    }
    if (profile_window.on()) {
      // The roofline of one rank: its share of the peak, and its memory bandwidth (every rank
      // measures at once, as they will run).
      roofline.peak_flops = metrics->peak_flops() / static_cast<double>(grid.world_size());
      roofline.bandwidth = ops::measure_cpu_memory_bandwidth();
      double bw = roofline.bandwidth;
      grid.world().allreduce_sum(&bw, 1);
      roofline.bandwidth = bw / static_cast<double>(grid.world_size());
    }
    print_startup();
    if (resumed_from >= 0) log->info("resumed from step {} ({})", resumed_from, ckpt->dir());
    for (const std::string& note : opts.resume_notes) log->info("{}", note);

    const int64_t total = r.train.steps;
    auto run_t0 = Clock::now();
    double pending_ckpt_ms = 0;
    double pending_ckpt_wall = 0, pending_rollback = 0;  // breakdown parts outside the step, for the next record
    while (st.step < total) {
      if (stop_agreed()) return preempt();
      if (r.checkpoint.snapshot_every > 0 && st.step % r.checkpoint.snapshot_every == 0 &&
          (!snapshot.valid() || snapshot.step() != st.step)) {
        auto t = Clock::now();
        snapshot.take(st);
        pending_rollback += ms_between(t, Clock::now());
      }
      const bool profiled = profile_window.covers(st.step + 1);
      std::vector<ops::OpProfile> before;
      if (profiled) before = model->profile();
      if (profiled) begin_trace(st.step + 1);
      StepResult s = train_step();
      if (profiled) trace_steps.back().t1_ns = now_ns(), model->set_trace(nullptr);
      if (profiled) profile_step(before, s.total_ms);
      if (faults.step_sleep_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(faults.step_sleep_ms));
      auto rb0 = Clock::now();
      if (rollback_needed(s)) {
        pending_rollback += s.total_ms + ms_between(rb0, Clock::now());  // the attempt is lost
        if (profiled) end_trace();
        continue;
      }
      s.rollback_ms = pending_rollback;
      s.checkpoint_ms = pending_ckpt_wall;
      pending_rollback = pending_ckpt_wall = 0;
      metrics->step(st.step, st.tokens, s, pending_ckpt_ms);
      pending_ckpt_ms = 0;
      if (s.overflow && scaler.exhausted(st.scaler)) return stop_on_overflows(s);
      auto c0 = Clock::now();
      if (st.step < total && ckpt->due(st.step, ms_between(run_t0, Clock::now()) / 1e3)) {
        const int64_t t = now_ns();
        ckpt->save(st, false);
        pending_ckpt_ms = ckpt->last_stall_ms();
        phase("checkpoint save", "checkpoint", t);
      }
      const int64_t p0 = now_ns();
      ckpt->poll();
      if (now_ns() - p0 > 100000) phase("checkpoint poll", "checkpoint", p0);  // a background write finished
      pending_ckpt_wall = ms_between(c0, Clock::now());
      metrics->set_scaler(st.scaler, scaler.active());
      metrics->step_line(st.step, s);
      if (profiled) end_trace();
      if (profiled && st.step == profile_window.to) {
        metrics->flush_monitor();  // its gather, started inside the window, is in the trace
        write_profile();
      }
      if (s.skipped && !s.overflow) log->warn("step {}: non-finite loss or gradient norm; update skipped", st.step);
      if (r.train.eval_every > 0 && st.step % r.train.eval_every == 0 && st.step != total)
        metrics->eval(st.step, evaluate_untimed());
    }
    ckpt->save(st, true);
    if (stop_agreed()) return preempt();
    EvalResult last_eval = evaluate_untimed();
    if (stop_agreed()) return preempt();
    metrics->eval(st.step, last_eval);
    double wall = ms_between(run_t0, Clock::now()) / 1e3;
    metrics->summary(st.step, st.tokens, last_eval, wall, training_ops());
    end_event("done", 0);
    return 0;
  }

 private:
  const Plan& plan;
  const Recipe& r;
  TrainOptions opts;
  parallel::Grid& grid;
  ops::Backend& be;  // chosen once when the run started (runner/device/device.h)
  // The trace sink of communicators, pipeline and loop while a profiled step runs; declared
  // before everything that may hold a request reporting to it (pipeline sends, gradient
  // buckets, the monitor's gather), so it outlives them.
  StepSpans step_spans;
  RunPaths paths;
  std::shared_ptr<const DataSource> train_src, val_src;
  std::unique_ptr<DataLoader> loader;
  TrainState st;
  std::unique_ptr<RankModel> model;
  std::shared_ptr<spdlog::logger> log;
  std::unique_ptr<CheckpointPolicy> ckpt;
  std::unique_ptr<RunMetrics> metrics;
  MemorySnapshot snapshot;
  LossScaler scaler{r.precision};
  int64_t resumed_from = -1;
  std::set<int64_t> skip_batches;  // steps whose batch is skipped after a rollback
  Faults faults;
  ProfileWindow profile_window;
  std::vector<ops::OpProfile> profiled_ops;  // summed over the profiled steps' passes (evaluation excluded)
  double profiled_ms = 0;
  Roofline roofline;  // this rank's, measured at start-up when profiling

  // The executors time every pass, evaluation's forwards too; the end-of-run table of top
  // operators is the training passes' (the step breakdown's forward and backward), so the
  // evaluations' share is kept apart and taken out.
  std::vector<ops::OpProfile> eval_ops;
  EvalResult evaluate_untimed() {
    std::vector<ops::OpProfile> before = model->profile();
    EvalResult e = evaluate(plan, grid, *model, val_src, st.rng.data_seed);
    add_ops(eval_ops, model->profile(), before);
    return e;
  }
  std::vector<ops::OpProfile> training_ops() const {
    std::vector<ops::OpProfile> t;
    add_ops(t, model->profile(), eval_ops);
    return t;
  }
  // into += a - b, per operator kind (b may lack kinds a has).
  static void add_ops(std::vector<ops::OpProfile>& into, const std::vector<ops::OpProfile>& a,
                      const std::vector<ops::OpProfile>& b) {
    for (const ops::OpProfile& p : a) {
      ops::OpProfile d = p;
      for (const ops::OpProfile& q : b)
        if (q.name == p.name) {
          d.forward_ms -= q.forward_ms;
          d.backward_ms -= q.backward_ms;
          d.recompute_ms -= q.recompute_ms;
          d.calls -= q.calls;
        }
      auto it = std::find_if(into.begin(), into.end(), [&](const ops::OpProfile& x) { return x.name == d.name; });
      if (it == into.end()) it = into.insert(into.end(), ops::OpProfile{d.name, 0, 0, 0, 0});
      it->forward_ms += d.forward_ms;
      it->backward_ms += d.backward_ms;
      it->recompute_ms += d.recompute_ms;
      it->calls += d.calls;
    }
  }

  // A profiled step: adds its passes' operator times (written by write_profile()).
  void profile_step(const std::vector<ops::OpProfile>& before, double step_ms) {
    add_ops(profiled_ops, model->profile(), before);
    profiled_ms += step_ms;
  }

  // After the window's last step (and its checkpoint): profile.rankR.json (and rank 0's
  // profile.json), the top operators logged, and the trace files.
  void write_profile() {
    const int64_t steps = profile_window.to - profile_window.from + 1;
    auto figures = op_figures(model->graphs(), plan.accum * steps, profiled_ops);
    nlohmann::json j = profile_json(figures, profile_window, profiled_ms, roofline, log.get());
    j["rank"] = grid.rank();
    j["grid"] = grid.name();
    for (size_t i = 0; i < trace_steps.size(); ++i) trace_steps[i].spans = step_spans.take(static_cast<int64_t>(i));
    j["communication"] = comm_calls_json(trace_steps);
    std::ofstream(fs::path(paths.run_dir) / fmt::format("profile.rank{}.json", grid.rank())) << j.dump(2) << "\n";
    if (lead()) std::ofstream(fs::path(paths.run_dir) / "profile.json") << j.dump(2) << "\n";
    write_traces();
  }

  // trace.rankR.json per rank; rank 0 then merges them into trace.json (one pid per rank).
  std::vector<TraceStep> trace_steps;  // the profiled steps' attempts, with their operator events and spans
  ops::TraceSink* tracing = nullptr;   // &step_spans inside a profiled step, else null
  std::vector<parallel::CommCounts> comm_before;  // per grid communicator, at the profiled step's start
  static int64_t now_ns() { return ops::trace_now_ns(); }

  // A profiled step's attempt starts: operators, communicators, pipeline and the loop's own
  // phases report to it until end_trace() (after its checkpoint work).
  void begin_trace(int64_t step) {
    trace_steps.push_back({step, now_ns(), 0, {}, {}, {}});
    model->set_trace(&trace_steps.back().ops);
    step_spans.set_current(static_cast<int64_t>(trace_steps.size()) - 1);
    tracing = &step_spans;
    comm_before.clear();
    for (parallel::Communicator* c : grid.comms()) comm_before.push_back(c->counts());
    grid.set_trace(tracing);
    model->pipe().set_trace(tracing);
  }
  void end_trace() {
    grid.set_trace(nullptr);
    model->pipe().set_trace(nullptr);
    model->set_trace(nullptr);
    tracing = nullptr;
    step_spans.set_current(-1);
    std::vector<parallel::Communicator*> comms = grid.comms();
    for (size_t i = 0; i < comms.size(); ++i)
      for (int k = 0; k < parallel::kCommOps; ++k) {
        const int64_t n = comms[i]->counts()[static_cast<size_t>(k)] - comm_before[i][static_cast<size_t>(k)];
        if (n > 0)
          trace_steps.back().calls[fmt::format("{} {}", comms[i]->name(), parallel::comm_op_name(static_cast<parallel::CommOp>(k)))] += n;
      }
  }
  // A phase of the loop (data wait, optimizer, checkpoint, ...) from t0 to now, when tracing.
  void phase(const char* name, const char* cat, int64_t t0) {
    if (!tracing) return;
    ops::TraceSpan s;
    s.name = name;
    s.cat = cat;
    s.t0_ns = t0;
    s.t1_ns = now_ns();
    tracing->span(s);
  }
  void write_traces() {
    const fs::path dir = paths.run_dir;
    // One time base for every rank (the steady clock is the host's): rank 0's first profiled
    // step starts at 0 (ns since boot fit a double exactly).
    double origin = lead() && !trace_steps.empty() ? static_cast<double>(trace_steps.front().t0_ns) : 0;
    grid.world().allreduce_sum(&origin, 1);
    std::ofstream(dir / fmt::format("trace.rank{}.json", grid.rank()))
        << trace_json(trace_steps, grid.rank(), grid.name(), static_cast<int64_t>(origin)).dump() << "\n";
    trace_steps.clear();
    double done = 1;
    grid.world().allreduce_sum(&done, 1);  // every rank's file is written
    if (!lead()) return;
    nlohmann::json merged = {{"traceEvents", nlohmann::json::array()}, {"displayTimeUnit", "ms"}};
    for (int rk = 0; rk < grid.world_size(); ++rk) {
      std::ifstream in(dir / fmt::format("trace.rank{}.json", rk));
      nlohmann::json j = nlohmann::json::parse(in, nullptr, false);
      if (j.is_discarded()) continue;
      for (auto& e : j["traceEvents"]) merged["traceEvents"].push_back(std::move(e));
    }
    std::ofstream(dir / "trace.json") << merged.dump() << "\n";
  }

  std::optional<RunLock> lock;  // rank 0: this run owns its directory until the Trainer ends

  bool multi() const { return grid.world_size() > 1; }
  bool lead() const { return grid.rank() == 0; }
  uint64_t seed() const { return static_cast<uint64_t>(r.train.seed); }

  // Everything that can fail on user input happens here, before any file is written.
  void open_inputs() {
    check_supported(plan, grid.world_size());
    agree(grid.world(), [&] {
      profile_window = opts.profile.empty()
                           ? parse_profile(r.profile.steps, r.train.steps, r.loc("profile.steps"), "profile.steps")
                           : parse_profile(opts.profile, r.train.steps, {"--profile", 0, 0}, "--profile");
      train_src = open_source(r.data, Split::Train, r.model.seq_len, r.model.vocab_size, seed());
      val_src = open_source(r.data, Split::Val, r.model.seq_len, r.model.vocab_size, seed());
    });
  }

  // One owner per run directory (run_lock.h): rank 0 takes the lock before any checkpoint is
  // read or any run file written; every rank learns whether it did.
  void take_run_lock() {
    agree(grid.world(), [&] {
      if (lead()) lock.emplace(paths.run_dir);
    });
  }

  // Resumes from the run directory's checkpoints when there are any (a requeued job runs the
  // same command line), from the one the policy chose (`runner resume` chose it before
  // planning). Loading writes nothing; a checkpoint that does not verify is skipped unless strict.
  void maybe_resume() {
    std::optional<ResumePoint> point = opts.resume_point;
    if (!point) agree(grid.world(), [&] { point = choose_resume_point(ckpt->dir(), opts.resume_step, opts.strict, log); });
    if (!point) {
      if (opts.resume) ckpt->remove_stale_files();  // a run killed before its first checkpoint left its temporary file
      if (opts.resume) throw UserError({ckpt->dir(), 0, 0}, "no checkpoint to resume from", "start the run with `runner train RECIPE`");
      return;
    }
    for (const std::string& why : point->skipped) log->warn("{}", why);
    resumed_from = ckpt->resume(*point, st);
    st.omp_threads = ops::num_threads();  // a single-rank load copies the checkpoint's scalars
    if (st.loaded_omp_threads > 0 && st.loaded_omp_threads != st.omp_threads)
      log->warn("the checkpoint was written with {} OpenMP thread(s) per rank and this run has {}: the losses will not "
                "continue bit for bit (the reductions split by thread); set OMP_NUM_THREADS={} (or train.threads) for "
                "an exact continuation", st.loaded_omp_threads, st.omp_threads, st.loaded_omp_threads);
    loader->restore(st.loader);
  }

  void setup_logging() {
    fs::create_directories(paths.run_dir);
    auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(
        (fs::path(paths.run_dir) / fmt::format("log.rank{}.txt", grid.rank())).string());
    std::vector<spdlog::sink_ptr> sinks{file_sink};
    if (!opts.quiet && lead()) sinks.push_back(std::make_shared<spdlog::sinks::stdout_color_sink_mt>());
    log = std::make_shared<spdlog::logger>("runner", sinks.begin(), sinks.end());
    // Ranks are named by their grid coordinates.
    log->set_pattern(multi() ? fmt::format("%H:%M:%S [{}] %v", grid.name()) : std::string("%H:%M:%S %v"));
    log->flush_on(spdlog::level::info);
  }

  // The recipe as resolved: every default and every derived number filled in.
  std::string resolved_recipe_yaml() const {
    Recipe rr = r;
    rr.batch = {plan.global, plan.micro, plan.accum};
    rr.parallel.dp = plan.dp;
    return recipe_to_yaml(rr);
  }

  void write_run_files() {
    if (lead()) {
      std::ofstream(fs::path(paths.run_dir) / "recipe.yaml") << resolved_recipe_yaml();
      std::ofstream(fs::path(paths.run_dir) / "plan.json") << plan.to_json().dump(2) << "\n";
      // Which GEMM each 16-bit dtype took and the measurements behind it; a continuation of
      // this run directory takes the same paths (Launch::agree_gemm_paths).
      if (r.precision.compute != FloatFormat::fp32)
        std::ofstream(fs::path(paths.run_dir) / "gemm_paths.json") << ops::gemm_paths().to_json() << "\n";
    }
    metrics->open(paths.run_dir, resumed_from);
  }

  void build() {
    const parallel::Coords c = grid.coords();
    st.rng.init_seed = seed();
    st.rng.dropout_seed = ops::rng_key(seed(), 1);
    st.rng.data_seed = ops::rng_key(seed(), 2);
    st.rng.sample_seed = ops::rng_key(seed(), 3);
    st.world_rank = grid.rank();
    st.omp_threads = ops::num_threads();
    st.world_size = grid.world_size();
    // Values in the compute format; gradients accumulate in precision.grad_accum (fp32 when the
    // compute is fp32); fp32 masters after the model decided each rank's ZeRO-1 piece.
    const std::vector<ops::TensorDesc> descs = plan.layout->rank_params(c.pp, c.tp);
    st.params = init_params(descs, r.model, st.rng.init_seed);  // grads: each desc's grad_dtype
    model = std::make_unique<RankModel>(plan, grid, be, st.params);
    if (keeps_masters(r.precision)) init_masters(st, descs, r.model, st.rng.init_seed);
    st.scaler.scale = scaler.initial();
    // Adam moments exist from the start (the ledger counts them), on this rank's ZeRO piece only.
    for (size_t i = 0; i < st.params.values.size(); ++i) {
      st.adam_m.emplace_back(moment_shape(st.params, i), ops::DType::F32, ops::Account::Optimizer);
      st.adam_v.emplace_back(moment_shape(st.params, i), ops::DType::F32, ops::Account::Optimizer);
    }
    LoaderConfig lc;
    lc.global_batch = plan.global;
    lc.micro = plan.micro;
    lc.dp_rank = c.dp;
    lc.dp_size = static_cast<int>(plan.dp);
    lc.workers = r.data.workers;
    lc.prefetch = r.data.prefetch;
    loader = std::make_unique<DataLoader>(train_src, lc, st.rng.data_seed);
    st.loader = loader->state();
    st.recipe_yaml = resolved_recipe_yaml();
  }

  void print_startup() {
    log->info("runner {} | run dir {}", RUNNER_VERSION, paths.run_dir);
    if (multi())
      log->info("  grid       {} ranks = dp {} x tp {} x pp {} (tp fastest, then dp, then pp) | this rank {} | "
                "{} gradient bucket(s){}",
                grid.world_size(), plan.dp, plan.tp, plan.pp, grid.name(), model->sync().bucket_count(),
                model->sync().zero1() ? " | ZeRO-1" : "");
    std::istringstream table(plan.table());
    for (std::string line; std::getline(table, line);) log->info("{}", line);
    log->info("  data       {}", train_src->describe());
    log->info("  threads    {}{} (OpenMP; OpenBLAS shares the pool) | fp32 GEMM peak {:.1f} GFLOP/s{} (measured, for MFU)",
              ops::num_threads(), multi() ? " per rank" : "", metrics->peak_flops() / 1e9,
              multi() ? fmt::format(" over {} ranks", grid.world_size()) : std::string());
    log->info("  precision  {}", precision_line());
    if (r.precision.compute != FloatFormat::fp32)
      log->info("  GEMM       {} (recorded in gemm_paths.json)", ops::gemm_paths().summary());
    log->info("  optimizer  adamw lr {:g} betas ({:g}, {:g}) wd {:g} clip {:g} | schedule {} warmup {}", r.optimizer.lr,
              r.optimizer.beta1, r.optimizer.beta2, r.optimizer.weight_decay, r.optimizer.grad_clip,
              to_string(r.optimizer.schedule.kind), r.optimizer.schedule.warmup_steps);
  }

  std::string precision_line() const {
    const PrecisionConfig& p = r.precision;
    if (p.compute == FloatFormat::fp32) return "fp32 (weights, activations, gradients, optimizer)";
    std::string line = fmt::format("{} weights and activations | {} | gradients accumulated in {} | Adam moments fp32",
                                   to_string(p.compute), keeps_masters(p) ? "fp32 master weights" : "no master copy (same)",
                                   to_string(p.grad_accum));
    if (scaler.active()) {
      const LossScaleConfig& c = scaler.config();
      line += p.loss_scale.mode == LossScaleMode::dynamic
                  ? fmt::format(" | loss scale dynamic from {:g} (x{:g} every {} clean steps, x{:g} on overflow, min {:g}, "
                                "stop after {} overflows in a row)", st.scaler.scale, c.growth_factor, c.growth_interval,
                                c.backoff_factor, c.min_scale, c.max_consecutive_skips)
                  : fmt::format(" | loss scale static {:g}", st.scaler.scale);
    } else if (p.compute == FloatFormat::fp16) {
      line += " | no loss scaling (mode none)";
    }
    if (diagnose()) line += " | gradient range diagnostics on";
    return line;
  }

  // Index of a micro-batch's first sample in the global batch: dp rank r holds the contiguous
  // slice [r*global/dp, (r+1)*global/dp), cut into micro-batches (runner/data/data.h).
  int64_t sample_offset(int64_t k) const { return grid.coords().dp * (plan.global / plan.dp) + k * plan.micro; }

  std::vector<Batch> next_batches() {
    std::vector<Batch> mbs;
    for (int64_t k = 0; k < plan.accum; ++k) mbs.push_back(loader->next());
    while (skip_batches.count(st.step)) {  // the batch that made the loss spike: skip it
      skip_batches.erase(st.step);
      log->warn("step {}: skipping the batch that caused the rollback", st.step + 1);
      mbs.clear();
      for (int64_t k = 0; k < plan.accum; ++k) mbs.push_back(loader->next());
    }
    if (st.step + 1 == faults.noise_step) {
      uint64_t x = 0x9E3779B97F4A7C15ull;
      for (Batch& b : mbs)
        for (size_t i = 0; i < b.tokens.size(); ++i) {
          x = x * 6364136223846793005ull + 1442695040888963407ull;
          b.tokens[i] = static_cast<int32_t>((x >> 33) % static_cast<uint64_t>(r.model.vocab_size));
          b.targets[i] = static_cast<int32_t>((x >> 13) % static_cast<uint64_t>(r.model.vocab_size));
        }
    }
    return mbs;
  }

  StepResult train_step() {
    StepResult res;
    auto t0 = Clock::now();
    const int64_t d0 = now_ns();
    std::vector<Batch> mbs = next_batches();
    loader->take_wait_ms();
    res.data_ms = ms_between(t0, Clock::now());  // the loader's wait and the batches' hand-over
    phase("data wait", "data", d0);
    debug_stall();
    // The loss is the mean over every target token of the global batch.
    int64_t count = 0;
    for (auto& b : mbs)
      for (int32_t t : b.targets) count += t >= 0;
    auto c0 = Clock::now();
    grid.dp().allreduce_sum(&count, 1);
    double comm = ms_between(c0, Clock::now());
    // fp16: the backward is seeded with scale / count, so every gradient is `scale` times larger.
    res.scale = st.scaler.scale;
    float dloss = count > 0 ? static_cast<float>(res.scale / static_cast<double>(count)) : 0.0f;
    uint64_t key = ops::rng_key(st.rng.dropout_seed, static_cast<uint64_t>(st.step));
    ops::MemoryTracker::instance().reset_peaks();
    std::vector<parallel::MicroBatch> micro;
    for (int64_t k = 0; k < plan.accum; ++k)
      micro.push_back({mbs[static_cast<size_t>(k)].tokens.data(), mbs[static_cast<size_t>(k)].targets.data(), sample_offset(k)});
    if (grid.rank() == faults.fail_rank && st.step + 1 == faults.fail_step)
      throw std::runtime_error(fmt::format("injected fault at step {} (RUNNER_FAULT_FAIL_RANK)", st.step + 1));
    parallel::PipelineStats ps = model->train(micro, dloss, key);
    res.fwd_ms = ps.forward_ms;
    res.bwd_ms = ps.backward_ms;
    res.pipe_wait_ms = ps.wait_ms;
    comm += ps.comm_ms;
    double loss_sum = ps.loss_sum;
    auto o0 = Clock::now();
    const int64_t f0 = now_ns();
    model->finish_grads();
    comm += ms_between(o0, Clock::now());
    phase("gradient sync wait", "sync", f0);
    res.comm_hidden_ms = model->sync().stats().hidden_ms;
    if (st.step + 1 == faults.nan_step) {
      faults.nan_step = -1;
      loss_sum = std::nan("");
      set_element(st.params.grads[0], 0, std::nanf(""));
    }
    if (faults.inf_step > 0 && st.step + 1 >= faults.inf_step && st.step + 1 < faults.inf_step + faults.inf_count)
      set_element(st.params.grads.back(), 0, INFINITY);
    double loss_part = (grid.last_stage() && grid.coords().tp == 0) ? loss_sum : 0.0;
    auto n0 = Clock::now();
    const int64_t g0 = now_ns();
    res.norm = std::sqrt(model->global_sum_squares(loss_part)) / res.scale;  // unscaled
    phase("gradient norm", "optimizer", g0);
    comm += model->last_norm_comm_ms();
    double opt = ms_between(n0, Clock::now()) - model->last_norm_comm_ms();
    res.loss = count > 0 ? loss_part / static_cast<double>(count) : 0.0;
    res.lr = lr_at(r.optimizer, st.step, r.train.steps);
    const bool finite = std::isfinite(res.loss) && std::isfinite(res.norm);
    if (scaler.active() && std::isfinite(res.loss) && !std::isfinite(res.norm)) {
      // fp16 overflow: skip the step, back the scale off, name the first tensor that overflowed.
      auto g0 = Clock::now();
      GradReport rep = grad_report(be, *model, st.params, *plan.layout, grid, res.scale);
      res.loss_scale_ms += ms_between(g0, Clock::now());
      res.overflow = res.skipped = true;
      if (rep.first_nonfinite >= 0) res.overflow_tensor = describe_tensor(rep.tensors[static_cast<size_t>(rep.first_nonfinite)]);
      scaler.update(st.scaler, false);
      log->warn("step {}: fp16 gradients overflowed at loss scale {:g} (first non-finite in backward order: {}); step "
                "skipped, scale now {:g} ({} in a row)",
                st.step + 1, res.scale, res.overflow_tensor.empty() ? "?" : res.overflow_tensor, st.scaler.scale,
                st.scaler.consecutive_skips);
    } else if (!finite) {
      res.skipped = true;
      st.scaler.skipped_steps++;
    } else {
      if (diagnose() && metrics->logged(st.step + 1)) {
        auto g0 = Clock::now();
        res.diagnostics = grad_report(be, *model, st.params, *plan.layout, grid, res.scale);
        res.loss_scale_ms += ms_between(g0, Clock::now());
      }
      scaler.update(st.scaler, true);
      auto a0 = Clock::now();
      const int64_t w0 = now_ns();
      adamw_step(be, r.optimizer, st, res.lr, clip_factor(res.norm, r.optimizer.grad_clip) / res.scale);
      phase("optimizer step", "optimizer", w0);
      auto a1 = Clock::now();
      const int64_t q0 = now_ns();
      model->gather_params();
      if (model->sync().zero1()) phase("gather parameters", "sync", q0);
      opt += ms_between(a0, a1);
      comm += ms_between(a1, Clock::now());
    }
    auto z0 = Clock::now();
    const int64_t zn = now_ns();
    zero_grads(st.params);
    opt += ms_between(z0, Clock::now());
    phase("zero gradients", "optimizer", zn);
    metrics->measure_memory();
    st.step++;
    st.tokens += plan.tokens_per_step;
    st.loader = loader->state();
    auto t1 = Clock::now();
    res.comm_exposed_ms = comm;  // every collective this step waited in, outside the backward's overlap
    res.opt_ms = opt;
    res.total_ms = ms_between(t0, t1);
    return res;
  }

  // RUNNER_DEBUG_STALL_RANK=R, RUNNER_DEBUG_STALL_EVERY=N, RUNNER_DEBUG_STALL_MS=T: world
  // rank R sleeps T ms at the start of every N-th step, as a rank sharing its cores with
  // another job would stall (a straggler, for the monitoring's tests).
  void debug_stall() {
    static const int64_t rank = Faults::env("RUNNER_DEBUG_STALL_RANK"), every = Faults::env("RUNNER_DEBUG_STALL_EVERY"),
                         ms = Faults::env("RUNNER_DEBUG_STALL_MS");
    if (rank != grid.rank() || ms <= 0 || every <= 0 || (st.step + 1) % every != 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(ms));
  }

  bool diagnose() const { return r.precision.diagnostics || opts.diagnose_precision; }

  static void set_element(ops::Tensor& t, int64_t i, float v) {
    if (t.dtype() == ops::DType::F32) t.data<float>()[i] = v;
    else ops::from_f32(static_cast<char*>(t.raw()) + i * static_cast<int64_t>(ops::dtype_size(t.dtype())), t.dtype(), &v, 1);
  }

  // More fp16 overflows in a row than the recipe allows: stop with kExitNumerics and say why.
  // The last published checkpoint stays as it was (the skipped steps changed no weights).
  int stop_on_overflows(const StepResult& s) {
    const LossScaleConfig& c = scaler.config();
    log->error("stopping: fp16 gradients overflowed on {} consecutive steps (precision.loss_scale.max_consecutive_skips "
               "is {}); the loss scale backed off to {:g} (min_scale {:g}).",
               st.scaler.consecutive_skips, c.max_consecutive_skips, st.scaler.scale, c.min_scale);
    log->error("  the first gradient to go non-finite, in backward order: {}",
               s.overflow_tensor.empty() ? std::string("(unknown)") : s.overflow_tensor);
    log->error("  what to try: precision.compute: bf16 (fp32's exponent range, no loss scaling); a lower optimizer.lr "
               "(now {:g}); a smaller precision.loss_scale.init (now {:g}) or min_scale; grad_clip if the gradients "
               "themselves diverge", r.optimizer.lr, c.init, c.min_scale);
    ckpt->poll();
    metrics->flush_monitor();
    end_event("stopped on fp16 overflows", kExitNumerics);
    return kExitNumerics;
  }

  // A signal asked us to stop: checkpoint at this step boundary and exit with kExitPreempted.
  int preempt() {
    log->warn("signal {} received: writing a checkpoint at step {} and exiting (code {})", stop_signal(), st.step,
              kExitPreempted);
    ckpt->save(st, true);
    metrics->flush_monitor();
    end_event("preempted", kExitPreempted);
    return kExitPreempted;
  }

  void end_event(const char* cause, int code) {
    if (!lead()) return;
    nlohmann::json j{{"event", "end"}, {"cause", cause}, {"step", st.step}, {"exit_code", code}};
    if (code == kExitPreempted)
      j["signal"] = stop_signal() == SIGUSR1 ? "SIGUSR1" : stop_signal() == SIGTERM ? "SIGTERM" : "a stop request";
    append_run_event(paths.run_dir, j);
  }

  // A stop signal reaches the ranks at different moments: they agree at step boundaries.
  bool stop_agreed() {
    int64_t stop = stop_requested() ? 1 : 0;
    grid.world().allreduce_max(&stop, 1);
    return stop != 0;
  }

  // The in-memory tier: a non-finite loss, or a loss above spike_threshold x its running mean,
  // rolls back to the last snapshot and skips the offending batch, without touching disk.
  bool rollback_needed(const StepResult& s) {
    // An fp16 overflow is the loss scaler's to handle (skipped, scale backed off), not a rollback.
    bool bad = !std::isfinite(s.loss) || (!std::isfinite(s.norm) && !s.overflow);
    bool spike = r.checkpoint.spike_threshold > 0 && st.loss_ema > 0 && st.step > 10 &&
                 s.loss > r.checkpoint.spike_threshold * st.loss_ema;
    if (!bad && std::isfinite(s.loss)) st.loss_ema = st.loss_ema > 0 ? 0.9 * st.loss_ema + 0.1 * s.loss : s.loss;
    if (!(bad || spike) || !snapshot.valid() || r.checkpoint.snapshot_every <= 0) return false;
    int64_t offending = st.step - 1;
    log->warn("step {}: loss {:.4f} ({}); rolling back to the in-memory snapshot of step {} and skipping that batch",
              st.step, s.loss, bad ? "not finite" : fmt::format("{:.1f}x its running mean", s.loss / st.loss_ema),
              snapshot.step());
    snapshot.restore(st);
    loader->restore(st.loader);
    skip_batches.insert(offending);
    metrics->rollback(offending + 1, st.step, s.loss);
    return true;
  }
};

}  // namespace

int run_training(const Plan& plan, const TrainOptions& opts, parallel::Grid& grid, ops::Backend& be) {
  Trainer t(plan, opts, grid, be);
  return t.run();
}

int run_training(const Plan& plan, const TrainOptions& opts, ops::Backend& be) {
  parallel::Grid grid(parallel::self_comm(), {1, 1, 1});
  return run_training(plan, opts, grid, be);
}

}  // namespace runner
