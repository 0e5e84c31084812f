// The single-rank training loop: data -> forward/backward over the micro-batches of a
// step -> clip -> AdamW -> log, evaluate, checkpoint. Everything a user can get wrong is
// checked before the run directory is touched (invariant 6).
#include "runner/train.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <cblas.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "ops/backend.h"
#include "ops/executor.h"
#include "ops/rng.h"
#include "runner/checkpoint.h"
#include "runner/data.h"
#include "runner/optimizer.h"
#include "runner/signals.h"
#include "runner/state.h"

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

// Measured fp32 GEMM peak of this CPU at the current thread count (FLOP/s), for MFU.
double measure_cpu_peak_flops() {
  const int n = 1024;
  std::vector<float> a(n * n, 0.5f), b(n * n, 0.25f), c(n * n);
  auto gemm = [&] {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  };
  gemm();  // warm up the thread pool and the caches
  double best = 0, spent = 0;
  for (int rep = 0; rep < 20 && (rep < 3 || spent < 0.25); ++rep) {
    auto t0 = Clock::now();
    gemm();
    double s = ms_between(t0, Clock::now()) / 1e3;
    spent += s;
    best = std::max(best, 2.0 * n * n * n / s);
  }
  return best;
}

// Options this trainer does not implement yet are refused, never ignored.
void check_supported(const Plan& p) {
  const Recipe& r = p.recipe;
  auto unsupported = [&](const std::string& path, const std::string& what, const std::string& fix) {
    throw UserError(r.loc(path), what + " is not supported by `runner train` yet", fix);
  };
  if (r.precision.compute != "fp32")
    unsupported("precision.compute", "precision.compute " + r.precision.compute,
                "train with precision.compute: fp32 (runner plan accepts it for sizing)");
  if (p.world > 1 || p.tp > 1 || p.pp > 1)
    unsupported("parallel", fmt::format("a {}-rank layout (dp {} x tp {} x pp {})", p.world, p.dp, p.tp, p.pp),
                "train on one rank (dp 1, tp 1, pp 1) for now");
}

struct Trainer {
  const Plan& plan;
  const Recipe& r;
  TrainOptions opts;
  ops::Backend& be = ops::cpu_backend();
  std::shared_ptr<const DataSource> train_src, val_src;
  std::unique_ptr<DataLoader> loader;
  ops::Graph graph;
  std::unique_ptr<ops::Executor> exec;
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

  Trainer(const Plan& p, TrainOptions o) : plan(p), r(p.recipe), opts(std::move(o)) {}

  uint64_t seed() const { return static_cast<uint64_t>(r.train.seed); }

  // Everything that can fail on user input happens here, before any file is written.
  void open_inputs() {
    check_supported(plan);
    train_src = open_source(r.data, Split::Train, r.model.seq_len, r.model.vocab_size, seed());
    val_src = open_source(r.data, Split::Val, r.model.seq_len, r.model.vocab_size, seed());
  }

  std::string checkpoint_dir() const {
    return r.checkpoint.dir.empty() ? (fs::path(run_dir) / "checkpoints").string() : r.checkpoint.dir;
  }

  // Resumes from the run directory's checkpoints when there are any (a requeued job runs the
  // same command line). Loading writes nothing; a corrupt checkpoint falls back unless strict.
  void maybe_resume() {
    ckpt = std::make_unique<CheckpointManager>(checkpoint_dir(), r.checkpoint);
    if (!ckpt->has_checkpoints()) {
      if (opts.resume) throw UserError({checkpoint_dir(), 0, 0}, "no checkpoint to resume from", "start the run with `runner train RECIPE`");
      return;
    }
    std::optional<int64_t> step;
    if (opts.resume_step >= 0) step = ckpt->load_step(opts.resume_step, st, opts.strict);
    else step = ckpt->load_latest(st, opts.strict);
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
    auto file_sink = std::make_shared<spdlog::sinks::basic_file_sink_mt>((fs::path(run_dir) / "log.rank0.txt").string());
    std::vector<spdlog::sink_ptr> sinks{file_sink};
    if (!opts.quiet) sinks.push_back(std::make_shared<spdlog::sinks::stdout_color_sink_mt>());
    log = std::make_shared<spdlog::logger>("runner", sinks.begin(), sinks.end());
    log->set_pattern("%H:%M:%S %v");
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
    graph = build_gpt_graph(plan.stage_spec(0));
    st.rng.init_seed = seed();
    st.rng.dropout_seed = ops::rng_key(seed(), 1);
    st.rng.data_seed = ops::rng_key(seed(), 2);
    st.rng.sample_seed = ops::rng_key(seed(), 3);
    st.params = init_params(graph, r.model, st.rng.init_seed);
    exec = std::make_unique<ops::Executor>(graph, be);
    bind_params(*exec, graph, st.params);
    LoaderConfig lc;
    lc.global_batch = plan.global;
    lc.micro = plan.micro;
    lc.dp_rank = 0;
    lc.dp_size = static_cast<int>(plan.dp);
    lc.workers = r.data.workers;
    lc.prefetch = r.data.prefetch;
    loader = std::make_unique<DataLoader>(train_src, lc, st.rng.data_seed);
    st.loader = loader->state();
    st.recipe_yaml = resolved_recipe_yaml();
  }

  void print_startup() {
    log->info("runner {} | run dir {}", RUNNER_VERSION, run_dir);
    for (std::string line; const auto& chunk : {plan.table()}) {
      std::istringstream in(chunk);
      while (std::getline(in, line)) log->info("{}", line);
    }
    log->info("  data       {}", train_src->describe());
    log->info("  threads    {} (OpenMP; OpenBLAS shares the pool) | fp32 GEMM peak {:.1f} GFLOP/s (measured)",
              ops::num_threads(), peak_flops / 1e9);
    log->info("  optimizer  adamw lr {:g} betas ({:g}, {:g}) wd {:g} clip {:g} | schedule {} warmup {}", r.optimizer.lr,
              r.optimizer.beta1, r.optimizer.beta2, r.optimizer.weight_decay, r.optimizer.grad_clip,
              r.optimizer.schedule.kind, r.optimizer.schedule.warmup_steps);
  }

  struct StepResult {
    double loss = 0, norm = 0, lr = 0;
    double data_ms = 0, fwd_ms = 0, bwd_ms = 0, opt_ms = 0, total_ms = 0;
    bool skipped = false;
  };

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
    int64_t count = 0;
    for (auto& b : mbs)
      for (int32_t t : b.targets) count += t >= 0;
    float dloss = count > 0 ? 1.0f / static_cast<float>(count) : 0.0f;
    uint64_t key = ops::rng_key(st.rng.dropout_seed, static_cast<uint64_t>(st.step));
    double loss_sum = 0;
    ops::MemoryTracker::instance().reset_peaks();
    for (int64_t k = 0; k < plan.accum; ++k) {
      auto a = Clock::now();
      auto ls = exec->forward(mbs[k].tokens.data(), mbs[k].targets.data(), true, key, k * plan.micro);
      auto b = Clock::now();
      exec->backward(dloss);
      auto c = Clock::now();
      loss_sum += ls.sum;
      res.fwd_ms += ms_between(a, b);
      res.bwd_ms += ms_between(b, c);
    }
    auto o0 = Clock::now();
    res.loss = count > 0 ? loss_sum / static_cast<double>(count) : 0.0;
    // Fault injection for tests (RUNNER_FAULT_NAN_STEP=N): the first time step N runs, its loss
    // and gradients become NaN, as a numerical blow-up would make them.
    static int64_t nan_step = std::getenv("RUNNER_FAULT_NAN_STEP") ? std::atoll(std::getenv("RUNNER_FAULT_NAN_STEP")) : -1;
    if (st.step + 1 == nan_step) {
      nan_step = -1;
      res.loss = std::nan("");
      st.params.grads[0].data<float>()[0] = std::nanf("");
    }
    res.norm = grad_norm(be, st.params);
    res.lr = lr_at(r.optimizer, st.step, r.train.steps);
    if (!std::isfinite(res.loss) || !std::isfinite(res.norm)) {
      res.skipped = true;
      st.scaler.skipped_steps++;
    } else {
      adamw_step(be, r.optimizer, st, res.lr, clip_factor(res.norm, r.optimizer.grad_clip));
    }
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
    for (int64_t i = 0; i < r.train.eval_batches && !stop_requested(); ++i) {
      Batch b = vl.next();
      auto ls = exec->forward(b.tokens.data(), b.targets.data(), false);
      sum += ls.sum;
      count += ls.count;
    }
    er.loss = count ? sum / static_cast<double>(count) : 0.0;
    if (r.data.kind == "addition") {
      auto problems = addition_eval_problems(r.data.digits, 256, seed());
      int64_t correct = 0;
      int64_t B = plan.micro, T = r.model.seq_len;
      int64_t V = graph.tensors[graph.logits].shape.back();
      for (size_t start = 0; start < problems.size() && !stop_requested(); start += static_cast<size_t>(B)) {
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
          const ops::Tensor& logits = exec->forward_logits(tokens.data());
          const float* L = logits.data<float>();
          for (size_t i = 0; i < n; ++i) {
            const auto& pr = problems[start + i];
            int64_t pos = static_cast<int64_t>(pr.prompt.size() + j) - 1;
            if (j >= pr.answer.size() || pos + 1 >= T) continue;
            const float* row = L + (static_cast<int64_t>(i) * T + pos) * V;
            int32_t best = static_cast<int32_t>(std::max_element(row, row + r.model.vocab_size) - row);
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
    build();
    maybe_resume();
    setup_logging();
    ckpt->set_logger(log);
    cleanup_stale(checkpoint_dir());
    write_run_files();
    peak_flops = r.hardware.peak_tflops > 0 ? r.hardware.peak_tflops * 1e12 : measure_cpu_peak_flops();
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
      if (stop_requested()) return preempt();
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
                       {"comm_exposed_ms", 0.0},   {"comm_hidden_ms", 0.0},
                       {"peak_bytes", mem},        {"skipped", s.skipped}};
      // A save's stall is reported in the next step's record: the step record is written first,
      // so a kill during the save never loses the history the checkpoint covers.
      j["checkpoint_ms"] = pending_ckpt_ms;
      pending_ckpt_ms = 0;
      metrics << j.dump() << "\n";
      metrics.flush();  // one small write per step, so a killed run keeps its history
      if (st.step < total && ckpt->due(st.step, ms_between(run_t0, Clock::now()) / 1e3)) {
        ckpt->save(st);
        pending_ckpt_ms = ckpt->last_stall_seconds() * 1e3;
      }
      ckpt->poll();
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
    ckpt->save(st, true);
    ckpt->wait();
    if (stop_requested()) return preempt();
    last_eval = evaluate();
    if (stop_requested()) return preempt();
    log_eval(last_eval);
    double wall = ms_between(run_t0, Clock::now()) / 1e3;
    summarize(last_eval, timed ? sum_ms / timed : 0, wall);
    return 0;
  }

  // A signal asked us to stop: checkpoint at this step boundary and exit with kExitPreempted.
  int preempt() {
    log->warn("signal {} received: writing a checkpoint at step {} and exiting (code {})", stop_signal(), st.step,
              kExitPreempted);
    ckpt->save(st, true);
    ckpt->wait();
    metrics.flush();
    return kExitPreempted;
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
    metrics << j.dump() << "\n";
    return true;
  }

  void summarize(const EvalResult& e, double avg_ms, double wall_s) {
    double tps = avg_ms > 0 ? plan.tokens_per_step / (avg_ms / 1e3) : 0;
    log->info("done: {} steps in {} | {} tok/s | MFU {:.0f}% | final val loss {:.4f}{}", st.step, human_duration(wall_s),
              human_count(tps), 100 * plan.flops_per_token * tps / std::max(1.0, peak_flops), e.loss,
              e.accuracy >= 0 ? fmt::format(" | accuracy {:.1f}%", 100 * e.accuracy) : "");
    // Ledger honesty: measured peak of each account against the plan's prediction.
    const StageLedger& L = plan.stages[0];
    std::pair<const char*, std::pair<double, ops::Account>> rows[] = {
        {"parameters", {L.parameters, ops::Account::Parameters}},
        {"gradients", {L.gradients, ops::Account::Gradients}},
        {"optimizer", {L.optimizer, ops::Account::Optimizer}},
        {"activations", {L.activations, ops::Account::Activations}},
        {"workspace", {L.workspace, ops::Account::Workspace}}};
    nlohmann::json ledger = nlohmann::json::object();
    log->info("memory ledger      predicted     measured");
    for (auto& [name, pa] : rows) {
      double measured = static_cast<double>(measured_peak[static_cast<int>(pa.second)]);
      log->info("  {:<14} {:>12} {:>12}", name, format_bytes(pa.first), format_bytes(measured));
      ledger[name] = {{"predicted", pa.first}, {"measured", measured}};
    }
    // Top operators by time.
    auto prof = exec->profile();
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
    metrics << j.dump() << "\n";
    metrics.flush();
  }
};

}  // namespace

std::string default_run_dir(const Recipe& r) {
  if (!r.train.run_dir.empty()) return r.train.run_dir;
  return (fs::path("runs") / r.name).string();
}

int run_training(const Plan& plan, const TrainOptions& opts) {
  Trainer t(plan, opts);
  return t.run();
}

}  // namespace runner
