// The single-rank training loop: data -> forward/backward over the micro-batches of a
// step -> clip -> AdamW -> log, evaluate, checkpoint. Everything a user can get wrong is
// checked before the run directory is touched (invariant 6).
#include "runner/train/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <set>
#include <sstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "ops/backend.h"
#include "ops/executor.h"
#include "ops/peak.h"
#include "ops/rng.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/data/data.h"
#include "runner/train/optimizer.h"
#include "parallel/grad_sync.h"
#include "parallel/pipeline.h"
#include "runner/signals.h"
#include "runner/state.h"
#include "runner/checkpoint/state_shards.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

using Clock = std::chrono::steady_clock;
double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

std::string human_count(double v) {
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e4) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

std::string human_duration(double s) {
  if (!std::isfinite(s) || s < 0) return "?";
  if (s < 90) return fmt::format("{:.0f}s", s);
  if (s < 5400) return fmt::format("{:.0f}m", s / 60);
  return fmt::format("{:.1f}h", s / 3600);
}

// Options this trainer does not implement yet are refused, never ignored.
void check_supported(const Plan& p, int64_t grid_world) {
  const Recipe& r = p.recipe;
  auto unsupported = [&](const std::string& path, const std::string& what, const std::string& fix) {
    throw UserError(r.loc(path), what + " is not supported by `runner train` yet", fix);
  };
  if (r.precision.compute != "fp32")
    unsupported("precision.compute", "precision.compute " + r.precision.compute,
                "train with precision.compute: fp32 (runner plan accepts it for sizing)");
  if (p.world != grid_world)
    throw UserError(r.loc("parallel"),
                    fmt::format("this recipe's layout needs {} ranks (dp {} x tp {} x pp {}), but {} {} running", p.world,
                                p.dp, p.tp, p.pp, grid_world, grid_world == 1 ? "process is" : "processes are"),
                    fmt::format("launch it with `mpirun -np {} runner train ...` (or `srun -n {}`), or set the parallel "
                                "degrees for {} rank{}", p.world, p.world, grid_world, grid_world == 1 ? "" : "s"));
}


struct Trainer {
  const Plan& plan;
  const Recipe& r;
  TrainOptions opts;
  parallel::Grid& grid;
  ops::Backend& be = ops::cpu_backend();
  std::shared_ptr<const DataSource> train_src, val_src;
  std::unique_ptr<DataLoader> loader;
  ops::Graph graph;                      // this rank's parameters (with one model chunk: its whole graph)
  std::vector<ops::Graph> chunk_graphs;  // the model chunks this rank runs (several under the interleaved schedule)
  // One executor per micro-batch a pipeline stage holds at once (1 without pipelining); all
  // share the parameters.
  std::vector<std::unique_ptr<ops::Executor>> execs;
  std::unique_ptr<parallel::GradSync> sync;
  std::vector<std::vector<std::vector<int>>> ready_at;  // [chunk][node] -> parameters whose gradient is complete after its backward
  std::vector<char> seq_partial;           // per parameter: its gradient is summed over tp first (sequence parallelism)
  std::vector<char> tp_replicated;         // per parameter: every tp rank holds all of it
  std::vector<parallel::PipeAction> sched;
  std::unique_ptr<parallel::PipelineRunner> pipe;
  int tied_wte = -1;           // ParamSet index of the embedding tied across the first and last stage
  double pipe_wait_total = 0, step_ms_total = 0, comm_hidden_total = 0, comm_exposed_total = 0;
  bool multi() const { return grid.world_size() > 1; }
  bool lead() const { return grid.rank() == 0; }
  TrainState st;
  std::string run_dir;
  std::ofstream metrics;
  std::shared_ptr<spdlog::logger> log;
  double peak_flops = 0;
  std::array<size_t, ops::kAccounts> measured_peak{};
  std::unique_ptr<CheckpointManager> ckpt;
  MemorySnapshot snapshot;
  int64_t resumed_from = -1;
  int64_t rollbacks = 0;
  std::set<int64_t> skip_batches;  // steps whose batch is skipped after a rollback

  Trainer(const Plan& p, TrainOptions o, parallel::Grid& g) : plan(p), r(p.recipe), opts(std::move(o)), grid(g) {}

  uint64_t seed() const { return static_cast<uint64_t>(r.train.seed); }

  // Everything that can fail on user input happens here, before any file is written.
  void open_inputs() {
    check_supported(plan, grid.world_size());
    agree([&] {
      train_src = open_source(r.data, Split::Train, r.model.seq_len, r.model.vocab_size, seed());
      val_src = open_source(r.data, Split::Val, r.model.seq_len, r.model.vocab_size, seed());
    });
  }

  // Runs `f` on every rank; if it throws a UserError on any rank, every rank throws (the lowest
  // failing rank's error is the one printed, by that rank), so the job exits with code 2 as one
  // and no rank is left waiting in a collective.
  template <class F>
  void agree(F&& f) {
    std::optional<UserError> err;
    try {
      f();
    } catch (const UserError& e) {
      err = e;
    }
    if (!multi()) {
      if (err) throw *err;
      return;
    }
    int64_t first = err ? grid.rank() : grid.world_size();
    grid.world().allreduce_min(&first, 1);
    if (first == grid.world_size()) return;
    if (grid.rank() == first) throw AgreedUserError(*err);
    throw SilentExit{kExitUserError};
  }

  std::string checkpoint_dir() const {
    return r.checkpoint.dir.empty() ? (fs::path(run_dir) / "checkpoints").string() : r.checkpoint.dir;
  }

  // Resumes from the run directory's checkpoints when there are any (a requeued job runs the
  // same command line). Loading writes nothing; a corrupt checkpoint falls back unless strict.
  void maybe_resume() {
    ckpt = std::make_unique<CheckpointManager>(checkpoint_dir(), r.checkpoint);
    ckpt->set_logger(log);
    if (!ckpt->has_checkpoints()) {
      if (opts.resume) throw UserError({checkpoint_dir(), 0, 0}, "no checkpoint to resume from", "start the run with `runner train RECIPE`");
      return;
    }
    std::optional<int64_t> step;
    agree([&] {
      if (!multi()) {  // the logical tensors are this rank's tensors
        if (opts.resume_step >= 0) step = ckpt->load_step(opts.resume_step, st, opts.strict);
        else step = ckpt->load_latest(st, opts.strict);
        return;
      }
      // Each rank reads the logical tensors of its own parameters and keeps its slice, so a
      // checkpoint of any layout resumes on this one.
      TrainState t = logical_template(graph, r.model.vocab_size, grid.rank(), grid.world_size());
      ckpt->set_subset_load(true);
      if (opts.resume_step >= 0) step = ckpt->load_step(opts.resume_step, t, opts.strict);
      else step = ckpt->load_latest(t, opts.strict);
      if (step) load_local_from_logical(graph, r.model.vocab_size, t, st);
    });
    if (multi()) {  // every rank must continue from the same step
      int64_t lo = step ? *step : -1, hi = lo;
      grid.world().allreduce_min(&lo, 1);
      grid.world().allreduce_max(&hi, 1);
      if (lo != hi)
        throw std::runtime_error(fmt::format("ranks loaded different checkpoints (steps {} to {}); is the checkpoint "
                                             "directory on a file system all ranks share?", lo, hi));
    }
    if (!step) return;
    resumed_from = *step;
    loader->restore(st.loader);
  }

  // On resume, metrics.jsonl keeps only what happened up to the checkpoint, so the file reads
  // as one uninterrupted run.
  void truncate_metrics_after(int64_t step) {
    fs::path path = fs::path(run_dir) / "metrics.jsonl";
    if (!fs::exists(path)) return;
    std::ifstream in(path);
    std::ostringstream kept;
    for (std::string line; std::getline(in, line);) {
      try {
        auto j = nlohmann::json::parse(line);
        if (j.contains("summary") || !j.contains("step") || j["step"].get<int64_t>() > step) continue;
      } catch (const nlohmann::json::exception&) {
        continue;  // a line torn by a kill
      }
      kept << line << "\n";
    }
    in.close();
    fs::path tmp = path;
    tmp += ".tmp";
    {
      std::ofstream out(tmp, std::ios::trunc);
      out << kept.str();
    }
    fs::rename(tmp, path);
  }

  void setup_logging() {
    fs::create_directories(run_dir);
    auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>(
        (fs::path(run_dir) / fmt::format("log.rank{}.txt", grid.rank())).string());
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
    if (!lead()) return;
    {
      std::ofstream f(fs::path(run_dir) / "recipe.yaml");
      f << resolved_recipe_yaml();
    }
    {
      std::ofstream f(fs::path(run_dir) / "plan.json");
      f << plan.to_json().dump(2) << "\n";
    }
    if (resumed_from >= 0) truncate_metrics_after(resumed_from);
    metrics.open(fs::path(run_dir) / "metrics.jsonl", std::ios::app);
  }

  void build() {
    const parallel::Coords c = grid.coords();
    graph = rank_param_graph(plan, c.pp, c.tp);
    const int P = static_cast<int>(plan.pp), V = static_cast<int>(plan.chunks);
    for (int k = 0; k < V; ++k) chunk_graphs.push_back(build_gpt_graph(plan.chunk_spec(k * P + c.pp, c.tp)));
    st.rng.init_seed = seed();
    st.rng.dropout_seed = ops::rng_key(seed(), 1);
    st.rng.data_seed = ops::rng_key(seed(), 2);
    st.rng.sample_seed = ops::rng_key(seed(), 3);
    st.world_rank = grid.rank();
    st.world_size = grid.world_size();
    st.params = init_params(graph, r.model, st.rng.init_seed);
    ParamSet& ps = st.params;
    // The embedding tied across the first and last stage: two copies whose gradients are summed
    // over the embedding group before the data-parallel reduction.
    if (plan.pp > 1 && r.model.tie_embeddings && (grid.first_stage() || grid.last_stage())) tied_wte = ps.index("wte");
    std::vector<parallel::GradTensor> gts;
    for (size_t i = 0; i < ps.values.size(); ++i)
      gts.push_back({&ps.values[i], &ps.grads[i], static_cast<int>(i) == tied_wte});
    sync = std::make_unique<parallel::GradSync>(grid.dp(), std::move(gts), r.parallel.bucket_mb * 1024.0 * 1024.0,
                                                r.parallel.zero == 1);
    if (sync->zero1()) {
      for (size_t i = 0; i < ps.values.size(); ++i) {
        ps.owned.push_back(sync->owned(static_cast<int>(i)));
        ps.sharded.push_back(sync->sharded(static_cast<int>(i)));
      }
    }
    for (size_t i = 0; i < ps.names.size(); ++i) {
      const ops::TensorDesc& d = graph.tensors[static_cast<size_t>(graph.find(ps.names[i]))];
      seq_partial.push_back(d.seq_partial ? 1 : 0);
      tp_replicated.push_back(d.shard.dim < 0 ? 1 : 0);
    }
    // Gradients become final after the backward of the first node (in forward order) reading them.
    for (const ops::Graph& cg : chunk_graphs) {
      ready_at.emplace_back(cg.nodes.size());
      for (size_t i = 0; i < ps.names.size(); ++i) {
        int id = cg.find(ps.names[i]);
        if (id < 0) continue;  // another chunk's
        for (int n = 0; n < static_cast<int>(cg.nodes.size()); ++n) {
          const auto& in = cg.nodes[static_cast<size_t>(n)].in;
          if (std::find(in.begin(), in.end(), id) != in.end()) {
            ready_at.back()[static_cast<size_t>(n)].push_back(static_cast<int>(i));
            break;
          }
        }
      }
    }
    // Without pipelining, 1F1B on one stage: each micro-batch's forward, then its backward.
    sched = plan.pp > 1 ? parallel::pipeline_schedule(r.parallel.schedule, c.pp, P, static_cast<int>(plan.accum), V)
                        : parallel::schedule_1f1b(0, 1, static_cast<int>(plan.accum));
    // Chunk k of this stage is virtual stage k*P + stage; its neighbours are the chunks before
    // and after it, on the previous and next stage (wrapping around between chunks).
    std::vector<parallel::PipelineChunk> pcs;
    for (int k = 0; k < V; ++k) {
      const ops::Graph& cg = chunk_graphs[static_cast<size_t>(k)];
      parallel::PipelineChunk pc;
      pc.graph = &cg;
      pc.vstage = k * P + c.pp;
      if (pc.vstage > 0) pc.prev_rank = parallel::world_rank_of(grid.shape(), {c.dp, c.tp, (c.pp + P - 1) % P});
      if (pc.vstage < P * V - 1) pc.next_rank = parallel::world_rank_of(grid.shape(), {c.dp, c.tp, (c.pp + 1) % P});
      const int slots = std::max(1, parallel::max_in_flight(sched, k));
      for (int j = 0; j < slots; ++j) {
        execs.push_back(std::make_unique<ops::Executor>(cg, be));
        bind_params(*execs.back(), cg, ps);
        if (plan.tp > 1) execs.back()->set_group(&grid.tp());
        pc.slots.push_back(execs.back().get());
      }
      pcs.push_back(std::move(pc));
    }
    pipe = std::make_unique<parallel::PipelineRunner>(std::move(pcs), grid.world());
    // Adam moments exist from the start (the ledger counts them), on this rank's ZeRO piece only.
    for (size_t i = 0; i < ps.values.size(); ++i) {
      st.adam_m.emplace_back(moment_shape(ps, i), ops::DType::F32, ops::Account::Optimizer);
      st.adam_v.emplace_back(moment_shape(ps, i), ops::DType::F32, ops::Account::Optimizer);
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
    log->info("runner {} | run dir {}", RUNNER_VERSION, run_dir);
    if (multi())
      log->info("  grid       {} ranks = dp {} x tp {} x pp {} (tp fastest, then dp, then pp) | this rank {} | "
                "{} gradient bucket(s){}",
                grid.world_size(), plan.dp, plan.tp, plan.pp, grid.name(), sync->bucket_count(),
                sync->zero1() ? " | ZeRO-1" : "");
    for (std::string line; const auto& chunk : {plan.table()}) {
      std::istringstream in(chunk);
      while (std::getline(in, line)) log->info("{}", line);
    }
    log->info("  data       {}", train_src->describe());
    log->info("  threads    {}{} (OpenMP; OpenBLAS shares the pool) | fp32 GEMM peak {:.1f} GFLOP/s{} (measured, for MFU)",
              ops::num_threads(), multi() ? " per rank" : "", peak_flops / 1e9,
              multi() ? fmt::format(" over {} ranks", grid.world_size()) : std::string());
    log->info("  optimizer  adamw lr {:g} betas ({:g}, {:g}) wd {:g} clip {:g} | schedule {} warmup {}", r.optimizer.lr,
              r.optimizer.beta1, r.optimizer.beta2, r.optimizer.weight_decay, r.optimizer.grad_clip,
              r.optimizer.schedule.kind, r.optimizer.schedule.warmup_steps);
  }

  struct StepResult {
    double loss = 0, norm = 0, lr = 0;
    double data_ms = 0, fwd_ms = 0, bwd_ms = 0, opt_ms = 0, total_ms = 0;
    double comm_hidden_ms = 0, comm_exposed_ms = 0, pipe_wait_ms = 0;
    bool skipped = false;
  };

  // Index of a micro-batch's first sample in the global batch: dp rank r holds the contiguous
  // slice [r*global/dp, (r+1)*global/dp), cut into micro-batches (runner/data.h).
  int64_t sample_offset(int64_t k) const { return grid.coords().dp * (plan.global / plan.dp) + k * plan.micro; }

  // Global gradient norm over the logical model: every element counted once, whichever ranks
  // hold copies of it (data-parallel replicas, tensor-parallel replicated norms and biases, the
  // tied embedding on two stages). `extra` is summed along (the step's loss), in one all-reduce.
  double global_sum_squares(double& extra) {
    const ParamSet& ps = st.params;
    const parallel::Coords c = grid.coords();
    double ss = 0;
    for (size_t i = 0; i < ps.grads.size(); ++i) {
      if (static_cast<int>(i) == tied_wte && !grid.first_stage()) continue;
      if (tp_replicated[i] && c.tp != 0) continue;
      if (!ps.zero_sharded(i) && c.dp != 0) continue;
      auto [a, e] = ps.owned_range(i);
      if (e > a) ss += be.sum_squares(ps.grads[i].data<float>() + a, e - a);
    }
    double v[2] = {ss, extra};
    grid.world().allreduce_sum(v, 2);
    extra = v[1];
    return v[0];
  }

  StepResult train_step() {
    StepResult res;
    auto t0 = Clock::now();
    std::vector<Batch> mbs;
    for (int64_t k = 0; k < plan.accum; ++k) mbs.push_back(loader->next());
    while (skip_batches.count(st.step)) {  // the batch that made the loss spike: skip it
      skip_batches.erase(st.step);
      log->warn("step {}: skipping the batch that caused the rollback", st.step + 1);
      mbs.clear();
      for (int64_t k = 0; k < plan.accum; ++k) mbs.push_back(loader->next());
    }
    res.data_ms = loader->take_wait_ms();
    // The loss is the mean over every target token of the global batch.
    int64_t count = 0;
    for (auto& b : mbs)
      for (int32_t t : b.targets) count += t >= 0;
    grid.dp().allreduce_sum(&count, 1);
    float dloss = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
    uint64_t key = ops::rng_key(st.rng.dropout_seed, static_cast<uint64_t>(st.step));
    double loss_sum = 0;
    ops::MemoryTracker::instance().reset_peaks();
    std::vector<parallel::MicroBatch> micro;
    for (int64_t k = 0; k < plan.accum; ++k)
      micro.push_back({mbs[static_cast<size_t>(k)].tokens.data(), mbs[static_cast<size_t>(k)].targets.data(), sample_offset(k)});
    // Fault injection for tests (RUNNER_FAULT_FAIL_RANK=R, RUNNER_FAULT_FAIL_STEP=N): world rank
    // R fails in the middle of step N, as a crashed kernel or a lost node would.
    static const int64_t fail_rank = std::getenv("RUNNER_FAULT_FAIL_RANK") ? std::atoll(std::getenv("RUNNER_FAULT_FAIL_RANK")) : -1;
    static const int64_t fail_step = std::getenv("RUNNER_FAULT_FAIL_STEP") ? std::atoll(std::getenv("RUNNER_FAULT_FAIL_STEP")) : -1;
    if (grid.rank() == fail_rank && st.step + 1 == fail_step)
      throw std::runtime_error(fmt::format("injected fault at step {} (RUNNER_FAULT_FAIL_RANK)", st.step + 1));
    // The step's last backward makes the gradients final: each goes to its data-parallel
    // bucket as the backward completes it (summed over tp first under sequence parallelism).
    sync->start_step();
    parallel::PipelineStats ps = pipe->train(sched, micro, dloss, key, [this](int chunk, int node) {
      for (int p : ready_at[static_cast<size_t>(chunk)][static_cast<size_t>(node)]) {
        if (seq_partial[static_cast<size_t>(p)]) {  // each tp rank saw only its rows of the sequence
          ops::Tensor& gr = st.params.grads[static_cast<size_t>(p)];
          grid.tp().allreduce_sum(gr.data<float>(), gr.numel());
        }
        sync->grad_ready(p);
      }
      sync->progress();
    });
    res.fwd_ms = ps.forward_ms;
    res.bwd_ms = ps.backward_ms;
    res.pipe_wait_ms = ps.wait_ms;
    loss_sum = ps.loss_sum;
    auto o0 = Clock::now();
    sync->finish_grads();
    if (tied_wte >= 0) {  // the two copies of the tied embedding: sum over stages, then over dp
      ops::Tensor& g = st.params.grads[static_cast<size_t>(tied_wte)];
      if (grid.embed()) grid.embed()->allreduce_sum(g.data<float>(), g.numel());
      grid.dp().allreduce_sum(g.data<float>(), g.numel());
    }
    res.comm_hidden_ms = sync->stats().hidden_ms;
    // Fault injection for tests (RUNNER_FAULT_NAN_STEP=N): the first time step N runs, its loss
    // and gradients become NaN, as a numerical blow-up would make them.
    static int64_t nan_step = std::getenv("RUNNER_FAULT_NAN_STEP") ? std::atoll(std::getenv("RUNNER_FAULT_NAN_STEP")) : -1;
    if (st.step + 1 == nan_step) {
      nan_step = -1;
      loss_sum = std::nan("");
      st.params.grads[0].data<float>()[0] = std::nanf("");
    }
    double loss_part = (grid.last_stage() && grid.coords().tp == 0) ? loss_sum : 0.0;
    res.norm = std::sqrt(global_sum_squares(loss_part));
    res.loss = count > 0 ? loss_part / static_cast<double>(count) : 0.0;
    res.lr = lr_at(r.optimizer, st.step, r.train.steps);
    if (!std::isfinite(res.loss) || !std::isfinite(res.norm)) {
      res.skipped = true;
      st.scaler.skipped_steps++;
    } else {
      adamw_step(be, r.optimizer, st, res.lr, clip_factor(res.norm, r.optimizer.grad_clip));
      sync->gather_params();
    }
    res.comm_exposed_ms = sync->stats().exposed_ms;
    zero_grads(st.params);
    auto& mt = ops::MemoryTracker::instance();
    for (int a = 0; a < ops::kAccounts; ++a)
      measured_peak[a] = std::max(measured_peak[a], mt.peak(static_cast<ops::Account>(a)));
    st.step++;
    st.tokens += plan.tokens_per_step;
    st.loader = loader->state();
    auto t1 = Clock::now();
    res.opt_ms = ms_between(o0, t1);
    res.total_ms = ms_between(t0, t1);
    return res;
  }

  struct EvalResult {
    double loss = 0;
    double accuracy = -1;  // -1: no task accuracy for this data kind
    int64_t problems = 0;
  };

  EvalResult evaluate() {
    EvalResult er;
    LoaderConfig lc;
    lc.global_batch = plan.micro;
    lc.micro = plan.micro;
    lc.shuffle = false;
    lc.workers = 1;
    lc.prefetch = 2;
    DataLoader vl(val_src, lc, st.rng.data_seed);
    double sum = 0;
    int64_t count = 0;
    // The number of batches is fixed before the loop: every rank must run the same passes (a
    // stop request is acted on after evaluation).
    for (int64_t i = 0; i < r.train.eval_batches && (multi() || !stop_requested()); ++i) {
      Batch b = vl.next();
      auto ls = pipe->forward({b.tokens.data(), b.targets.data(), 0});
      sum += ls.sum;
      count += ls.count;
    }
    if (multi()) {  // the last stage's tensor- and data-parallel rank 0 holds the loss
      double v[2] = {0, 0};
      if (grid.last_stage() && grid.coords().tp == 0 && grid.coords().dp == 0) v[0] = sum, v[1] = static_cast<double>(count);
      grid.world().allreduce_sum(v, 2);
      sum = v[0];
      count = static_cast<int64_t>(v[1]);
    }
    er.loss = count ? sum / static_cast<double>(count) : 0.0;
    if (r.data.kind == "addition") {
      // Greedy completion, one forward pass through the pipeline per answer digit. The last
      // stage picks each row's most likely token (over tensor-parallel vocabulary shards: the
      // largest logit, the smallest id among equals, as one rank's argmax would) and sends the
      // choices back to every stage, which all append them to their copy of the prompts.
      auto problems = addition_eval_problems(r.data.digits, 256, seed());
      int64_t correct = 0;
      int64_t B = plan.micro, T = r.model.seq_len;
      const int tp_rank = grid.coords().tp;
      for (size_t start = 0; start < problems.size() && (multi() || !stop_requested()); start += static_cast<size_t>(B)) {
        size_t n = std::min(problems.size() - start, static_cast<size_t>(B));
        std::vector<int32_t> tokens(static_cast<size_t>(B * T), '\n');
        std::vector<std::vector<int32_t>> pred(n);
        size_t max_answer = 0;
        for (size_t i = 0; i < n; ++i) {
          const auto& pr = problems[start + i];
          std::copy(pr.prompt.begin(), pr.prompt.end(), tokens.begin() + static_cast<int64_t>(i) * T);
          max_answer = std::max(max_answer, pr.answer.size());
        }
        for (size_t j = 0; j < max_answer; ++j) {
          std::vector<float> best_val(n, -std::numeric_limits<float>::infinity());
          std::vector<int64_t> best_id(n, std::numeric_limits<int64_t>::max());
          if (const ops::Tensor* lt = pipe->forward_logits(tokens.data())) {  // the last stage
            const ops::Tensor& logits = *lt;
            const float* L = logits.data<float>();
            const int64_t V = logits.shape().back(), vstart = tp_rank * V;
            const int64_t real = std::clamp<int64_t>(r.model.vocab_size - vstart, 0, V);
            for (size_t i = 0; i < n; ++i) {
              int64_t pos = static_cast<int64_t>(problems[start + i].prompt.size() + j) - 1;
              if (j >= problems[start + i].answer.size() || pos + 1 >= T || real == 0) continue;
              const float* row = L + (static_cast<int64_t>(i) * T + pos) * V;
              int64_t k = std::max_element(row, row + real) - row;
              best_val[i] = row[k];
              best_id[i] = vstart + k;
            }
            if (plan.tp > 1) {
              std::vector<float> mx = best_val;
              grid.tp().allreduce_max(mx.data(), static_cast<int64_t>(n));
              for (size_t i = 0; i < n; ++i)
                if (best_val[i] != mx[i]) best_id[i] = std::numeric_limits<int64_t>::max();
              grid.tp().allreduce_min(best_id.data(), static_cast<int64_t>(n));
            }
          }
          if (plan.pp > 1) grid.pp().broadcast(best_id.data(), n * sizeof(int64_t), static_cast<int>(plan.pp) - 1);
          for (size_t i = 0; i < n; ++i) {
            const auto& pr = problems[start + i];
            int64_t pos = static_cast<int64_t>(pr.prompt.size() + j) - 1;
            if (j >= pr.answer.size() || pos + 1 >= T) continue;
            int32_t best = static_cast<int32_t>(best_id[i]);
            pred[i].push_back(best);
            tokens[static_cast<size_t>(static_cast<int64_t>(i) * T + pos + 1)] = best;
          }
        }
        for (size_t i = 0; i < n; ++i) correct += pred[i] == problems[start + i].answer;
      }
      er.problems = static_cast<int64_t>(problems.size());
      er.accuracy = static_cast<double>(correct) / static_cast<double>(problems.size());
    }
    return er;
  }

  void log_eval(const EvalResult& e) {
    if (!lead()) return;
    nlohmann::json j{{"eval", true}, {"step", st.step}, {"val_loss", e.loss}};
    if (e.accuracy >= 0) {
      j["accuracy"] = e.accuracy;
      log->info("eval step {} | val loss {:.4f} | addition exact-match {:.1f}% of {} held-out problems", st.step, e.loss,
                100 * e.accuracy, e.problems);
    } else {
      log->info("eval step {} | val loss {:.4f}", st.step, e.loss);
    }
    metrics << j.dump() << "\n";
    metrics.flush();
  }

  int run() {
    install_signal_handlers();
    open_inputs();
    run_dir = opts.run_dir.empty() ? default_run_dir(r) : opts.run_dir;
    if (r.train.threads > 0) ops::set_num_threads(static_cast<int>(r.train.threads));
    else if (!std::getenv("OMP_NUM_THREADS")) share_cores_between_local_ranks();
    build();
    setup_logging();
    maybe_resume();
    if (lead()) cleanup_stale(checkpoint_dir());
    write_run_files();
    // MFU is against the peak of all ranks together.
    if (r.hardware.peak_tflops > 0) {
      peak_flops = r.hardware.peak_tflops * 1e12 * grid.world_size();
    } else {
      double v = ops::measure_cpu_gemm_peak_flops();
      grid.world().allreduce_sum(&v, 1);
      peak_flops = v;
    }
    print_startup();
    if (resumed_from >= 0) log->info("resumed from step {} ({})", resumed_from, checkpoint_dir());

    const int64_t total = r.train.steps;
    double tok_per_step = static_cast<double>(plan.tokens_per_step);
    double sum_ms = 0;
    int64_t timed = 0;
    double window_ms = 0, window_data = 0;
    int64_t window = 0;
    EvalResult last_eval;
    auto run_t0 = Clock::now();
    double pending_ckpt_ms = 0;
    while (st.step < total) {
      if (stop_agreed()) return preempt();
      if (r.checkpoint.snapshot_every > 0 && st.step % r.checkpoint.snapshot_every == 0 &&
          (!snapshot.valid() || snapshot.step() != st.step))
        snapshot.take(st);
      StepResult s = train_step();
      if (rollback_needed(s)) continue;
      if (st.step > 1) { sum_ms += s.total_ms; timed++; }  // the first step warms caches
      window_ms += s.total_ms;
      window_data += s.data_ms;
      window++;
      double tps = tok_per_step / (s.total_ms / 1e3);
      double mfu = peak_flops > 0 ? plan.flops_per_token * tps / peak_flops : 0;
      size_t mem = ops::MemoryTracker::instance().peak_total();
      nlohmann::json j{{"step", st.step},          {"loss", s.loss},           {"lr", s.lr},
                       {"grad_norm", s.norm},      {"tokens", st.tokens},      {"tokens_per_s", tps},
                       {"mfu", mfu},               {"step_ms", s.total_ms},    {"data_ms", s.data_ms},
                       {"forward_ms", s.fwd_ms},   {"backward_ms", s.bwd_ms},  {"optimizer_ms", s.opt_ms},
                       {"comm_exposed_ms", s.comm_exposed_ms},     {"comm_hidden_ms", s.comm_hidden_ms},
                       {"pipeline_wait_ms", s.pipe_wait_ms},
                       {"peak_bytes", mem},        {"skipped", s.skipped}};
      pipe_wait_total += s.pipe_wait_ms;
      step_ms_total += s.total_ms;
      comm_hidden_total += s.comm_hidden_ms;
      comm_exposed_total += s.comm_exposed_ms;
      // A save's stall is reported in the next step's record: the step record is written first,
      // so a kill during the save never loses the history the checkpoint covers.
      j["checkpoint_ms"] = pending_ckpt_ms;
      pending_ckpt_ms = 0;
      if (lead()) {
        metrics << j.dump() << "\n";
        metrics.flush();  // one small write per step, so a killed run keeps its history
      }
      // Rank 0 decides (time-based cadences differ between ranks' clocks); everyone takes part.
      int64_t due = lead() && st.step < total && ckpt->due(st.step, ms_between(run_t0, Clock::now()) / 1e3);
      grid.world().allreduce_max(&due, 1);
      if (due) {
        save(false);
        pending_ckpt_ms = lead() ? ckpt->last_stall_seconds() * 1e3 : 0.0;
      }
      if (lead()) ckpt->poll();
      if (st.step % r.train.log_every == 0 || st.step == total || st.step == 1) {
        double avg = window_ms / window;
        double eta = (total - st.step) * (timed ? sum_ms / timed : avg) / 1e3;
        log->info("step {:>{}}/{} | loss {:.4f} | lr {:.2e} | norm {:.3f} | {:.0f} ms | {} tok/s | MFU {:.0f}% | data {:.1f} ms | mem {} | ETA {}",
                  st.step, std::to_string(total).size(), total, s.loss, s.lr, s.norm, avg,
                  human_count(tok_per_step / (avg / 1e3)), 100 * plan.flops_per_token * tok_per_step / (avg / 1e3) / std::max(1.0, peak_flops),
                  window_data / window, format_bytes(static_cast<double>(mem)), human_duration(eta));
        metrics.flush();
        window = 0;
        window_ms = window_data = 0;
      }
      if (s.skipped) log->warn("step {}: non-finite loss or gradient norm; update skipped", st.step);
      if (r.train.eval_every > 0 && st.step % r.train.eval_every == 0 && st.step != total) log_eval(evaluate());
    }
    save(true);
    if (stop_agreed()) return preempt();
    last_eval = evaluate();
    if (stop_agreed()) return preempt();
    log_eval(last_eval);
    double wall = ms_between(run_t0, Clock::now()) / 1e3;
    summarize(last_eval, timed ? sum_ms / timed : 0, wall);
    return 0;
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

  // A signal asked us to stop: checkpoint at this step boundary and exit with kExitPreempted.
  int preempt() {
    log->warn("signal {} received: writing a checkpoint at step {} and exiting (code {})", stop_signal(), st.step,
              kExitPreempted);
    save(true);
    if (lead()) metrics.flush();
    return kExitPreempted;
  }

  // A stop signal reaches the ranks at different moments: they agree at step boundaries.
  bool stop_agreed() {
    int64_t stop = stop_requested() ? 1 : 0;
    grid.world().allreduce_max(&stop, 1);
    return stop != 0;
  }

  // Collective over all ranks (a single rank writes its own state).
  void save(bool final) {
    if (!multi()) {
      ckpt->save(st, final);
      if (final) ckpt->wait();
      return;
    }
    if (!r.checkpoint.async || final) {  // each rank writes its slices into the one file (parallel HDF5)
      save_sharded(*ckpt, plan, grid, graph, st);
      return;
    }
    // Asynchronous: the logical state is assembled on rank 0, whose writer thread saves it
    // while training continues (collective MPI-IO cannot run behind the training thread's
    // own collectives).
    TrainState logical = gather_logical_state(plan, grid, graph, st);
    if (lead()) {
      ckpt->save(logical, final);
      if (final) ckpt->wait();
    }
    grid.world().barrier();  // a final checkpoint is published before any rank exits
  }

  // The in-memory tier: a non-finite loss, or a loss above spike_threshold x its running mean,
  // rolls back to the last snapshot and skips the offending batch, without touching disk.
  bool rollback_needed(const StepResult& s) {
    bool bad = !std::isfinite(s.loss) || !std::isfinite(s.norm);
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
    rollbacks++;
    nlohmann::json j{{"rollback", true}, {"step", offending + 1}, {"to_step", st.step}, {"loss", s.loss}};
    if (lead()) metrics << j.dump() << "\n";
    return true;
  }

  void summarize(const EvalResult& e, double avg_ms, double wall_s) {
    // Pipeline idle time per stage, measured (time blocked on neighbours) against the plan's bubble.
    std::vector<double> idle(static_cast<size_t>(plan.pp), 0.0);
    if (grid.coords().dp == 0 && grid.coords().tp == 0 && step_ms_total > 0)
      idle[static_cast<size_t>(grid.coords().pp)] = pipe_wait_total / step_ms_total;
    grid.world().allreduce_sum(idle.data(), static_cast<int64_t>(idle.size()));
    double hidden_frac = comm_hidden_total + comm_exposed_total > 0
                             ? comm_hidden_total / (comm_hidden_total + comm_exposed_total) : 0.0;
    if (!lead()) return;
    if (plan.pp > 1)
      for (int64_t sidx = 0; sidx < plan.pp; ++sidx)
        log->info("pipeline stage {}: idle {:.1f}% of the step (plan bubble {:.1f}%)", sidx, 100 * idle[static_cast<size_t>(sidx)],
                  100 * plan.bubble);
    if (plan.dp > 1)
      log->info("data-parallel gradients: {:.0f} ms communication hidden behind backward, {:.0f} ms exposed ({:.0f}% hidden)",
                comm_hidden_total, comm_exposed_total, 100 * hidden_frac);
    double tps = avg_ms > 0 ? plan.tokens_per_step / (avg_ms / 1e3) : 0;
    log->info("done: {} steps in {} | {} tok/s | MFU {:.0f}% | final val loss {:.4f}{}", st.step, human_duration(wall_s),
              human_count(tps), 100 * plan.flops_per_token * tps / std::max(1.0, peak_flops), e.loss,
              e.accuracy >= 0 ? fmt::format(" | accuracy {:.1f}%", 100 * e.accuracy) : "");
    // Ledger honesty: measured peak of each account against the plan's prediction.
    const StageLedger& L = plan.stages[static_cast<size_t>(grid.coords().pp)];
    std::pair<const char*, std::pair<double, ops::Account>> rows[] = {
        {"parameters", {L.parameters, ops::Account::Parameters}},
        {"gradients", {L.gradients, ops::Account::Gradients}},
        {"optimizer", {L.optimizer, ops::Account::Optimizer}},
        {"activations", {L.activations, ops::Account::Activations}},
        {"workspace", {L.workspace, ops::Account::Workspace}},
        {"communication", {L.communication, ops::Account::Communication}}};
    nlohmann::json ledger = nlohmann::json::object();
    log->info("memory ledger      predicted     measured");
    for (auto& [name, pa] : rows) {
      double measured = static_cast<double>(measured_peak[static_cast<int>(pa.second)]);
      log->info("  {:<14} {:>12} {:>12}", name, format_bytes(pa.first), format_bytes(measured));
      ledger[name] = {{"predicted", pa.first}, {"measured", measured}};
    }
    // Top operators by time.
    std::vector<ops::OpProfile> prof;
    for (auto& ex : execs)
      for (auto& p : ex->profile()) {
        auto it = std::find_if(prof.begin(), prof.end(), [&](const ops::OpProfile& q) { return q.name == p.name; });
        if (it == prof.end()) { prof.push_back(p); continue; }
        it->forward_ms += p.forward_ms;
        it->backward_ms += p.backward_ms;
        it->recompute_ms += p.recompute_ms;
        it->calls += p.calls;
      }
    std::sort(prof.begin(), prof.end(), [](const ops::OpProfile& a, const ops::OpProfile& b) {
      return a.forward_ms + a.backward_ms + a.recompute_ms > b.forward_ms + b.backward_ms + b.recompute_ms;
    });
    double total_op = 0;
    for (auto& p : prof) total_op += p.forward_ms + p.backward_ms + p.recompute_ms;
    nlohmann::json ops_json = nlohmann::json::array();
    log->info("top operators      forward   backward  recompute   share");
    for (auto& p : prof) {
      double t = p.forward_ms + p.backward_ms + p.recompute_ms;
      log->info("  {:<14} {:>8.0f}ms {:>8.0f}ms {:>8.0f}ms {:>6.1f}%", p.name, p.forward_ms, p.backward_ms,
                p.recompute_ms, 100 * t / std::max(1e-9, total_op));
      ops_json.push_back({{"op", p.name}, {"forward_ms", p.forward_ms}, {"backward_ms", p.backward_ms},
                          {"recompute_ms", p.recompute_ms}, {"calls", p.calls}});
    }
    nlohmann::json j{{"summary", true},  {"steps", st.step},          {"tokens", st.tokens},
                     {"tokens_per_s", tps}, {"wall_s", wall_s},       {"val_loss", e.loss},
                     {"ledger", ledger}, {"top_ops", ops_json},       {"peak_flops", peak_flops}};
    if (e.accuracy >= 0) j["accuracy"] = e.accuracy;
    j["layout"] = {{"world", grid.world_size()}, {"dp", plan.dp}, {"tp", plan.tp}, {"pp", plan.pp},
                   {"zero", r.parallel.zero}, {"schedule", r.parallel.schedule}};
    j["comm_hidden_ms"] = comm_hidden_total;
    j["comm_exposed_ms"] = comm_exposed_total;
    j["comm_hidden_fraction"] = hidden_frac;
    j["pipeline_idle_fraction"] = idle;
    j["plan_bubble"] = plan.bubble;
    metrics << j.dump() << "\n";
    metrics.flush();
  }
};

}  // namespace

std::string default_run_dir(const Recipe& r) {
  if (!r.train.run_dir.empty()) return r.train.run_dir;
  return (fs::path("runs") / r.name).string();
}

int run_training(const Plan& plan, const TrainOptions& opts, parallel::Grid& grid) {
  Trainer t(plan, opts, grid);
  return t.run();
}

int run_training(const Plan& plan, const TrainOptions& opts) {
  parallel::Grid grid(parallel::self_comm(), {1, 1, 1});
  return run_training(plan, opts, grid);
}

}  // namespace runner
