// The layout search (search.h): enumerate the layouts the recipe leaves open, plan every one
// with the exact ledger (make_plan), rank those that fit by the cost model (predict_step).
//
// Design: a "chain" is one choice of everything but the micro-batch (grid, schedule, ZeRO,
// sequence parallelism, recompute); its micro-batches are planned in ascending order. Memory
// never shrinks as the micro-batch grows under 1F1B and interleaved 1F1B (the micro-batches in
// flight are capped by the stage count, each holds more), so the first that does not fit ends
// the chain and the larger ones are counted as memory rejections without planning them
// (GPipe holds every micro-batch, so its chains are planned whole). test_search checks the
// pruned search against the exhaustive one. On a GPU a candidate whose lower bound on its
// step (Bound, below) is above the K-th best step found so far is skipped without planning,
// and the chains run lowest bound first. Chains are independent and run on every core;
// the merge and the ranking are in a fixed order, so every rank of a job gets the same answer.
#include "runner/perf/search.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <cstdlib>
#include <numeric>
#include <set>
#include <thread>
#include <tuple>

#include <fmt/format.h>

#include "runner/device/devices.h"
#include "runner/recipe/paths.h"

namespace runner {

namespace {

// The fields a recipe can fix; everything else of the layout is searched.
constexpr const char* kConstraintKeys[] = {
    "parallel.dp",    "parallel.tp",       "parallel.pp",       "parallel.schedule", "parallel.virtual_stages",
    "parallel.zero",  "parallel.sequence_parallel", "parallel.stage_layers", "batch.global", "batch.micro",
    "batch.accum",    "recompute.mode",    "recompute.modules", "recompute.layers"};

using Fixed = std::set<std::string>;

struct RecomputeOption {
  RecomputeMode mode = RecomputeMode::none;
  std::vector<RecomputeModule> modules;
  std::string name;  // SearchCandidate::recompute
};

// One layout, before it is planned.
struct Knobs {
  int64_t dp = 1, tp = 1, pp = 1, v = 1, micro = 1, accum = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int zero = 0;
  bool sp = false;
  int recompute = 0;  // index into Space::recompute
  auto key() const { return std::tie(dp, tp, pp, v, micro, accum, schedule, zero, sp, recompute); }
};

struct Space {
  const Recipe* r = nullptr;
  int64_t world = 1, global = 0;
  Fixed fixed;
  std::vector<RecomputeOption> recompute;
  int none = -1, automatic = -1;  // their indices in `recompute`, -1 when not searched
  int max_zero = 3;               // SearchOptions::max_zero
  bool has(const char* key) const { return fixed.count(key) > 0; }
  // recompute auto rides on none's chain (run_chain): where none fits, auto recomputes nothing.
  bool paired(const Knobs& k) const { return none >= 0 && automatic >= 0 && k.recompute == automatic; }
};

struct Scored {
  Knobs k;
  double memory = 0;
  StepCost cost;
};

// What one chain (or the whole search) found.
struct Tally {
  std::vector<Scored> feasible;
  std::map<std::string, int64_t> rejected;
  int64_t searched = 0;
  int64_t bounded = 0;  // skipped unplanned: their lower bound is above the top-K's K-th step
  void add(Tally&& t) {
    for (Scored& s : t.feasible) feasible.push_back(std::move(s));
    for (const auto& [why, n] : t.rejected) rejected[why] += n;
    searched += t.searched;
    bounded += t.bounded;
  }
};

int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  return v ? std::atoll(v) : 0;  // "8(x2)" (SLURM_NTASKS_PER_NODE) reads as 8
}

// The world: --world, the recipe's hardware, the Slurm allocation, else one device.
int64_t world_of(const Recipe& r, const SearchOptions& opt, std::string& source) {
  const int64_t devices = r.hardware.nodes * r.hardware.devices_per_node;
  if (opt.world > 0) {
    source = "--world";
    return opt.world;
  }
  if (devices > 1 || r.locs.count("hardware.nodes") || r.locs.count("hardware.devices_per_node")) {
    source = fmt::format("hardware: {} node{} x {} device{}", r.hardware.nodes, r.hardware.nodes == 1 ? "" : "s",
                         r.hardware.devices_per_node, r.hardware.devices_per_node == 1 ? "" : "s");
    return devices;
  }
  if (int64_t n = env_int("SLURM_NTASKS"); n > 0) {
    source = fmt::format("Slurm allocation: SLURM_NTASKS={}", n);
    return n;
  }
  if (int64_t nodes = env_int("SLURM_JOB_NUM_NODES"), per = env_int("SLURM_NTASKS_PER_NODE"); nodes > 0 && per > 0) {
    source = fmt::format("Slurm allocation: {} nodes x {} tasks", nodes, per);
    return nodes * per;
  }
  source = "one device (no --world, hardware or Slurm allocation)";
  return 1;
}

Fixed fixed_keys(const Recipe& r) {
  Fixed f;
  for (const char* k : kConstraintKeys)
    if (r.locs.count(k)) f.insert(k);
  return f;
}

std::string field_value(const Recipe& r, const std::string& key) {
  const ParallelConfig& p = r.parallel;
  if (key == "parallel.dp") return std::to_string(p.dp);
  if (key == "parallel.tp") return std::to_string(p.tp);
  if (key == "parallel.pp") return std::to_string(p.pp);
  if (key == "parallel.schedule") return to_string(p.schedule);
  if (key == "parallel.virtual_stages") return std::to_string(p.virtual_stages);
  if (key == "parallel.zero") return std::to_string(p.zero);
  if (key == "parallel.sequence_parallel") return p.sequence_parallel ? "true" : "false";
  if (key == "parallel.stage_layers") return "[" + plan_detail::join(p.stage_layers) + "]";
  if (key == "batch.global") return std::to_string(r.batch.global);
  if (key == "batch.micro") return std::to_string(r.batch.micro);
  if (key == "batch.accum") return std::to_string(r.batch.accum);
  if (key == "recompute.mode") return to_string(r.recompute.mode);
  if (key == "recompute.layers") return "[" + plan_detail::join(r.recompute.layers) + "]";
  std::string s;
  for (RecomputeModule m : r.recompute.modules) s += (s.empty() ? "" : ", ") + to_string(m);
  return "[" + s + "]";
}

std::string constraint_line(const Recipe& r, const std::string& key) {
  return fmt::format("{} = {} ({})", key, field_value(r, key), r.loc(key).str());
}

// The recompute choices: none, a few selective sets, auto, full (or what the recipe fixes).
std::vector<RecomputeOption> recompute_options(const Recipe& r, const Fixed& fixed) {
  using M = RecomputeModule;
  const std::vector<std::vector<M>> sets = {{M::attention_core}, {M::attention}, {M::mlp}, {M::attention, M::mlp}};
  std::vector<RecomputeOption> out;
  const auto selective = [&](const std::vector<M>& mods) {
    RecomputeOption o{RecomputeMode::selective, mods, "selective:"};
    for (size_t i = 0; i < mods.size(); ++i) o.name += (i ? "," : "") + to_string(mods[i]);
    out.push_back(o);
  };
  const bool layers = fixed.count("recompute.layers") > 0;  // a layer list needs a mode that recomputes
  for (RecomputeMode m : {RecomputeMode::none, RecomputeMode::selective, RecomputeMode::automatic, RecomputeMode::full}) {
    if (fixed.count("recompute.mode") && m != r.recompute.mode) continue;
    if (!fixed.count("recompute.mode") && layers && (m == RecomputeMode::none || m == RecomputeMode::automatic)) continue;
    if (m != RecomputeMode::selective) out.push_back({m, {}, to_string(m)});
    else if (fixed.count("recompute.modules")) selective(r.recompute.modules);
    else for (const auto& s : sets) selective(s);
  }
  return out;
}

// The global batch the search keeps: the recipe's, written or derived at its own layout.
int64_t kept_global(const Recipe& r, int64_t world) {
  if (r.batch.global > 0) return r.batch.global;
  int64_t g = 0;
  try {
    g = plan_detail::make_plan(r, world, false).global;
  } catch (const UserError&) {
    g = r.batch.micro * std::max<int64_t>(r.batch.accum, 1) * world;
  }
  if (g <= 0)
    throw UserError(r.loc("batch"), "the search keeps the recipe's global batch, but the recipe gives no batch size "
                                    "(neither batch.global nor batch.micro)",
                    fmt::format("set batch.global (sequences per optimizer step, e.g. global: {}); micro and accum are "
                                "then searched", 8 * world));
  return g;
}

Space make_space(const Recipe& r, int64_t world, const Fixed& fixed) {
  Space s;
  s.r = &r;
  s.world = world;
  s.fixed = fixed;
  s.global = kept_global(r, world);
  s.recompute = recompute_options(r, fixed);
  for (size_t i = 0; i < s.recompute.size(); ++i) {
    if (s.recompute[i].mode == RecomputeMode::none) s.none = static_cast<int>(i);
    if (s.recompute[i].mode == RecomputeMode::automatic) s.automatic = static_cast<int>(i);
  }
  return s;
}

// (tp, pp, dp): tp a power of two within a node (any on the host: its ranks share one
// machine) dividing the heads and the MLP width; pp dividing the layers; dp the rest.
std::vector<Knobs> grids(const Space& s) {
  const Recipe& r = *s.r;
  const ModelConfig& m = r.model;
  const int64_t tp_cap = device_kind(r.hardware).host ? s.world : r.hardware.devices_per_node;
  std::vector<int64_t> tps, pps;
  if (s.has("parallel.tp")) tps = {r.parallel.tp};
  else
    for (int64_t tp = 1; tp <= tp_cap; tp *= 2)
      if (m.n_heads % tp == 0 && m.mlp_hidden() % tp == 0) tps.push_back(tp);
  if (s.has("parallel.stage_layers")) pps = {static_cast<int64_t>(r.parallel.stage_layers.size())};
  else if (s.has("parallel.pp")) pps = {r.parallel.pp};
  else
    for (int64_t pp = 1; pp <= m.n_layers; ++pp)
      if (m.n_layers % pp == 0) pps.push_back(pp);
  std::vector<Knobs> out;
  for (int64_t tp : tps)
    for (int64_t pp : pps) {
      if (s.world % (tp * pp) != 0) continue;
      Knobs k;
      k.tp = tp, k.pp = pp, k.dp = s.world / (tp * pp);
      if (s.has("parallel.dp") && k.dp != r.parallel.dp) continue;
      if (s.global % k.dp != 0) continue;  // the batch equation has no micro x accum for this dp
      out.push_back(k);
    }
  return out;
}

// (schedule, virtual stages) for a pp: one pass without a pipeline; 1F1B, GPipe and
// interleaved with 2..8 chunks dividing every stage's layers.
std::vector<std::pair<PipelineSchedule, int64_t>> schedules(const Space& s, int64_t pp) {
  const Recipe& r = *s.r;
  const bool fixed_sched = s.has("parallel.schedule");
  if (pp == 1) return {{fixed_sched ? r.parallel.schedule : PipelineSchedule::one_f_one_b,
                        s.has("parallel.virtual_stages") ? r.parallel.virtual_stages : 1}};
  int64_t per_stage = r.model.n_layers / pp;
  if (s.has("parallel.stage_layers"))
    per_stage = std::accumulate(r.parallel.stage_layers.begin(), r.parallel.stage_layers.end(), int64_t{0},
                                [](int64_t g, int64_t x) { return std::gcd(g, x); });
  std::vector<std::pair<PipelineSchedule, int64_t>> out;
  for (PipelineSchedule sc : {PipelineSchedule::one_f_one_b, PipelineSchedule::gpipe, PipelineSchedule::interleaved}) {
    if (fixed_sched && sc != r.parallel.schedule) continue;
    if (sc != PipelineSchedule::interleaved) {
      out.push_back({sc, 1});
      continue;
    }
    if (s.has("parallel.virtual_stages")) out.push_back({sc, r.parallel.virtual_stages});
    else
      for (int64_t v = 2; v <= std::min<int64_t>(8, per_stage); ++v)
        if (per_stage % v == 0) out.push_back({sc, v});
  }
  return out;
}

// The micro-batches of a dp, ascending: dividing global / dp (or what the recipe fixes).
std::vector<int64_t> micros(const Space& s, int64_t dp) {
  const Recipe& r = *s.r;
  const int64_t local = s.global / dp;
  std::vector<int64_t> out;
  for (int64_t m = 1; m <= local; ++m) {
    if (local % m != 0) continue;
    if (s.has("batch.micro") && m != r.batch.micro) continue;
    if (s.has("batch.accum") && local / m != r.batch.accum) continue;
    out.push_back(m);
  }
  return out;
}

// Every chain (all but the micro-batch), in a fixed order.
std::vector<Knobs> chains(const Space& s) {
  const Recipe& r = *s.r;
  std::vector<Knobs> out;
  for (const Knobs& g : grids(s))
    for (const auto& [sched, v] : schedules(s, g.pp))
      for (int zero : {0, 1, 2, 3}) {
        if (s.has("parallel.zero") ? zero != r.parallel.zero : (zero >= 1 && g.dp == 1) || zero > s.max_zero) continue;
        for (bool sp : {false, true}) {
          if (s.has("parallel.sequence_parallel") ? sp != r.parallel.sequence_parallel : (sp && g.tp == 1)) continue;
          for (size_t rc = 0; rc < s.recompute.size(); ++rc) {
            Knobs k = g;
            k.schedule = sched, k.v = v, k.zero = zero, k.sp = sp, k.recompute = static_cast<int>(rc);
            if (!s.paired(k)) out.push_back(k);
          }
        }
      }
  return out;
}

Recipe candidate_recipe(const Space& s, const Knobs& k) {
  Recipe c = *s.r;
  ParallelConfig& p = c.parallel;
  p.search = false;
  p.dp = k.dp, p.tp = k.tp, p.pp = k.pp, p.schedule = k.schedule, p.virtual_stages = k.v;
  p.zero = k.zero, p.sequence_parallel = k.sp;
  if (!s.has("parallel.stage_layers")) p.stage_layers.clear();
  c.batch = {s.global, k.micro, k.accum};
  const RecomputeOption& rc = s.recompute[static_cast<size_t>(k.recompute)];
  c.recompute.mode = rc.mode;
  c.recompute.modules = rc.modules;
  return c;
}

// A make_plan refusal shortened to its rule: the first problem, numbers as N.
std::string rule_of(const UserError& e) {
  std::string what = e.all().front().what;
  what = what.substr(0, what.find(" ("));
  std::string out;
  for (size_t i = 0; i < what.size(); ++i) {
    if (!std::isdigit(static_cast<unsigned char>(what[i]))) out += what[i];
    else if (i == 0 || !std::isdigit(static_cast<unsigned char>(what[i - 1]))) out += 'N';
  }
  return "divisibility: " + out;
}

// ---- The bound: a lower bound on predict_step's step_s from the knobs alone, no plan.
//
// predict_step's step_s is compute + recompute + bubble + optimizer + data + exposed
// communication, every term >= 0, and compute + recompute + the exposed tp and pp terms are at
// least m (accum) times the critical stage's per-micro-batch f + b; the bubble is (all stages'
// f + b - the critical stage's) / v. So step_s >= (m - 1/v) crit + all / v for any crit at most
// the critical stage's f + b and all at most the sum over stages (m >= 1 >= 1/v: increasing in
// crit). Each transformer layer's f + b is at least its four GEMMs forward and backward and its
// attention core, priced by the same profile calls at the same shapes as the cost model prices
// the graph's nodes (a GEMM whose shape is not known here is left out: 0 keeps it a bound);
// every other node, collective and term adds >= 0. A stage holds at least its layers, the
// critical one at least the largest stage's. Under recompute full each layer's nodes run their
// forward again. A host device's profile is per thread count and oversubscription: no bound.
struct LayerTimes {
  double fwd = 0, bwd = 0;
};

LayerTimes layer_times(const Space& s, const HardwareProfile& hw, int64_t tp, int64_t micro) {
  const ModelConfig& m = s.r->model;
  const std::string dt = to_string(s.r->precision.compute);
  const int64_t N = micro * m.seq_len, C = m.d_model, H = m.mlp_hidden(), NH = m.n_heads, NKV = m.kv_heads();
  const int64_t fc = activation_facts(m.activation).gated ? 2 * H : H;
  LayerTimes t;
  const auto linear = [&](int64_t oc, int64_t ic) {  // ops/op_linear.cpp: gemms
    t.fwd += hw.gemm_seconds(dt, N, oc, ic, 0);
    t.bwd += hw.gemm_seconds(dt, N, ic, oc, 0) + hw.gemm_seconds(dt, oc, ic, N, 0);
  };
  if (C % NH == 0 && NKV % tp == 0) linear((NH + 2 * NKV) * (C / NH) / tp, C);
  linear(C, C / tp);
  linear(fc / tp, C);
  linear(C, H / tp);
  if (C % NH == 0) {
    t.fwd += hw.attention_seconds(dt, micro * (NH / tp), m.seq_len, C / NH, false, 0);
    t.bwd += hw.attention_seconds(dt, micro * (NH / tp), m.seq_len, C / NH, true, 0);
  }
  return t;
}

// A layer's f + b depends on the knobs that shape its graph, (tp, sequence parallelism,
// micro-batch), and with recompute on the recompute option: the first plan of each key tells it
// exactly (layer_seconds, the least over its layers) for every later candidate of that key.
// Recompute auto chooses per plan, so its key holds no recompute (none is the least).
struct Bound {
  using Key = std::tuple<int64_t, bool, int64_t, int>;  // tp, sp, micro, recompute (-1: without)
  const Space& s;
  const HardwareProfile& hw;
  bool on = false;
  std::mutex m;
  std::map<std::pair<int64_t, int64_t>, LayerTimes> layers;  // (tp, micro): GEMMs and attention
  std::map<Key, double> planned;                              // a layer's f + b from a plan

  int rc_key(const Knobs& k) const {
    const bool fixed = k.recompute != s.automatic && !s.has("recompute.layers");
    return fixed ? k.recompute : -1;
  }
  void learn(const Knobs& k, const Plan& p) {
    if (!on || !p.layout) return;
    const Key with{k.tp, k.sp, k.micro, rc_key(k)}, without{k.tp, k.sp, k.micro, -1};
    {
      std::lock_guard<std::mutex> lock(m);
      if (planned.count(with) && planned.count(without)) return;
    }
    double pass = std::numeric_limits<double>::infinity(), all = pass;
    for (const LayerSeconds& l : layer_seconds(p, hw)) pass = std::min(pass, l.pass), all = std::min(all, l.pass + l.recompute);
    std::lock_guard<std::mutex> lock(m);
    planned.try_emplace(without, pass);
    planned.try_emplace(with, all);  // no-op where with is without: the pass alone
  }
  // A layer's least f + b: planned, else its GEMMs and attention (and their forward again under full).
  double per_layer(const Knobs& k) {
    std::lock_guard<std::mutex> lock(m);
    if (const auto it = planned.find({k.tp, k.sp, k.micro, rc_key(k)}); it != planned.end()) return it->second;
    if (const auto it = planned.find({k.tp, k.sp, k.micro, -1}); it != planned.end()) return it->second;
    const auto key = std::make_pair(k.tp, k.micro);
    auto it = layers.find(key);
    if (it == layers.end()) it = layers.emplace(key, layer_times(s, hw, k.tp, k.micro)).first;
    const bool full = s.recompute[static_cast<size_t>(k.recompute)].mode == RecomputeMode::full &&
                      !s.has("recompute.layers");
    return it->second.fwd + it->second.bwd + (full ? it->second.fwd : 0.0);
  }

  Bound(const Space& sp, const HardwareProfile& h, bool exhaustive)
      : s(sp), hw(h), on(!exhaustive && !device_kind(sp.r->hardware).host) {}
  double lower(const Knobs& k) {
    if (!on) return 0;
    const Recipe& r = *s.r;
    const double per = per_layer(k);
    int64_t most = r.model.n_layers / k.pp;
    if (s.has("parallel.stage_layers"))
      most = *std::max_element(r.parallel.stage_layers.begin(), r.parallel.stage_layers.end());
    const double v = static_cast<double>(k.v), crit = static_cast<double>(most) * per;
    const double all = static_cast<double>(r.model.n_layers) * per;
    return (static_cast<double>(k.accum) - 1.0 / v) * crit + all / v;
  }
  // The lowest bound over a chain's micro-batches: the chains are run lowest first.
  double chain_lower(Knobs k, const std::vector<int64_t>& ms) {
    double lo = std::numeric_limits<double>::infinity();
    for (int64_t mb : ms) {
      k.micro = mb, k.accum = s.global / (k.dp * mb);
      lo = std::min(lo, lower(k));
    }
    return lo;
  }
};

// A candidate known not to fit in memory, unplanned: "memory", unless a layout rule refuses it
// first (as make_plan would: the rules are checked before the ledger is built).
std::string layout_rule(const Space& s, const Knobs& k) {
  const Recipe c = candidate_recipe(s, k);
  Plan p;
  try {
    plan_detail::resolve_grid(c, s.world, p);
    plan_detail::resolve_and_check(c, p);
  } catch (const UserError& e) {
    return rule_of(e);
  }
  return "memory";
}

// The state every chain shares: the weights, gradients and optimizer state of the worst stage
// per (tp, pp, dp, ZeRO), which no other knob changes (the micro-batch, the schedule, sequence
// parallelism and recompute move only activations and buffers). Once they alone exceed the
// device, every chain of that grid fails memory and is counted without planning.
struct Shared {
  const Space& s;
  const HardwareProfile& hw;
  bool exhaustive = false;
  Bound& bound;
  size_t top = 1;
  std::mutex m;
  std::map<std::tuple<int64_t, int64_t, int64_t, int>, bool> state_too_big;
  std::vector<double> best;  // the `top` lowest step times found so far, a max-heap

  // A candidate whose bound is above the K-th best step found cannot enter the top K (ties:
  // strictly above, so an equal step still gets planned and ranked by better()).
  bool beaten(const Knobs& k) {
    if (!bound.on) return false;
    const double lo = bound.lower(k);
    std::lock_guard<std::mutex> lock(m);
    return best.size() >= top && lo * (1 - 1e-9) > best.front();  // a margin for the sums' rounding
  }
  void found(double step_s) {
    std::lock_guard<std::mutex> lock(m);
    if (best.size() < top) {
      best.push_back(step_s);
      std::push_heap(best.begin(), best.end());
    } else if (step_s < best.front()) {
      std::pop_heap(best.begin(), best.end());
      best.back() = step_s;
      std::push_heap(best.begin(), best.end());
    }
  }

  static auto key(const Knobs& k) { return std::make_tuple(k.tp, k.pp, k.dp, k.zero); }
  bool too_big(const Knobs& k) {
    std::lock_guard<std::mutex> lock(m);
    const auto it = state_too_big.find(key(k));
    return !exhaustive && it != state_too_big.end() && it->second;
  }
  void record(const Knobs& k, const Plan& p) {
    double state = 0;
    for (const StageLedger& st : p.stages) state = std::max(state, st.parameters + st.gradients + st.optimizer);
    std::lock_guard<std::mutex> lock(m);
    state_too_big[key(k)] = state > p.device_memory;
  }
};

// Candidates known not to fit, each counted by the rule make_plan would refuse it by first.
void count_unplanned(const Space& s, Knobs k, const std::vector<int64_t>& ms, size_t from, Tally& t) {
  for (size_t j = from; j < ms.size(); ++j) {
    k.micro = ms[j], k.accum = s.global / (k.dp * ms[j]);
    ++t.searched;
    ++t.rejected[layout_rule(s, k)];
  }
}

using ByMicro = std::map<int64_t, Scored>;

// One chain's micro-batches, ascending. `same`: per micro-batch a candidate whose plan is this
// one's (taken over with this chain's knobs instead of planning); `fit`: receives what fits.
Tally plan_chain(Shared& sh, const Knobs& chain, const ByMicro* same, ByMicro* fit) {
  const Space& s = sh.s;
  Tally t;
  const std::vector<int64_t> ms = micros(s, chain.dp);
  if (sh.too_big(chain)) {
    count_unplanned(s, chain, ms, 0, t);
    return t;
  }
  const bool monotone = chain.schedule != PipelineSchedule::gpipe || chain.pp == 1;
  for (size_t i = 0; i < ms.size(); ++i) {
    Knobs k = chain;
    k.micro = ms[i], k.accum = s.global / (chain.dp * ms[i]);
    ++t.searched;
    if (const auto it = same ? same->find(k.micro) : ByMicro::const_iterator{}; same && it != same->end()) {
      t.feasible.push_back({k, it->second.memory, it->second.cost});
      sh.found(it->second.cost.step_s);
      continue;
    }
    if (sh.beaten(k)) {  // a layout rule refusing it is still counted as that rule (cheap, no ledger)
      if (const std::string rule = layout_rule(s, k); rule != "memory") ++t.rejected[rule];
      else ++t.bounded;
      continue;
    }
    try {
      const Plan p = plan_detail::make_plan(candidate_recipe(s, k), s.world, false);
      sh.record(k, p);
      sh.bound.learn(k, p);
      if (p.fits) {
        t.feasible.push_back({k, p.worst_stage().total(), predict_step(p, sh.hw)});
        sh.found(t.feasible.back().cost.step_s);
        if (fit) (*fit)[k.micro] = t.feasible.back();
        continue;
      }
      ++t.rejected["memory"];
      if (monotone && !sh.exhaustive) {  // every larger micro-batch holds at least as much
        count_unplanned(s, k, ms, i + 1, t);
        break;
      }
    } catch (const UserError& e) {
      ++t.rejected[rule_of(e)];
    }
  }
  return t;
}

// A chain; recompute none's also runs auto's twin, which where none fits recomputes nothing
// (choose_recompute stops when every stage fits without recompute): the same graphs, ledger
// and prediction, taken over instead of planned again (search_at plans the shown ones).
Tally run_chain(Shared& sh, const Knobs& chain) {
  const Space& s = sh.s;
  if (s.none < 0 || s.automatic < 0 || chain.recompute != s.none) return plan_chain(sh, chain, nullptr, nullptr);
  ByMicro none_fits;
  Tally t = plan_chain(sh, chain, nullptr, &none_fits);
  Knobs twin = chain;
  twin.recompute = s.automatic;
  t.add(plan_chain(sh, twin, sh.exhaustive ? nullptr : &none_fits, nullptr));
  return t;
}

// Every chain on every core; the results merged in the chains' order (the pruning's counts
// are the planning's, so the merge does not depend on which thread ran what first).
Tally run_chains(const Space& s, std::vector<Knobs> cs, const HardwareProfile& hw, const SearchOptions& opt) {
  Bound bound(s, hw, opt.exhaustive);
  Shared sh{s, hw, opt.exhaustive, bound, static_cast<size_t>(std::max(opt.top, 1)), {}, {}, {}};
  if (bound.on) {  // lowest bound first: good layouts early, so the K-th best step falls fast
    std::vector<std::pair<double, size_t>> order;
    for (size_t i = 0; i < cs.size(); ++i) order.push_back({bound.chain_lower(cs[i], micros(s, cs[i].dp)), i});
    std::stable_sort(order.begin(), order.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    std::vector<Knobs> sorted;
    for (const auto& [lo, i] : order) sorted.push_back(cs[i]);
    cs = std::move(sorted);
  }
  std::vector<Tally> out(cs.size());
  if (!cs.empty()) out[0] = run_chain(sh, cs[0]);  // first on this thread: lazy globals settle
  std::atomic<size_t> next{1};
  const auto work = [&] {
    for (size_t i = next++; i < cs.size(); i = next++) out[i] = run_chain(sh, cs[i]);
  };
  const unsigned n = opt.threads > 0 ? static_cast<unsigned>(opt.threads) : std::max(1u, std::thread::hardware_concurrency());
  std::vector<std::thread> pool;
  for (unsigned i = 1; i < std::min<size_t>(n, cs.size()); ++i) pool.emplace_back(work);
  work();
  for (std::thread& th : pool) th.join();
  Tally all;
  for (Tally& t : out) all.add(std::move(t));
  return all;
}

bool better(const Scored& a, const Scored& b) {
  if (a.cost.step_s != b.cost.step_s) return a.cost.step_s < b.cost.step_s;
  if (a.memory != b.memory) return a.memory < b.memory;
  return a.k.key() < b.k.key();
}

// The candidate's layout fields alone (what describe() prints), from its knobs.
SearchCandidate layout_of(const Space& s, const Knobs& k) {
  SearchCandidate c;
  c.dp = k.dp, c.tp = k.tp, c.pp = k.pp, c.virtual_stages = k.v, c.micro = k.micro, c.accum = k.accum;
  c.zero = k.zero, c.sequence_parallel = k.sp;
  c.schedule = to_string(k.schedule);
  c.recompute = s.recompute[static_cast<size_t>(k.recompute)].name;
  return c;
}

SearchCandidate to_candidate(const Space& s, const Scored& x) {
  SearchCandidate c = layout_of(s, x.k);
  c.recipe = candidate_recipe(s, x.k);
  c.memory_bytes = x.memory;
  c.predicted = x.cost;
  // A shown layout's own exact ledger, whatever the search took over (run_chain's auto twin).
  const Plan p = plan_detail::make_plan(c.recipe, s.world, false);
  RUNNER_CHECK(p.fits && std::abs(p.worst_stage().total() - x.memory) <= 1e-9 * x.memory,
               fmt::format("search: {} planned again holds {} bytes, the search found {}", c.describe(),
                           p.worst_stage().total(), x.memory));
  return c;
}

// The search at one world under one set of constraints; no error when nothing fits.
SearchResult search_at(const Recipe& r, int64_t world, const Fixed& fixed, const HardwareProfile& hw,
                       const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  Space s = make_space(r, world, fixed);
  s.max_zero = opt.max_zero;
  Tally t = run_chains(s, chains(s), hw, opt);
  const size_t top = std::min<size_t>(t.feasible.size(), static_cast<size_t>(std::max(opt.top, 1)));
  std::partial_sort(t.feasible.begin(), t.feasible.begin() + static_cast<std::ptrdiff_t>(top), t.feasible.end(), better);
  SearchResult res;
  res.world = world;
  for (const std::string& k : fixed) res.constraints.push_back(constraint_line(r, k));
  for (size_t i = 0; i < top; ++i) res.candidates.push_back(to_candidate(s, t.feasible[i]));
  res.searched = t.searched;
  res.bounded = t.bounded;
  res.feasible = static_cast<int64_t>(t.feasible.size());
  res.rejected = std::move(t.rejected);
  res.profile_source = hw.source;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

}  // namespace

std::vector<BoundCheck> search_bound_check(const Recipe& r, const SearchOptions& opt) {
  std::string source;
  const int64_t world = world_of(r, opt, source);
  const HardwareProfile hw = opt.profile.empty() ? hardware_profile(r.hardware) : hardware_profile(r.hardware, opt.profile);
  const Space s = make_space(r, world, fixed_keys(r));
  Bound learnt(s, hw, false), formula(s, hw, false);
  std::vector<BoundCheck> out;
  for (const Knobs& chain : chains(s))
    for (int64_t mb : micros(s, chain.dp)) {
      Knobs k = chain;
      k.micro = mb, k.accum = s.global / (k.dp * mb);
      try {
        const Plan p = plan_detail::make_plan(candidate_recipe(s, k), s.world, false);
        if (!p.fits) continue;
        learnt.learn(k, p);  // the first plan of its key teaches the layer's cost, as in the search
        out.push_back({layout_of(s, k).describe(), formula.lower(k), learnt.lower(k), predict_step(p, hw).step_s});
      } catch (const UserError&) {
      }
    }
  return out;
}

std::string SearchCandidate::describe() const {
  const SearchCandidate& c = *this;
  std::string s = fmt::format("dp {} x tp {} x pp {}", c.dp, c.tp, c.pp);
  if (c.pp > 1) s += fmt::format(" {}", c.schedule) + (c.virtual_stages > 1 ? fmt::format(" v{}", c.virtual_stages) : "");
  s += fmt::format(", micro {} x accum {}", c.micro, c.accum);
  if (c.zero) s += fmt::format(", ZeRO-{}", c.zero);
  if (c.sequence_parallel) s += ", sequence parallel";
  return s + ", recompute " + c.recompute;
}

namespace {

// Nothing fits: which constraints bind (each relaxed alone lets a layout fit) and how many
// devices would do.
[[noreturn]] void nothing_fits(const Recipe& r, const SearchResult& res, const Fixed& fixed, const HardwareProfile& hw,
                               const SearchOptions& opt) {
  SearchOptions one = opt;
  one.top = 1;
  std::vector<std::string> fixes;
  SourceLoc where = r.loc("hardware");
  for (const std::string& k : fixed) {
    if (k == "batch.global") continue;  // kept: the step's batch is the training's, not the layout's
    Fixed relaxed = fixed;
    relaxed.erase(k);
    const SearchResult alt = search_at(r, res.world, relaxed, hw, one);
    if (alt.candidates.empty()) continue;
    if (fixes.empty()) where = r.loc(k);
    fixes.push_back(fmt::format("without {}: {} fits ({} per rank)", constraint_line(r, k), alt.candidates[0].describe(),
                                format_bytes(alt.candidates[0].memory_bytes)));
  }
  for (int64_t w = res.world * 2; w <= res.world * 1024; w *= 2) {
    const SearchResult alt = search_at(r, w, fixed, hw, one);
    if (alt.candidates.empty()) continue;
    fixes.push_back(fmt::format("{} devices: {} fits ({} per rank)", w, alt.candidates[0].describe(),
                                format_bytes(alt.candidates[0].memory_bytes)));
    break;
  }
  std::string why;
  for (const auto& [reason, n] : res.rejected) why += fmt::format("{}{} {}", why.empty() ? "" : ", ", n, reason);
  std::string bound;
  for (const std::string& c : res.constraints) bound += (bound.empty() ? "" : "; ") + c;
  throw UserError(where,
                  fmt::format("no layout fits on {} device{}: {} searched{}{}", res.world, res.world == 1 ? "" : "s",
                              res.searched, why.empty() ? "" : " (" + why + ")",
                              bound.empty() ? "" : "; under the constraints " + bound),
                  fixes.empty() ? "nothing fits with up to 1024 times the devices either: shrink the model or seq_len"
                                : "relax a constraint or add devices: " + [&] {
                                    std::string f;
                                    for (const std::string& x : fixes) f += (f.empty() ? "" : "; or ") + x;
                                    return f;
                                  }());
}

std::string seconds_text(double s) {
  if (s >= 1) return fmt::format("{:.3f} s", s);
  if (s >= 1e-3) return fmt::format("{:.1f} ms", s * 1e3);
  return fmt::format("{:.1f} us", s * 1e6);
}

std::string breakdown_text(const StepCost& c) {
  std::string s = fmt::format("compute {}, recompute {}", seconds_text(c.compute), seconds_text(c.recompute));
  for (const char* g : {"tp", "dp", "pp"}) {
    const auto it = c.comm_exposed.find(g);
    s += fmt::format(", {} exposed {}", g, seconds_text(it == c.comm_exposed.end() ? 0.0 : it->second));
  }
  return s + fmt::format(", bubble {}, optimizer {}, data {}", seconds_text(c.bubble), seconds_text(c.optimizer),
                         seconds_text(c.data));
}

}  // namespace

nlohmann::json SearchCandidate::to_json() const {
  nlohmann::json pred = predicted.to_json();
  pred["memory_bytes"] = memory_bytes;
  nlohmann::json j{{"dp", dp},     {"tp", tp},         {"pp", pp},   {"virtual_stages", virtual_stages},
                   {"micro", micro}, {"accum", accum}, {"zero", zero}, {"sequence_parallel", sequence_parallel},
                   {"recompute", recompute}, {"schedule", schedule}, {"memory_bytes", memory_bytes}, {"predicted", pred}};
  if (measured_step_s) j["measured_step_s"] = *measured_step_s;
  return j;
}

nlohmann::json SearchResult::to_json() const {
  nlohmann::json cands = nlohmann::json::array();
  for (const SearchCandidate& c : candidates) cands.push_back(c.to_json());
  return {{"search",
           {{"world", world}, {"world_source", world_source}, {"constraints", constraints}, {"candidates", cands},
            {"searched", searched}, {"feasible", feasible}, {"rejected", rejected}, {"skipped_by_bound", bounded}, {"seconds", seconds},
            {"profile", profile_source}}}};
}

std::string SearchResult::table() const {
  std::string o = fmt::format("layout search: {} devices ({}), profile {}\n", world, world_source, profile_source);
  for (const std::string& c : constraints) o += "  constraint  " + c + "\n";
  if (constraints.empty()) o += "  constraints none: every layout field is searched\n";
  o += fmt::format("  {:>2} {:>5} {:>3} {:>3} {:<14} {:>5} {:>5} {:>4} {:>2} {:<26} {:>10} {:>11} {:>6} {:>8} {:>10}\n",
                   "#", "dp", "tp", "pp", "schedule", "micro", "accum", "zero", "sp", "recompute", "step", "tokens/s",
                   "MFU", "TFLOP/s", "memory");
  for (size_t i = 0; i < candidates.size(); ++i) {
    const SearchCandidate& c = candidates[i];
    const StepCost& p = c.predicted;
    const std::string sched = c.pp == 1 ? "-" : c.virtual_stages > 1 ? fmt::format("{} v{}", c.schedule, c.virtual_stages)
                                                                     : c.schedule;
    o += fmt::format("  {:>2} {:>5} {:>3} {:>3} {:<14} {:>5} {:>5} {:>4} {:>2} {:<26} {:>10} {:>11.0f} {:>5.1f}% {:>8.2f} {:>10}\n",
                     i + 1, c.dp, c.tp, c.pp, sched, c.micro, c.accum, c.zero, c.sequence_parallel ? "y" : "n", c.recompute,
                     seconds_text(p.step_s), p.tokens_per_s, 100 * p.mfu, p.tflops_per_device, format_bytes(c.memory_bytes));
    o += "       " + breakdown_text(p) + "\n";
    if (c.measured_step_s) o += "       measured " + seconds_text(*c.measured_step_s) + " per step\n";
  }
  o += fmt::format("searched {} layouts in {} ({:.0f}/s): {} fit", searched, seconds_text(seconds),
                   seconds > 0 ? static_cast<double>(searched) / seconds : 0.0, feasible);
  for (const auto& [why, n] : rejected) o += fmt::format("; rejected {} {}", n, why);
  if (bounded > 0) o += fmt::format("; skipped {} unplanned (their lower bound is above the top {}'s slowest)", bounded,
                                    candidates.size());
  return o + "\n";
}

SearchResult search_layouts(const Recipe& r, const SearchOptions& opt) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string source;
  const int64_t world = world_of(r, opt, source);
  const HardwareProfile hw = opt.profile.empty() ? hardware_profile(r.hardware) : hardware_profile(r.hardware, opt.profile);
  const Fixed fixed = fixed_keys(r);
  SearchResult res = search_at(r, world, fixed, hw, opt);
  res.world_source = source;
  if (res.candidates.empty()) nothing_fits(r, res, fixed, hw, opt);
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return res;
}

// ---- --write: the recipe's own text with its parallel, batch and recompute sections replaced

namespace {

std::string modules_yaml(const std::vector<RecomputeModule>& ms) {
  std::string s;
  for (RecomputeModule m : ms) s += (s.empty() ? "" : ", ") + to_string(m);
  return "[" + s + "]";
}

// The three sections a search fills in, as YAML (the rest of the recipe is the user's).
std::map<std::string, std::string> layout_sections(const Recipe& c) {
  const ParallelConfig& p = c.parallel;
  std::string par = fmt::format("parallel:              # chosen by runner plan --search\n  dp: {}\n  tp: {}\n  pp: {}\n"
                                "  schedule: {}\n  virtual_stages: {}\n  zero: {}\n  sequence_parallel: {}\n",
                                p.dp, p.tp, p.pp, to_string(p.schedule), p.virtual_stages, p.zero,
                                p.sequence_parallel ? "true" : "false");
  if (!p.stage_layers.empty()) par += "  stage_layers: [" + plan_detail::join(p.stage_layers) + "]\n";
  if (p.bucket_mb != ParallelConfig{}.bucket_mb) par += fmt::format("  bucket_mb: {}\n", p.bucket_mb);
  std::string rc = "recompute:\n  mode: " + to_string(c.recompute.mode) + "\n";
  if (!c.recompute.modules.empty()) rc += "  modules: " + modules_yaml(c.recompute.modules) + "\n";
  if (!c.recompute.layers.empty()) rc += "  layers: [" + plan_detail::join(c.recompute.layers) + "]\n";
  return {{"parallel", par},
          {"batch", fmt::format("batch:\n  global: {}\n  micro: {}\n  accum: {}\n", c.batch.global, c.batch.micro,
                                c.batch.accum)},
          {"recompute", rc}};
}

bool top_level_key(const std::string& line, const std::string& key) {
  if (line.compare(0, key.size(), key) != 0 || line.size() <= key.size() || line[key.size()] != ':') return false;
  return line.size() == key.size() + 1 || line[key.size() + 1] == ' ' || line[key.size() + 1] == '\r';
}

// Replaces the top-level section `key` (its line and everything indented under it; comment
// lines just before the next section stay with that one), or appends `body` when absent.
std::string replace_section(const std::string& text, const std::string& key, const std::string& body) {
  std::vector<std::string> lines;
  for (size_t at = 0; at < text.size();) {
    const size_t nl = text.find('\n', at);
    lines.push_back(text.substr(at, nl == std::string::npos ? std::string::npos : nl - at));
    at = nl == std::string::npos ? text.size() : nl + 1;
  }
  const auto begin = std::find_if(lines.begin(), lines.end(), [&](const std::string& l) { return top_level_key(l, key); });
  std::string out;
  if (begin == lines.end()) {
    for (const std::string& l : lines) out += l + "\n";
    return out + body;
  }
  auto end = std::find_if(begin + 1, lines.end(), [](const std::string& l) {
    return !l.empty() && l[0] != ' ' && l[0] != '\t' && l[0] != '#' && l[0] != '\r';
  });
  while (end > begin + 1 && ((end - 1)->empty() || (end - 1)->front() == '#')) --end;
  for (auto it = lines.begin(); it != begin; ++it) out += *it + "\n";
  out += body;
  for (auto it = end; it != lines.end(); ++it) out += *it + "\n";
  return out;
}

std::string resolved_with_header(const SearchCandidate& c, const std::string& why) {
  return fmt::format("# Written by runner plan --search: {}; the user's own text could not be kept ({}), so this is\n"
                     "# the recipe as resolved, every default filled in.\n",
                     c.describe(), why) +
         recipe_to_yaml(c.recipe);
}

}  // namespace

std::string write_candidate_yaml(const Recipe& r, const SearchCandidate& c) {
  if (r.source_text.empty()) return resolved_with_header(c, "the recipe was not read from a file");
  if (r.source_text.find("\n# --set ") != std::string::npos)
    return resolved_with_header(c, "--set overrides are not in its text");
  std::string text = r.source_text;
  if (!text.empty() && text.back() != '\n') text += '\n';
  for (const auto& [key, body] : layout_sections(c.recipe)) text = replace_section(text, key, body);
  // The text must read back as exactly the candidate's recipe; anything else keeps the resolved one.
  try {
    Recipe back = load_recipe_text(text, r.source_file);
    resolve_recipe_paths(back, r.source_file);
    if (recipe_to_yaml(back) == recipe_to_yaml(c.recipe)) return text;
  } catch (const UserError&) {
  }
  return resolved_with_header(c, "its rewritten text does not read back as the layout");
}

Recipe searched_recipe(const Recipe& r, int64_t world, const std::string& world_from, std::string* note,
                       std::string* search_json, int max_zero) {
  SearchOptions so;
  so.world = world;
  so.max_zero = max_zero;
  so.top = 1;
  SearchResult res = search_layouts(r, so);
  if (world > 0) res.world_source = world_from;
  const SearchCandidate& best = res.candidates.front();
  if (note)
    *note = fmt::format("layout searched (parallel: auto): {} | best of {} that fit among {} searched on {} devices ({}), "
                        "predicted {:.4g} s per step, {:.2f} s to search",
                        best.describe(), res.feasible, res.searched, res.world, res.world_source, best.predicted.step_s,
                        res.seconds);
  if (search_json) *search_json = res.to_json().dump(2) + "\n";
  return best.recipe;
}

}  // namespace runner
