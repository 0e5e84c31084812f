// recompute.mode auto: which layers and modules to recompute, chosen from the graph's own
// activation accounting, in order of activation bytes saved per recomputed FLOP, until every
// pipeline stage fits the device.
//
// A step recomputes one more piece of one layer: a module (norm, attention_core, attention,
// mlp) or "layer", the rest of the whole layer with its residual adds (what mode full does
// to it). Whole layers are a step of their own, not the sum of the modules: a layer recomputing
// norm, attention and mlp still keeps the first residual add's output (the second norm's
// input), and only recomputing the adds as well, as one segment from the layer's input, frees
// it; that halves what the layer holds (4sbh -> 2sbh, docs/ledger.md), so "everything" has to
// mean the whole layer. Recomputing an add alone is never a step: it would keep its other
// input alive instead and hold more.
//
// Bytes saved are the executor's dry run (Executor::simulate) of the stage's own graph with
// the layer's set changed, i.e. the ledger's activations per micro-batch: the sum of a stage's
// chosen bytes_saved is exactly what its activations_per_micro drops by. Layers are
// independent for this purpose, because every layer's input (the previous layer's output) is
// held whatever either layer recomputes (read by a norm's backward, or by a recompute
// segment), so one probe layer per virtual stage prices every state of every layer of that
// stage. Marginal costs differ by state (attention after attention_core adds only q, k, v and
// the projections), so the greedy compares, at each step, the next step of every layer.
//
// The choice is then verified on the real ledger (the recompute transient and workspace move
// too), stage by stage: the shortest prefix of that stage's greedy order that fits.
#include <algorithm>
#include <limits>
#include <map>
#include <string_view>

#include <fmt/format.h>

#include "ops/executor.h"
#include "ops/module.h"
#include "ops/ops.h"
#include "runner/plan/plan_internal.h"

namespace runner::plan_detail {

// Forward FLOPs, as the node's OpDef counts them (OpDef::flops): only ratios between steps
// matter to the choice, so pointwise work is a rough operation count per element next to the
// matrix products that dominate.
double node_flops(const ops::Graph& g, const ops::Node& n) {
  const ops::OpDef& op = ops::op_def(n.kind);
  return op.flops ? op.flops(g, n, false) : 0;
}

namespace {

// A layer's recompute state is an ops::ModuleSet; each step adds a set made by the one rule
// (ops::with_parts: attention brings its core, as in recompute_sets), and "layer" adds every
// module of the layer, the residual adds included (mode full). Ties go in this order.
struct StepKind {
  std::string_view name;
  ops::Module module;  // none for "layer"
  ops::ModuleSet adds;
};
constexpr StepKind step(ops::Module m) { return {ops::module_name(m), m, ops::with_parts({m})}; }
constexpr StepKind kSteps[] = {step(ops::Module::norm), step(ops::Module::attention_core),
                               step(ops::Module::attention), step(ops::Module::mlp),
                               {"layer", ops::Module::none, ops::layer_modules()}};
constexpr ops::ModuleSet kWhole = ops::layer_modules();

// What each state of one probe layer holds and recomputes, on one virtual stage's graph.
class LayerPrices {
 public:
  LayerPrices(GptSpec spec, int64_t layer) : spec_(std::move(spec)), layer_(layer) {}

  double saved(ops::ModuleSet state) { return price({}).held - price(state).held; }
  double flops(ops::ModuleSet state) { return price(state).flops; }
  const ops::Graph& graph_without() { price({}); return none_; }
  int64_t layer() const { return layer_; }

 private:
  struct Price { double held = 0, flops = 0; };
  Price price(ops::ModuleSet state) {
    auto it = memo_.find(state);
    if (it != memo_.end()) return it->second;
    GptSpec s = spec_;
    s.recompute.assign(static_cast<size_t>(s.model.n_layers), {});
    s.recompute[static_cast<size_t>(layer_)] = state;
    ops::Graph g = build_gpt_graph(s);
    Price p;
    p.held = static_cast<double>(ops::Executor::simulate(g).activations_after_forward);
    for (const ops::Node& n : g.nodes)
      if (n.recompute && n.layer == layer_) p.flops += node_flops(g, n);
    if (state.empty()) none_ = std::move(g);
    return memo_[state] = p;
  }
  GptSpec spec_;
  int64_t layer_;
  std::map<ops::ModuleSet, Price> memo_;
  ops::Graph none_;
};

struct Candidate {
  int64_t layer;
  int vstage, chunk;
};

// The greedy order of steps on one pipeline stage's candidate layers: at each step, the next
// step of any layer with the most bytes saved per FLOP added (ties: the lower layer, then the
// order of kSteps). Steps that would save nothing are never taken.
std::vector<RecomputeStep> greedy_order(int stage, const std::vector<Candidate>& layers,
                                        std::map<int, LayerPrices>& prices) {
  std::vector<RecomputeStep> order;
  std::vector<ops::ModuleSet> state(layers.size());
  for (;;) {
    double best = -1;
    size_t best_i = 0;
    const StepKind* best_step = nullptr;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (state[i] == kWhole) continue;
      LayerPrices& lp = prices.at(layers[i].vstage);
      for (const StepKind& st : kSteps) {
        const ops::ModuleSet next = state[i] | st.adds;
        if (next == state[i]) continue;
        const double ds = lp.saved(next) - lp.saved(state[i]);
        const double df = lp.flops(next) - lp.flops(state[i]);
        if (ds <= 0) continue;
        const double ratio = df > 0 ? ds / df : std::numeric_limits<double>::infinity();
        if (ratio > best) { best = ratio; best_i = i; best_step = &st; }
      }
    }
    if (!best_step) break;
    LayerPrices& lp = prices.at(layers[best_i].vstage);
    const ops::ModuleSet next = state[best_i] | best_step->adds;
    order.push_back({stage, layers[best_i].layer, std::string(best_step->name), lp.saved(next) - lp.saved(state[best_i]),
                     lp.flops(next) - lp.flops(state[best_i])});
    state[best_i] = next;
  }
  return order;
}

ops::ModuleSet step_adds(const std::string& name) {
  for (const StepKind& st : kSteps)
    if (name == st.name) return st.adds;
  return {};
}

// Every stage's total bytes per rank with these per-layer sets: the real ledger.
std::vector<double> stage_totals(const Recipe& r, const Plan& p, const GptSpec& whole) {
  Plan q;
  q.recipe = p.recipe;
  q.world = p.world, q.dp = p.dp, q.tp = p.tp, q.pp = p.pp;
  q.global = p.global, q.micro = p.micro, q.accum = p.accum;
  q.stage_layers = p.stage_layers;
  q.chunks = p.chunks;
  q.layout = std::make_shared<const ModelLayout>(whole, p.stage_layers, p.chunks);
  compute_ledger(r, q);
  std::vector<double> t;
  for (const StageLedger& s : q.stages) t.push_back(s.total());
  return t;
}

// The module a held tensor counts under: its producer's, except an output its OpDef marks as
// the residual stream's sum (OpDef::residual_outputs: a fused add + norm's), which is the
// residual add's as in the unfused graph, so that the shares below do not depend on model.fuse.
ops::Module held_module(const ops::Graph& g, const ops::TensorDesc& t) {
  const ops::Node& n = g.nodes[static_cast<size_t>(t.producer)];
  const uint8_t residual = ops::op_def(n.kind).residual_outputs;
  for (size_t j = 0; j < n.out.size(); ++j)
    if ((residual >> j & 1u) && &g.tensors[static_cast<size_t>(n.out[j])] == &t) return ops::Module::residual;
  return n.module;
}

// The rule of thumb beside the choice, on one probe layer: each step kind's share of what the
// layer holds for backward with nothing recomputed (by the module of the node that wrote each
// held tensor), and what recomputing it alone would save and cost.
void rule_of_thumb(LayerPrices& lp, RecomputeAuto& a) {
  const ops::Graph& g = lp.graph_without();
  std::map<ops::Module, double> held;
  for (const ops::TensorDesc& t : g.tensors) {
    if (t.kind != ops::TensorKind::Activation || !t.saved || t.layer != lp.layer() || t.producer < 0) continue;
    held[held_module(g, t)] += static_cast<double>(t.nbytes());
    a.layer_activation_bytes += static_cast<double>(t.nbytes());
  }
  for (const StepKind& st : kSteps) {
    RecomputeModuleCost c;
    c.module = st.name;
    c.bytes_saved = lp.saved(st.adds);
    c.flops = lp.flops(st.adds);
    // "layer" is the whole layer: everything it holds (beyond the modules: the residual adds').
    const bool whole = st.module == ops::Module::none;
    c.activation_bytes = whole ? a.layer_activation_bytes : held[st.module];
    c.share = a.layer_activation_bytes > 0 ? c.activation_bytes / a.layer_activation_bytes : 0;
    c.rule_of_thumb = !whole && c.share > 0.15;
    a.modules.push_back(c);
  }
}

// Stage `s` (its total `before` without recompute, its candidate layers `cands`): the shortest
// prefix of its greedy order that fits, set into `whole` and appended to `chosen`.
RecomputeStageChoice choose_stage(const Recipe& r, Plan& p, GptSpec& whole, int s, double before,
                                  const std::vector<Candidate>& cands, std::map<int, LayerPrices>& prices,
                                  std::vector<RecomputeStep>& chosen) {
  RecomputeStageChoice sc;
  sc.stage = s;
  sc.before = before;
  const std::vector<RecomputeStep> order = greedy_order(s, cands, prices);
  sc.candidates = static_cast<int64_t>(order.size());
  if (sc.before <= p.device_memory || order.empty()) {
    sc.after = sc.before;
    return sc;
  }
  // Each step's held bytes count once per micro-batch its chunk holds at once.
  const auto sched = p.schedule(s);
  std::vector<double> weight;
  for (const RecomputeStep& st : order) {
    int chunk = 0;
    for (const Candidate& c : cands)
      if (c.layer == st.layer) chunk = c.chunk;
    weight.push_back(static_cast<double>(parallel::max_in_flight(sched, chunk)) * st.bytes_saved);
  }
  auto apply = [&](size_t k) {  // the stage's layers set to the first k steps
    GptSpec w = whole;
    std::vector<ops::ModuleSet> sets(static_cast<size_t>(r.model.n_layers));
    for (size_t i = 0; i < k; ++i) sets[static_cast<size_t>(order[i].layer)] |= step_adds(order[i].module);
    for (const Candidate& c : cands) w.recompute[static_cast<size_t>(c.layer)] = sets[static_cast<size_t>(c.layer)];
    return w;
  };
  // The dry-run estimate picks where to look (total before less the held bytes freed);
  // the ledger decides, with the estimate corrected by what it missed (transient, workspace).
  auto first_fitting = [&](size_t from, double error) {
    double t = sc.before + error;
    size_t k = 0;
    for (; k < order.size() && (k < from || t > p.device_memory); ++k) t -= weight[k];
    return k;
  };
  size_t k = first_fitting(0, 0);
  std::map<size_t, double> seen;
  auto total_at = [&](size_t n) {
    if (!seen.count(n)) seen[n] = stage_totals(r, p, apply(n))[static_cast<size_t>(s)];
    return seen[n];
  };
  while (total_at(k) > p.device_memory && k < order.size()) {
    double est = sc.before;
    for (size_t i = 0; i < k; ++i) est -= weight[i];
    k = std::max(k + 1, first_fitting(k + 1, total_at(k) - est));
  }
  while (k > 0 && total_at(k - 1) <= p.device_memory) --k;  // the estimate may overshoot
  whole = apply(k);
  sc.after = total_at(k);
  if (sc.after > p.device_memory)
    p.warnings.push_back(fmt::format(
        "recompute auto: {} needs {} per rank even with every layer recomputed whole, more than the device's {}; "
        "recompute cannot make it fit (see the suggestions)",
        p.pp > 1 ? fmt::format("stage {}", s) : std::string("the model"), format_bytes(sc.after),
        format_bytes(p.device_memory)));
  chosen.insert(chosen.end(), order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k));
  return sc;
}

}  // namespace

void choose_recompute(const Recipe& r, Plan& p, GptSpec& whole) {
  RecomputeAuto a;
  whole.recompute.assign(static_cast<size_t>(r.model.n_layers), {});

  // The candidate layers of each pipeline stage (all of its layers: recipe validation refuses
  // recompute.layers beside auto), and one probe layer per virtual stage.
  const ModelLayout probe(whole, p.stage_layers, p.chunks);
  const int P = probe.pp();
  std::vector<std::vector<Candidate>> cands(static_cast<size_t>(P));
  std::map<int, LayerPrices> prices;
  for (int v = 0; v < probe.vstages(); ++v) {
    const GptSpec s = probe.spec(v);
    for (int64_t l = s.first_layer; l < s.last_layer; ++l) {
      cands[static_cast<size_t>(v % P)].push_back({l, v, v / P});
      if (!prices.count(v)) prices.emplace(v, LayerPrices(s, l));
    }
  }
  if (!prices.empty()) rule_of_thumb(prices.begin()->second, a);  // on the first candidate layer

  // Without recompute first; then, stage by stage, the shortest prefix of the stage's greedy
  // order that fits. Stages are independent in the ledger (each holds only its own layers).
  const std::vector<double> before = stage_totals(r, p, whole);
  for (int s = 0; s < P; ++s)
    a.stages.push_back(choose_stage(r, p, whole, s, before[static_cast<size_t>(s)], cands[static_cast<size_t>(s)],
                                    prices, a.chosen));
  a.sets = whole.recompute;
  p.recompute_auto = std::move(a);
}

}  // namespace runner::plan_detail
