// The training loop of one rank, on any layout: data -> the step's forward and backward passes
// (RankModel) -> clip -> AdamW, and the step's state; a step returns its StepResult. Observers
// stand around the loop, each in its own file: the step timer and the tracer
// (runner/observe/step_timer.h, trace.h), metrics and the monitor (runner/observe/metrics.h),
// the in-memory rollback tier (rollback.h), checkpoints (runner/checkpoint/saver.h), the
// test fault hook (fault_hook.h), the banner and run files (startup.h).
// Everything a user can get wrong is checked before the run directory is touched
// (docs/invariants.md, invariant 6), and every rank agrees on such an error before any rank stops.
#include "runner/train/trainer.h"

#include <unistd.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "ops/backend.h"
#include "ops/rng.h"
#include "runner/agree.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/resume.h"
#include "runner/checkpoint/saver.h"
#include "runner/data/data.h"
#include "runner/observe/console_sink.h"
#include "runner/observe/metrics.h"
#include "runner/observe/op_profile.h"
#include "runner/observe/slow_steps.h"
#include "runner/observe/step_timer.h"
#include "runner/observe/trace.h"
#include "runner/perf/cost.h"
#include "runner/perf/hardware_profile.h"
#include "runner/perf/layout_advice.h"
#include "runner/perf/peak.h"
#include "runner/run/run_dir.h"
#include "runner/run/run_lock.h"
#include "runner/run/slurm.h"
#include "runner/signals.h"
#include "runner/state.h"
#include "runner/train/evaluate.h"
#include "runner/train/fault_hook.h"
#include "runner/train/history.h"
#include "runner/train/init_from.h"
#include "runner/train/optimizer.h"
#include "runner/train/precision.h"
#include "runner/train/rank_model.h"
#include "runner/train/requeued.h"
#include "runner/train/rollback.h"
#include "runner/train/startup.h"
#include "runner/train/watchdog.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

// Options the trainer does not implement yet are refused, never ignored.
void check_supported(const Plan& p, int64_t grid_world) {
  const Recipe& r = p.recipe;
  if (p.world != grid_world)
    throw UserError(r.loc("parallel"),
                    fmt::format("this recipe's layout needs {} rank{} (dp {} x tp {} x pp {}), but {} {} running", p.world,
                                p.world == 1 ? "" : "s", p.dp, p.tp, p.pp, grid_world, grid_world == 1 ? "process is" : "processes are"),
                    fmt::format("launch it with `mpirun -np {} runner train ...` (or `srun -n {}`), or set the parallel "
                                "degrees for {} rank{}", p.world, p.world, grid_world, grid_world == 1 ? "" : "s"));
}

class Trainer {
 public:
  Trainer(const Plan& p, TrainOptions o, parallel::Grid& g, ops::Backend& b)
      : plan(p), r(p.recipe), opts(std::move(o)), grid(g), be(b) {}
  ~Trainer() { set_abort_record(""); }

  int run() {
    if (!start()) return start_exit;  // a finished run (said so, changed nothing) or a refused restart
    const int64_t total = r.train.steps;
    if (st.step >= total) return finish_evaluation();
    while (st.step < total) {
      set_phase(Phase::Boundary, st.step);
      if (stop_agreed()) return preempt();
      rollback->before_step(st);
      tracer.begin(st.step + 1, *model);
      StepResult s = train_step();
      tracer.step_done(s.total_ms);
      watchdog->step_done(s.total_ms);
      faults.after_step();
      if (rollback->after_step(s, st)) {
        tracer.end(st.step);
        continue;
      }
      s.rollback_ms = rollback->take_ms();
      s.checkpoint_ms = ckpt_wall_ms;
      metrics->step(st.step, st.tokens, s, ckpt_stall_ms);
      note_step(st.step);  // the step a second signal's end record names: the last one recorded
      ckpt_stall_ms = 0;
      if (s.overflow && scaler.exhausted(st.scaler)) return stop_on_overflows(s);
      checkpoint_after_step();
      metrics->set_scaler(st.scaler, scaler.active());
      metrics->step_line(st.step, s);
      if (slow) {
        if (auto w = slow->step(s.total_ms / 1e3, live_machine)) warn_always({*w});
      }
      if (tracer.end(st.step)) {
        metrics->flush_monitor();  // its gather, started inside the window, is in the trace
        tracer.write(paths.run_dir, plan.accum, log.get());
      }
      if (s.skipped && !s.overflow) log->warn("step {}: non-finite loss or gradient norm; update skipped", st.step);
      ++steps_run;
      steps_applied += s.skipped ? 0 : 1;
      if (r.train.eval_every > 0 && st.step % r.train.eval_every == 0 && st.step != total)
        metrics->eval(st.step, evaluate_untimed());
    }
    if (steps_run > 0 && steps_applied == 0) return stop_all_skipped();
    set_phase(Phase::Checkpoint, st.step);
    ckpt->save(st, true);
    set_phase(Phase::Boundary, st.step);
    if (stop_agreed()) return preempt();
    EvalResult last_eval = evaluate_untimed();
    if (stop_agreed()) return preempt();
    metrics->eval(st.step, last_eval);
    metrics->summary(st.step, st.tokens, last_eval, StepTimer::since(run_t0) / 1e3, training_ops());
    end_event("done", 0);
    return 0;
  }

 private:
  const Plan& plan;
  const Recipe& r;
  TrainOptions opts;
  parallel::Grid& grid;
  int start_exit = 0;  // start() returned false: 0 (finished) or kExitNoRestart
  int64_t steps_run = 0, steps_applied = 0;  // steps this job took, and those whose update was applied
  ops::Backend& be;  // chosen once when the run started (runner/device/device.h)
  StepTimer timer;
  // Declared before everything that may hold a request reporting to its sink (pipeline
  // sends, gradient buckets, the monitor's gather), so it outlives them.
  Tracer tracer{grid, timer};
  FaultHook faults{grid.rank()};
  RunPaths paths;
  std::shared_ptr<const DataSource> train_src, val_src;
  std::unique_ptr<DataLoader> loader;
  TrainState st;
  std::unique_ptr<RankModel> model;
  std::shared_ptr<spdlog::logger> log;
  std::unique_ptr<CheckpointSaver> ckpt;
  std::unique_ptr<RunMetrics> metrics;
  std::unique_ptr<Rollback> rollback;
  LossScaler scaler{r.precision};
  int64_t resumed_from = -1;
  int64_t run_t0 = 0;  // when the steps began (StepTimer::now)
  // Breakdown parts outside the step, reported with the next step record: the last save's
  // stall, and the wall time of the checkpoint work after the step.
  double ckpt_stall_ms = 0, ckpt_wall_ms = 0;
  // The executors time every pass, evaluation's forwards too; the end-of-run table of top
  // operators is the training passes' (the step breakdown's forward and backward), so the
  // evaluations' share is kept apart and taken out.
  std::vector<ops::OpProfile> eval_ops;
  std::optional<RunLock> lock;  // rank 0: this run owns its directory until the Trainer ends
  std::optional<ResumePoint> point;  // the checkpoint this job continues from (none: step 0)
  std::optional<InitFrom> init;      // model.init_from: the weights step 0 starts from (none: random)
  std::string run_tokenizer;         // the directory RUN_DIR/tokenizer/ is copied from ("" none)
  std::optional<RecipeHistory> history;  // rank 0: this job's recipe against the one the run ran with
  std::string attempt;                   // this job's id in the run's records (start, hang)
  std::optional<SlowStepCheck> slow;     // rank 0: steps far slower than predicted are said, once
  // Last: stopped and joined first when the Trainer ends, while everything it reads still lives.
  std::unique_ptr<Watchdog> watchdog;

  bool lead() const { return grid.rank() == 0; }
  uint64_t seed() const { return static_cast<uint64_t>(r.train.seed); }
  bool diagnose() const { return r.precision.diagnostics || opts.diagnose_precision; }

  // Everything before the first step: inputs checked, the run directory taken, the state built
  // or resumed, the run files written, the peaks measured, the banner printed. False: the run
  // is finished and nothing was written (finished()).
  bool start() {
    install_signal_handlers();
    open_inputs();
    paths = run_paths(r, opts.run_dir);
    if ((start_exit = judge_requeued_start(grid.world(), r, paths)) != 0) return false;  // Slurm's own requeue
    agree(grid.world(), [&] {
      init = check_init_from(r, paths.checkpoint_dir);
      run_tokenizer = choose_run_tokenizer(r, init ? init->tokenizer_dir : "");
    });
    take_run_lock();
    choose_point();
    if (finished()) return false;
    choose_threads(r);
    build();
    log = open_run_log(paths.run_dir, grid, !opts.quiet && lead());
    ckpt = std::make_unique<CheckpointSaver>(plan, grid, paths.checkpoint_dir, log);
    metrics = std::make_unique<RunMetrics>(plan, grid, log);
    rollback = std::make_unique<Rollback>(r.checkpoint, *loader, *metrics, log);
    if (lock && !lock->took_over().empty())
      log->warn("took over the lock of a previous owner that is gone ({}): {}", lock->took_over(), lock->path());
    say_recipe_changes();  // before the load, which refuses the changes a checkpoint cannot take
    maybe_resume();
    ckpt->remove_stale_files();
    tracer.resumed_at(resumed_from);
    // The data's tokenizer goes with the run (RUN_DIR/tokenizer/, RUN_DIR/data.json): generate
    // and export read it there.
    if (lead()) install_run_tokenizer(r.data, paths.run_dir, run_tokenizer);
    if (lead()) {
      warn_always(history->keep(opts.resume_notes));  // the recipe the run ran with, kept when changed
      write_run_files(plan, paths.run_dir);
      warn_always(keep_later_history(paths.run_dir, paths.checkpoint_dir, resumed_from));
    }
    metrics->open(paths.run_dir, resumed_from);
    // Each start and stop of a job on this run directory (runner status reads them).
    // This job's ranks share one attempt id (rank 0's): a rank left over from an earlier
    // attempt (stopped, then continued) can tell that the run moved on (watchdog.h).
    int64_t token = lead() ? std::chrono::system_clock::now().time_since_epoch().count() / 1000 * 1000 + getpid() % 1000 : 0;
    grid.world().allreduce_max(&token, 1);
    attempt = std::to_string(token);
    if (lead()) {
      nlohmann::json ev = start_event(plan, grid.world_size(), resumed_from, opts.resume_notes);
      ev["attempt"] = attempt;
      append_run_event(paths.run_dir, ev);
    }
    // The MFU peak first: the watchdog's predicted step reads the CPU's profile, whose peak is
    // the same cached figure, and the run must say it measured the one its MFU is against.
    measure_peaks();
    start_watchdog();  // its timeout record follows the start record
    note_step(st.step);
    if (lead()) set_abort_record((fs::path(paths.run_dir) / "events.jsonl").string());  // a second signal's end record
    predict_own_step();
    print_startup(*log, plan, grid,
                  {paths.run_dir, train_src->describe(), model->sync().bucket_count(), model->sync().zero1(),
                   metrics->peak_flops(), metrics->peak_source(), precision_line(r.precision, scaler, st.scaler.scale, diagnose())});
    if (resumed_from >= 0) log->info("resumed from step {} ({})", resumed_from, ckpt->dir());
    if (init) log->info("started from the weights of {} (its step {}): optimizer, loss scaler and step fresh", init->checkpoint, init->step);
    log->info("watchdog: collective timeout {:g} s ({}); heartbeats in {}/.ranks/", watchdog->timeout_s(),
              watchdog->choice().source, paths.run_dir);
    for (const std::string& note : opts.resume_notes) log->info("{}", note);
    run_t0 = StepTimer::now();
    return true;
  }

  // A warning the user must see: on the log, and on stderr when --quiet keeps the log off the
  // console (quiet silences progress, not this).
  void warn_always(const std::vector<std::string>& lines) {
    for (const std::string& l : lines) {
      log->warn("{}", l);
      if (opts.quiet) console_write(stderr, l + "\n");
    }
  }

  // The checkpoint to continue from, chosen once before anything is built: `runner resume`
  // chose it to read its recipe; otherwise the run directory's newest one that verifies.
  void choose_point() {
    point = opts.resume_point;
    if (!point) agree(grid.world(), [&] { point = choose_resume_point(paths.checkpoint_dir, opts.resume_step, opts.strict); });
  }

  // A run whose checkpoint is at (or past) train.steps and whose end is recorded has nothing
  // to do: continuing would only evaluate again and overwrite its summary with one of no steps.
  // Rank 0 says so and how to extend it; nothing in the run directory is written. (At
  // train.steps without its final evaluation, a signal stopped that: finish_evaluation().)
  bool finished() {
    int64_t done = 0;  // rank 0 reads metrics.jsonl and decides for every rank
    if (lead() && point && point->step >= r.train.steps)
      done = point->step > r.train.steps || run_has_ended(paths.run_dir, point->step);
    grid.world().allreduce_max(&done, 1);
    if (done && lead()) {
      console_write(stdout, finished_message(paths.run_dir, *point, r));
    }
    return done != 0;
  }

  // Rank 0: a recipe other than the one the run ran with (its checkpoint's; without one, the
  // one the directory last ran with) is listed before the checkpoint is loaded, so a change the
  // load refuses is seen with its cause (train/history.h).
  void say_recipe_changes() {
    if (!lead()) return;
    history.emplace(paths.run_dir, point ? read_recipe_text(point->path) : stored_recipe_text(paths.run_dir),
                    resolved_recipe_yaml(plan), point ? point->step : -1);
    warn_always(history->said());
  }

  // MFU is against the peak of all ranks together (runner/perf/peak.h: the recipe's, the
  // device table's, or this CPU's, cached); a profiled run also measures its roofline.
  // The monitor's communication check (metrics.h set_prediction): this layout's predicted step
  // on the recipe's hardware profile, and the layout search it asks, once, for a better layout
  // when the exposed communication passes 30% of the step. Rank 0 alone raises alerts.
  void predict_own_step() {
    if (!lead()) return;
    try {
      const StepCost c = predict_step(plan, hardware_profile(r.hardware));
      if (c.step_s <= 0) return;  // no prediction for this device
      slow.emplace(c.step_s);
      metrics->set_prediction(c, [this, c](double share) { return search_layout_advice(plan, share, c.step_s); });
    } catch (const std::exception& e) {  // a bad profile costs the check, not the run
      log->warn("no predicted step for the monitor's communication check: {}", e.what());
    }
  }

  // The watchdog (watchdog.h) from here on: start-up is exempt until the first step is done.
  // The timeout: the recipe's, else one from this layout's predicted step on the recipe's
  // hardware profile, replaced by one from the measured steps after the first few.
  void start_watchdog() {
    set_phase(Phase::Startup, st.step);
    double predicted = 0;
    if (r.train.collective_timeout <= 0) try {
        predicted = predict_step(plan, hardware_profile(r.hardware)).step_s;
      } catch (const std::exception&) {  // no profile for this device: the floor until steps are measured
      }
    watchdog = std::make_unique<Watchdog>(paths.run_dir, grid.rank(), grid.world_size(),
                                          choose_timeout(r.train.collective_timeout, predicted, 0), log, lead(),
                                          !opts.quiet && lead(), attempt);
  }

  void measure_peaks() {
    const MfuPeak pk = mfu_peak(r.hardware, r.precision.compute, ops::num_threads());
    double v = pk.flops;
    grid.world().allreduce_sum(&v, 1);
    metrics->set_peak_flops(v, pk.kind, pk.source);
    tracer.measure_roofline(metrics->peak_flops());
  }

  // After a step's record: a save when one is due, and the poll of a background write (its
  // span only when one finished). Both go with the next step's record.
  void checkpoint_after_step() {
    set_phase(Phase::Checkpoint, st.step);
    const int64_t c0 = StepTimer::now();
    if (ckpt->after_step(st, StepTimer::ms(run_t0, c0) / 1e3)) {
      faults.after_checkpoint();
      ckpt_stall_ms = ckpt->last_stall_ms();
      timer.phase("checkpoint save", "checkpoint", c0);
    }
    const int64_t p0 = StepTimer::now();
    ckpt->poll();
    const int64_t p1 = StepTimer::now();
    if (p1 - p0 > 100000) timer.span("checkpoint poll", "checkpoint", p0, p1);  // a background write finished
    ckpt_wall_ms = StepTimer::ms(c0, p1);
    set_phase(Phase::Boundary, st.step);
  }

  EvalResult evaluate_untimed() {
    set_phase(Phase::Eval, st.step);
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

  // Everything that can fail on user input happens here, before any file is written.
  void open_inputs() {
    check_supported(plan, grid.world_size());
    agree(grid.world(), [&] {
      tracer.set_window(opts.profile.empty()
                            ? parse_profile(r.profile.steps, r.train.steps, r.loc("profile.steps"), "profile.steps")
                            : parse_profile(opts.profile, r.train.steps, {"--profile", 0, 0}, "--profile"));
      train_src = open_source(r.data, Split::Train, r.model.seq_len, r.model.vocab_size, seed());
      val_src = open_source(r.data, Split::Val, r.model.seq_len, r.model.vocab_size, seed());
      check_peak_cache_env();
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
  // same command line), from the one choose_point() took. Loading writes nothing; a checkpoint
  // that does not verify was skipped unless strict.
  void maybe_resume() {
    if (!point) {
      if (opts.resume) ckpt->remove_stale_files();  // a run killed before its first checkpoint left its temporary file
      if (opts.resume) throw UserError({ckpt->dir(), 0, 0}, "no checkpoint to resume from", "start the run with `runner train RECIPE`");
      return;
    }
    for (const std::string& why : point->skipped) log->warn("{}", why);
    resumed_from = load_resume_point(*point, plan, grid, st, log);
    // The load copied the checkpoint's recipe; this job's checkpoints carry this job's recipe,
    // or a later `runner resume` would quietly go back to the old learning rate, steps or layout.
    st.recipe_yaml = resolved_recipe_yaml(plan);
    ckpt->resumed_at(resumed_from);
    // A single-rank load copies the checkpoint's scalars; the count is this run's. Another count
    // than the writer's continues bit for bit: the kernels' reductions use fixed blocks.
    st.omp_threads = ops::num_threads();
    loader->restore(st.loader);
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
    if (init) load_init_weights(*init, plan, grid, st);
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
    st.recipe_yaml = resolved_recipe_yaml(plan);
  }

  // Index of a micro-batch's first sample in the global batch: dp rank r holds the contiguous
  // slice [r*global/dp, (r+1)*global/dp), cut into micro-batches (runner/data/data.h).
  int64_t sample_offset(int64_t k) const { return grid.coords().dp * (plan.global / plan.dp) + k * plan.micro; }

  std::vector<Batch> next_batches() {
    std::vector<Batch> mbs;
    for (int64_t k = 0; k < plan.accum; ++k) mbs.push_back(loader->next());
    while (rollback->skip_batch(st.step)) {  // the batch that made the loss spike: skip it
      mbs.clear();
      for (int64_t k = 0; k < plan.accum; ++k) mbs.push_back(loader->next());
    }
    faults.batches_ready(st.step + 1, mbs, r.model.vocab_size);
    return mbs;
  }

  // One step: the batches, this rank's passes, the gradient norm, the update, the state
  // advanced. Every phase is timed once (StepTimer) for the breakdown and the trace.
  StepResult train_step() {
    StepResult res;
    double comm = 0;  // every collective this step waited in, outside the backward's overlap
    const int64_t t0 = StepTimer::now();
    set_phase(Phase::Data, st.step + 1);
    std::vector<Batch> mbs = next_batches();
    loader->take_wait_ms();
    res.data_ms = timer.phase("data wait", "data", t0);  // the loader's wait and the batches' hand-over
    faults.after_data(st.step + 1);
    set_phase(Phase::Passes, st.step + 1);
    // The loss is the mean over every target token of the global batch.
    int64_t count = 0;
    for (auto& b : mbs)
      for (int32_t t : b.targets) count += t >= 0;
    const int64_t c0 = StepTimer::now();
    grid.dp().allreduce_sum(&count, 1);
    comm += StepTimer::since(c0);
    double loss_sum = passes(mbs, count, res, comm);
    faults.after_grads(st.step + 1, loss_sum, st.params);
    double loss_part = (grid.last_stage() && grid.coords().tp == 0) ? loss_sum : 0.0;
    set_phase(Phase::Optimizer, st.step + 1);
    const int64_t n0 = StepTimer::now();
    res.norm = std::sqrt(model->global_sum_squares(loss_part)) / res.scale;  // unscaled
    double opt = timer.phase("gradient norm", "optimizer", n0) - model->last_norm_comm_ms();
    comm += model->last_norm_comm_ms();
    res.loss = count > 0 ? loss_part / static_cast<double>(count) : 0.0;
    res.lr = lr_at(r.optimizer, st.step, r.train.steps);
    update(res, opt, comm);
    // An applied update zeroed the gradients it read (adamw_step's fused
    // pass); the rest here. A skipped step zeroes them all.
    const int64_t z0 = StepTimer::now();
    if (res.skipped) zero_grads(st.params);
    else zero_grads_rest(be, st.params);
    opt += timer.phase("zero gradients", "optimizer", z0);
    metrics->measure_memory();
    st.step++;
    st.tokens += plan.tokens_per_step;
    st.loader = loader->state();
    res.comm_exposed_ms = comm;
    res.opt_ms = opt;
    res.total_ms = StepTimer::since(t0);
    return res;
  }

  // The forward and backward passes over the step's micro-batches and the wait for the
  // gradients' synchronisation; returns this rank's summed loss.
  double passes(const std::vector<Batch>& mbs, int64_t count, StepResult& res, double& comm) {
    // fp16: the backward is seeded with scale / count, so every gradient is `scale` times larger.
    res.scale = st.scaler.scale;
    float dloss = count > 0 ? static_cast<float>(res.scale / static_cast<double>(count)) : 0.0f;
    uint64_t key = ops::rng_key(st.rng.dropout_seed, static_cast<uint64_t>(st.step));
    ops::MemoryTracker::instance().reset_peaks();
    std::vector<parallel::MicroBatch> micro;
    for (int64_t k = 0; k < plan.accum; ++k)
      micro.push_back({mbs[static_cast<size_t>(k)].tokens.data(), mbs[static_cast<size_t>(k)].targets.data(), sample_offset(k)});
    faults.before_passes(st.step + 1);
    parallel::PipelineStats ps = model->train(micro, dloss, key);
    res.fwd_ms = ps.forward_ms;
    res.bwd_ms = ps.backward_ms;
    res.pipe_wait_ms = ps.wait_ms;
    comm += ps.comm_ms;
    const int64_t f0 = StepTimer::now();
    model->finish_grads();
    comm += timer.phase("gradient sync wait", "sync", f0);
    res.comm_hidden_ms = model->sync().stats().hidden_ms;
    return ps.loss_sum;
  }

  // Clips and applies the gradients when they are finite. An fp16 overflow is the loss
  // scaler's (overflowed()); any other non-finite step is skipped.
  void update(StepResult& res, double& opt, double& comm) {
    if (scaler.active() && std::isfinite(res.loss) && !std::isfinite(res.norm)) return overflowed(res);
    if (!std::isfinite(res.loss) || !std::isfinite(res.norm)) {
      res.skipped = true;
      st.scaler.skipped_steps++;
      return;
    }
    if (diagnose() && metrics->logged(st.step + 1)) {
      const int64_t g0 = StepTimer::now();
      res.diagnostics = grad_report(be, *model, st.params, *plan.layout, grid, res.scale);
      res.loss_scale_ms += StepTimer::since(g0);
    }
    scaler.update(st.scaler, true);
    const int64_t a0 = StepTimer::now();
    adamw_step(be, r.optimizer, st, res.lr, clip_factor(res.norm, r.optimizer.grad_clip) / res.scale,
               /*zero_grads=*/true);
    opt += timer.phase("optimizer step", "optimizer", a0);
    const int64_t a1 = StepTimer::now();
    model->gather_params();
    comm += model->sync().zero1() ? timer.phase("gather parameters", "sync", a1) : StepTimer::since(a1);
  }

  // fp16 overflow: the step is skipped, the scale backed off, the first tensor that overflowed named.
  void overflowed(StepResult& res) {
    const int64_t g0 = StepTimer::now();
    GradReport rep = grad_report(be, *model, st.params, *plan.layout, grid, res.scale);
    res.loss_scale_ms += StepTimer::since(g0);
    res.overflow = res.skipped = true;
    if (rep.first_nonfinite >= 0) res.overflow_tensor = describe_tensor(rep.tensors[static_cast<size_t>(rep.first_nonfinite)]);
    scaler.update(st.scaler, false);
    log->warn("step {}: fp16 gradients overflowed at loss scale {:g} (first non-finite in backward order: {}); step "
              "skipped, scale now {:g} ({} in a row)",
              st.step + 1, res.scale, res.overflow_tensor.empty() ? "?" : res.overflow_tensor, st.scaler.scale,
              st.scaler.consecutive_skips);
  }

  // The run had trained all its steps when a signal stopped its final evaluation: this job runs
  // that evaluation and records it. No summary: this job timed no step (one would report 0
  // tokens/s); the step records before it stand.
  int finish_evaluation() {
    log->info("step {} of {} was reached before; running the final evaluation the last job did not finish", st.step,
              r.train.steps);
    EvalResult last_eval = evaluate_untimed();
    if (stop_agreed()) return preempt();
    metrics->eval(st.step, last_eval);
    end_event("done", 0);
    return 0;
  }

  // Every step this job took was skipped (a non-finite loss or gradient norm each time): the
  // weights never changed, so "done" with exit 0 would report a training that did not happen.
  // No checkpoint: the last one (or init_from) holds the same weights.
  int stop_all_skipped() {
    log->error("stopping: every one of the {} step(s) this job ran was skipped (a non-finite loss or gradient norm at "
               "each), so no update was applied; the weights are as they were at step {}",
               steps_run, st.step - steps_run);
    log->error("  what to check: non-finite weights in the checkpoint or model.init_from it starts from (`runner inspect`), "
               "data tokens beyond model.vocab_size, a much lower optimizer.lr");
    metrics->flush_monitor();
    end_event("stopped: every step skipped", kExitNumerics);
    return kExitNumerics;
  }

  // More fp16 overflows in a row than the recipe allows: stop with kExitNumerics and say why.
  // The last published checkpoint stays as it was (the skipped steps changed no weights).
  int stop_on_overflows(const StepResult& s) {
    const LossScaleConfig& c = scaler.config();
    const bool dynamic = c.mode == LossScaleMode::dynamic;
    // A static scale never backs off: say it stayed, and point at what would move it.
    const std::string scale = dynamic ? fmt::format("the loss scale backed off to {:g} (min_scale {:g})", st.scaler.scale, c.min_scale)
                                      : fmt::format("the loss scale stayed at {:g} (precision.loss_scale.mode static never "
                                                    "backs off)", st.scaler.scale);
    log->error("stopping: fp16 gradients overflowed on {} consecutive steps (precision.loss_scale.max_consecutive_skips "
               "is {}); {}.", st.scaler.consecutive_skips, c.max_consecutive_skips, scale);
    log->error("  the first gradient to go non-finite, in backward order: {}",
               s.overflow_tensor.empty() ? std::string("(unknown)") : s.overflow_tensor);
    const std::string scale_fix = dynamic ? fmt::format("a smaller precision.loss_scale.init (now {:g}) or min_scale", c.init)
                                          : fmt::format("a smaller precision.loss_scale.init (now {:g}) or "
                                                        "precision.loss_scale.mode: dynamic", c.init);
    log->error("  what to try: precision.compute: bf16 (fp32's exponent range, no loss scaling); a lower optimizer.lr "
               "(now {:g}); {}; grad_clip if the gradients themselves diverge", r.optimizer.lr, scale_fix);
    ckpt->poll();
    metrics->flush_monitor();
    end_event("stopped on fp16 overflows", kExitNumerics);
    return kExitNumerics;
  }

  // A signal asked us to stop: checkpoint at this step boundary and exit with kExitPreempted.
  int preempt() {
    log->warn("{} received: writing a checkpoint at step {} and exiting (code {})", stop_signal_name(), st.step,
              kExitPreempted);
    set_phase(Phase::Checkpoint, st.step);
    ckpt->save(st, true);
    metrics->flush_monitor();
    end_event("preempted", kExitPreempted);
    if (lead())
      log->info("stopped at step {} of {} with a checkpoint; continue with `runner resume {}`", st.step, r.train.steps,
                paths.run_dir);
    return kExitPreempted;
  }

  void end_event(const char* cause, int code) {
    if (lead()) append_end_event(paths.run_dir, cause, st.step, code);
  }

  // A stop signal reaches the ranks at different moments: they agree at step boundaries.
  bool stop_agreed() {
    int64_t stop = stop_requested() ? 1 : 0;
    grid.world().allreduce_max(&stop, 1);
    return stop != 0;
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
