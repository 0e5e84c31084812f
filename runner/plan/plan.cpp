// Plan resolution and the memory ledger (see plan.h).
#include "runner/plan/plan.h"

#include "parallel/pipeline.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "ops/executor.h"
#include <numeric>
#include <set>

namespace runner {

namespace {

size_t dtype_bytes(const std::string& name) {
  if (name == "fp32") return 4;
  if (name == "int8") return 1;
  return 2;  // bf16, fp16
}

ops::DType dtype_of(const std::string& name) {
  ops::DType d = ops::DType::F32;
  ops::parse_dtype(name, &d);
  return d;
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s;
}

// Divisors of n near x, for "nearest valid choices".
std::vector<int64_t> nearest_divisors(int64_t n, int64_t x, int count = 2) {
  std::vector<int64_t> d;
  for (int64_t k = 1; k <= n; ++k)
    if (n % k == 0) d.push_back(k);
  std::sort(d.begin(), d.end(), [&](int64_t a, int64_t b) {
    int64_t da = std::llabs(a - x), db = std::llabs(b - x);
    return da != db ? da < db : a < b;
  });
  d.resize(std::min<size_t>(d.size(), count));
  std::sort(d.begin(), d.end());
  return d;
}

std::string or_list(const std::vector<int64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? (i + 1 == v.size() ? " or " : ", ") : "") + std::to_string(v[i]);
  return s;
}

double host_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (f >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024.0;
    f.ignore(256, '\n');
  }
  return 16.0 * (1ull << 30);
}

// global = known x dp x other: derives `other` from global and the `known` factor, or says
// which values of the known factor (or of global) would divide.
int64_t derive_factor(const Recipe& r, Plan& p, int64_t g, int64_t known, const char* known_name,
                      const char* other_name) {
  int64_t dp = p.dp;
  if (g % (known * dp) != 0) {
    std::string fix = g % dp == 0 ? fmt::format("try {} {}, or global {}", known_name,
                                                or_list(nearest_divisors(g / dp, known)),
                                                (g + known * dp - 1) / (known * dp) * known * dp)
                                  : fmt::format("global must be a multiple of dp {}: try global {}", dp,
                                                (g + dp - 1) / dp * dp);
    throw UserError(r.loc("batch.global"),
                    fmt::format("global batch {} is not divisible by {} {} x dp {} = {} ({} = global / ({} x dp))", g,
                                known_name, known, dp, known * dp, other_name, known_name),
                    fix);
  }
  p.derived.push_back(other_name);
  return g / (known * dp);
}

void resolve_batch(const Recipe& r, Plan& p) {
  const BatchConfig& b = r.batch;
  int64_t dp = p.dp;
  int64_t g = b.global, m = b.micro, a = b.accum;
  auto eq = [&](int64_t gg, int64_t mm, int64_t aa) {
    return fmt::format("global {} != micro {} x dp {} x accum {} = {}", gg, mm, dp, aa, mm * dp * aa);
  };
  if (g && m && a) {
    if (g != m * dp * a) {
      std::string fix;
      if (g % (m * dp) == 0) fix = fmt::format("set accum {} (or leave accum out to derive it)", g / (m * dp));
      else if (g % (a * dp) == 0) fix = fmt::format("set micro {} (or leave micro out to derive it)", g / (a * dp));
      else fix = fmt::format("set global {} or leave one of global, micro, accum out to derive it", m * dp * a);
      throw UserError(r.loc("batch.global"), "batch equation does not hold: " + eq(g, m, a), fix);
    }
  } else if (g && m) {
    a = derive_factor(r, p, g, m, "micro", "accum");
  } else if (g && a) {
    m = derive_factor(r, p, g, a, "accum", "micro");
  } else if (m && a) {
    g = m * dp * a;
    p.derived.push_back("global");
  } else if (g) {
    a = 1;
    if (g % dp != 0)
      throw UserError(r.loc("batch.global"), fmt::format("global batch {} is not divisible by dp {}", g, dp),
                      fmt::format("try global {} or {}", std::max<int64_t>(dp, g / dp * dp), (g / dp + 1) * dp));
    m = g / dp;
    p.derived.insert(p.derived.end(), {"micro", "accum"});
  } else {
    if (!m) { m = 1; p.derived.push_back("micro"); }
    if (!a) { a = 1; p.derived.push_back("accum"); }
    g = m * dp * a;
    p.derived.push_back("global");
  }
  p.global = g;
  p.micro = m;
  p.accum = a;
}

void check_layout(const Recipe& r, Plan& p) {
  const ModelConfig& m = r.model;
  int64_t tp = p.tp, pp = p.pp;
  if (m.n_heads % tp != 0)
    throw UserError(r.loc("parallel.tp"), fmt::format("model.n_heads {} is not divisible by parallel.tp {}", m.n_heads, tp),
                    "choose tp among " + or_list(nearest_divisors(m.n_heads, tp, 3)));
  if (m.mlp_hidden() % tp != 0)
    throw UserError(r.loc("parallel.tp"),
                    fmt::format("MLP width {} (mlp_ratio {} x d_model {}) is not divisible by parallel.tp {}",
                                m.mlp_hidden(), m.mlp_ratio, m.d_model, tp),
                    "choose tp among " + or_list(nearest_divisors(m.mlp_hidden(), tp, 3)) + " or change mlp_ratio");
  if (r.parallel.sequence_parallel && tp > 1 && m.seq_len % tp != 0)
    throw UserError(r.loc("parallel.sequence_parallel"),
                    fmt::format("sequence parallelism splits seq_len {} over tp {}, which does not divide it", m.seq_len, tp),
                    "choose a seq_len divisible by tp, or turn sequence_parallel off");
  if (r.parallel.sequence_parallel && tp == 1) p.notes.push_back("sequence_parallel has no effect with tp 1");
  p.vocab_padded = padded_vocab(m.vocab_size, tp);
  if (p.vocab_padded != m.vocab_size)
    p.notes.push_back(fmt::format("vocabulary padded from {} to {} (a multiple of tp {}); padded logits are masked out",
                                  m.vocab_size, p.vocab_padded, tp));
  const auto& sl = r.parallel.stage_layers;
  if (!sl.empty()) {
    int64_t sum = 0;
    for (auto v : sl) sum += v;
    if (static_cast<int64_t>(sl.size()) != pp || sum != m.n_layers)
      throw UserError(r.loc("parallel.stage_layers"),
                      fmt::format("parallel.stage_layers [{}] must have pp = {} entries summing to n_layers = {}", join(sl), pp,
                                  m.n_layers),
                      "list one layer count per pipeline stage");
    p.stage_layers = sl;
  } else {
    if (pp > m.n_layers)
      throw UserError(r.loc("parallel.pp"),
                      fmt::format("parallel.pp {} exceeds model.n_layers {}: every pipeline stage needs at least one layer",
                                  pp, m.n_layers),
                      "choose pp among " + or_list(nearest_divisors(m.n_layers, m.n_layers, 3)));
    if (m.n_layers % pp != 0) {
      std::vector<int64_t> split(pp, m.n_layers / pp);
      for (int64_t i = 0; i < m.n_layers % pp; ++i) split[pp - 1 - i]++;
      throw UserError(r.loc("parallel.pp"),
                      fmt::format("model.n_layers {} does not split evenly over parallel.pp {} stages", m.n_layers, pp),
                      "choose pp among " + or_list(nearest_divisors(m.n_layers, pp, 3)) +
                          " or give an explicit split, e.g. parallel.stage_layers: [" + join(split) + "]");
    }
    p.stage_layers.assign(pp, m.n_layers / pp);
  }
  if (pp > 1 && p.accum < pp)
    throw UserError(r.loc("batch"),
                    fmt::format("a {}-stage pipeline needs at least {} micro-batches per step, got accum {}", pp, pp, p.accum),
                    fmt::format("raise batch.accum to >= {} (or global to >= {})", pp, p.micro * p.dp * pp));
  if (r.parallel.schedule == "interleaved" && pp > 1) {
    int64_t v = r.parallel.virtual_stages;
    for (auto layers : p.stage_layers)
      if (layers % v != 0)
        throw UserError(r.loc("parallel.virtual_stages"),
                        fmt::format("interleaved schedule: each stage's {} layers must split into {} chunks", layers, v),
                        "choose virtual_stages dividing the layers per stage");
  }
  int64_t v = (r.parallel.schedule == "interleaved") ? std::max<int64_t>(1, r.parallel.virtual_stages) : 1;
  p.chunks = pp > 1 ? v : 1;
  if (p.chunks > 1 && p.accum % pp != 0)
    throw UserError(r.loc("batch"),
                    fmt::format("the interleaved schedule sends micro-batches through the stages in groups of pp = {}: "
                                "accum {} is not a multiple of {}", pp, p.accum, pp),
                    fmt::format("set batch.accum to a multiple of {} (e.g. {})", pp, (p.accum + pp - 1) / pp * pp));
  p.bubble = pp > 1 ? static_cast<double>(pp - 1) / static_cast<double>(v * p.accum + pp - 1) : 0.0;
  if (p.bubble > 0.25)
    p.warnings.push_back(fmt::format("pipeline bubble {:.0f}% = (p-1)/(m+p-1) with p={} m={}: raise accum to shrink it",
                                     100 * p.bubble, pp, p.accum));
  if (tp > r.hardware.devices_per_node && r.hardware.device != "cpu")
    p.warnings.push_back(fmt::format("tp {} spans more than one node ({} devices per node): tensor parallelism across nodes is slow",
                                     tp, r.hardware.devices_per_node));
  if (r.parallel.zero == 1 && p.dp == 1)
    p.notes.push_back("ZeRO-1 with dp 1 shards nothing");
}

// Bytes of the activation a pipeline stage sends on (and of its gradient): one micro-batch's
// (B*T, C), or this rank's sequence shard of it under sequence parallelism.
double stage_message_bytes(const Recipe& r, const Plan& p, const GptSpec& spec, size_t wbytes) {
  double b = static_cast<double>(spec.B * (spec.T ? spec.T : r.model.seq_len) * r.model.d_model) * wbytes;
  if (spec.sequence_parallel && p.tp > 1) b /= static_cast<double>(p.tp);
  return b;
}

// A pipeline stage's buffers for one model chunk, as the trainer allocates them: per
// micro-batch in flight, the activation received and the gradient sent back (chunks after the
// first) and the activation sent (chunks before the last), plus one received gradient.
double pipeline_buffers(int vstage, int vstages, double in_flight, double message_bytes) {
  double b = 0;
  if (vstage > 0) b += 2.0 * in_flight * message_bytes;
  if (vstage < vstages - 1) b += (in_flight + 1.0) * message_bytes;
  return b;
}

// The activation side of one stage under 1F1B or GPipe: its graph's dry run, times the
// micro-batches the schedule holds at once.
void contiguous_stage(const Recipe& r, const Plan& p, int s, size_t wbytes, StageLedger& L) {
  GptSpec spec = p.stage_spec(s);
  ops::Graph g = build_gpt_graph(spec);
  ops::MemoryEstimate est = ops::Executor::simulate(g);
  std::set<std::string> seen;
  for (int id : g.params)
    if (seen.insert(g.tensors[id].name).second) L.params += ops::numel_of(g.tensors[id].shape);
  L.activations_per_micro = static_cast<double>(est.activations_after_forward);
  L.recompute_transient = static_cast<double>(est.peak[static_cast<int>(ops::Account::Activations)]) -
                          L.activations_per_micro;
  const bool gpipe = r.parallel.schedule == "gpipe";
  L.micro_in_flight = p.pp == 1 ? 1 : (gpipe ? p.accum : std::min<int64_t>(p.pp - s, p.accum));
  L.activations = L.activations_per_micro * L.micro_in_flight + L.recompute_transient;
  L.workspace = static_cast<double>(est.peak[static_cast<int>(ops::Account::Workspace)]);
  if (p.pp > 1)
    L.communication += pipeline_buffers(s, static_cast<int>(p.pp), static_cast<double>(L.micro_in_flight),
                                        stage_message_bytes(r, p, spec, wbytes));
}

// The activation side of one stage under the interleaved schedule: its chunks' graphs, and the
// activations of every (micro-batch, chunk) the schedule holds at once, found by replaying the
// schedule with each chunk's per-micro-batch activations from its own dry run.
void interleaved_stage(const Recipe& r, const Plan& p, int s, size_t wbytes, StageLedger& L) {
  const int P = static_cast<int>(p.pp), V = static_cast<int>(p.chunks);
  std::vector<double> act(static_cast<size_t>(V)), transient(static_cast<size_t>(V));
  auto sched = parallel::schedule_interleaved(s, P, static_cast<int>(p.accum), V);
  for (int c = 0; c < V; ++c) {
    GptSpec spec = p.chunk_spec(c * P + s);
    ops::Graph g = build_gpt_graph(spec);
    ops::MemoryEstimate est = ops::Executor::simulate(g);
    for (int id : g.params) L.params += ops::numel_of(g.tensors[id].shape);
    act[static_cast<size_t>(c)] = static_cast<double>(est.activations_after_forward);
    transient[static_cast<size_t>(c)] =
        static_cast<double>(est.peak[static_cast<int>(ops::Account::Activations)]) - act[static_cast<size_t>(c)];
    L.workspace = std::max(L.workspace, static_cast<double>(est.peak[static_cast<int>(ops::Account::Workspace)]));
    L.communication += pipeline_buffers(c * P + s, P * V, parallel::max_in_flight(sched, c),
                                        stage_message_bytes(r, p, spec, wbytes));
  }
  double cur = 0, peak = 0;
  int64_t live = 0, most = 0;
  for (const auto& a : sched) {
    const size_t c = static_cast<size_t>(a.chunk);
    if (a.forward) {
      cur += act[c];
      most = std::max(most, ++live);
      peak = std::max(peak, cur);
    } else {
      peak = std::max(peak, cur + transient[c]);
      cur -= act[c];
      --live;
    }
  }
  L.activations_per_micro = 0;
  for (double a : act) L.activations_per_micro += a;
  L.recompute_transient = *std::max_element(transient.begin(), transient.end());
  L.micro_in_flight = most;  // (micro-batch, chunk) pairs
  L.activations = peak;
}

void compute_ledger(const Recipe& r, Plan& p) {
  const PrecisionConfig& pr = r.precision;
  size_t wbytes = dtype_bytes(pr.compute);
  size_t gbytes = pr.compute == "fp32" ? 4 : dtype_bytes(pr.grad_accum);
  bool master = pr.compute != "fp32" && pr.master_weights == "fp32";
  double opt_per_param = 8.0 + (master ? 4.0 : 0.0);
  int64_t zero_div = r.parallel.zero >= 1 ? p.dp : 1;
  p.stages.clear();
  int64_t first = 0;
  for (int64_t s = 0; s < p.pp; ++s) {
    StageLedger L;
    L.stage = static_cast<int>(s);
    L.first_layer = first;
    L.last_layer = first + p.stage_layers[s];
    first = L.last_layer;
    if (p.chunks > 1) interleaved_stage(r, p, static_cast<int>(s), wbytes, L);
    else contiguous_stage(r, p, static_cast<int>(s), wbytes, L);
    L.parameters = static_cast<double>(L.params) * wbytes;
    L.gradients = static_cast<double>(L.params) * gbytes;
    L.optimizer = static_cast<double>(L.params) * opt_per_param / static_cast<double>(zero_div);
    // Host copies of the state: the asynchronous checkpoint's snapshot buffers and the
    // in-memory rollback snapshot each hold the parameters and the optimizer states. They
    // live in host memory, which is the device's memory only when the device is the CPU.
    if (r.hardware.device == "cpu") {
      double state_copy = static_cast<double>(L.params) * 4.0 + L.optimizer;
      if (r.checkpoint.async) L.workspace += state_copy;
      if (r.checkpoint.snapshot_every > 0) L.workspace += state_copy;
    }
    // Communication buffers besides the pipeline's: data-parallel buckets are reduced in place
    // in the flat gradient buffer (no copy), except under ZeRO-1, where each rank receives its
    // reduced piece of every bucket (params / dp elements); tensor-parallel all-reduces are in place.
    if (p.dp > 1 && r.parallel.zero >= 1) L.communication += static_cast<double>(L.params) * gbytes / static_cast<double>(p.dp);
    p.stages.push_back(L);
  }
}

}  // namespace
static Plan make_plan_impl(const Recipe& r, int64_t world_size, bool with_suggestions);
namespace {

// What would fit: a small search over the knobs a user can turn (ZeRO-1, recompute,
// micro-batch, tp, pp), each candidate verified by planning it. Candidates that change
// fewer knobs come first, then the smaller footprint.
void suggest(const Recipe& r, Plan& p) {
  struct Found { int changes; double total; std::string what; };
  std::vector<Found> found;
  const int64_t world = p.world;
  std::vector<int64_t> micros;
  for (int64_t m = p.micro; m >= 1; m /= 2) micros.push_back(m);
  for (int64_t tp : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}}) {
    if (tp < p.tp || tp > std::max<int64_t>(r.hardware.devices_per_node, p.tp)) continue;
    for (int64_t pp : {int64_t{1}, int64_t{2}, int64_t{4}, int64_t{8}}) {
      if (pp < p.pp || world % (tp * pp) != 0 || r.model.n_layers % pp != 0) continue;
      int64_t dp = world / (tp * pp);
      if (p.global % dp != 0) continue;
      for (int zero : {0, 1}) {
        if (zero < r.parallel.zero || (zero == 1 && dp == 1 && r.parallel.zero == 0)) continue;
        for (const char* rc : {"keep", "selective", "full"}) {
          std::string mode = rc;
          if (mode != "keep" && mode == r.recompute.mode) continue;
          for (int64_t m : micros) {
            if ((p.global / dp) % m != 0) continue;
            Recipe c = r;
            std::vector<std::string> what;
            if (tp != p.tp) { c.parallel.tp = tp; what.push_back(fmt::format("parallel.tp: {}", tp)); }
            if (pp != p.pp) {
              c.parallel.pp = pp;
              c.parallel.stage_layers.clear();
              what.push_back(fmt::format("parallel.pp: {}", pp));
            }
            c.parallel.dp = dp;
            if (zero != r.parallel.zero) { c.parallel.zero = zero; what.push_back("parallel.zero: 1"); }
            if (mode != "keep") {
              c.recompute.mode = mode;
              c.recompute.layers.clear();
              if (mode == "selective") c.recompute.modules = {"attention_core"};
              what.push_back(mode == "full" ? "recompute: {mode: full}"
                                            : "recompute: {mode: selective, modules: [attention_core]}");
            }
            if (m != p.micro) what.push_back(fmt::format("batch.micro: {}", m));
            c.batch = {p.global, m, 0};
            if (what.empty()) continue;
            try {
              Plan q = make_plan_impl(c, world, false);
              if (!q.fits) continue;
              std::string w;
              for (size_t i = 0; i < what.size(); ++i) w += (i ? ", " : "") + what[i];
              if (dp != p.dp) w += fmt::format(" (dp becomes {})", dp);
              found.push_back({static_cast<int>(what.size()), q.worst_stage().total(), w});
              break;  // the largest micro-batch that fits for this combination
            } catch (const UserError&) {
            }
          }
        }
      }
    }
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.changes != b.changes ? a.changes < b.changes : a.total < b.total;
  });
  for (size_t i = 0; i < found.size() && i < 4; ++i)
    p.suggestions.push_back(fmt::format("{} -> {} per rank", found[i].what, format_bytes(found[i].total)));
  if (p.suggestions.empty())
    p.suggestions.push_back(
        fmt::format("more devices: nothing on {} devices fits (tried tp, pp, ZeRO-1, recompute, micro)", world));
}

}  // namespace


double device_memory_bytes(const HardwareConfig& hw) {
  if (hw.memory_gb > 0) return hw.memory_gb * (1ull << 30);
  static const std::pair<const char*, double> table[] = {
      {"a100-40gb", 40}, {"a100-80gb", 80}, {"h100-80gb", 80}, {"h200", 141}, {"v100-32gb", 32}, {"l40s", 48}};
  for (auto& [name, gb] : table)
    if (hw.device == name) return gb * (1ull << 30);
  return host_memory_bytes();
}

double device_peak_flops(const HardwareConfig& hw, const std::string& compute) {
  if (hw.peak_tflops > 0) return hw.peak_tflops * 1e12;
  bool half = compute != "fp32";
  if (hw.device.rfind("a100", 0) == 0) return half ? 312e12 : 19.5e12;
  if (hw.device.rfind("h100", 0) == 0 || hw.device == "h200") return half ? 989e12 : 67e12;
  return 0;
}

std::string format_bytes(double b) {
  const double gib = 1ull << 30, mib = 1ull << 20;
  if (b >= gib) return fmt::format("{:.2f} GiB", b / gib);
  if (b >= mib) return fmt::format("{:.1f} MiB", b / mib);
  return fmt::format("{:.0f} KiB", b / 1024.0);
}

GptSpec Plan::chunk_spec(int vstage, int64_t tp_rank) const {
  if (chunks <= 1) return stage_spec(vstage, tp_rank);
  GptSpec s = stage_spec(vstage % static_cast<int>(pp), tp_rank);
  int64_t first = 0;
  for (int u = 0; u < vstage; ++u) first += stage_layers[static_cast<size_t>(u % pp)] / chunks;
  s.first_layer = first;
  s.last_layer = first + stage_layers[static_cast<size_t>(vstage % pp)] / chunks;
  s.first_stage = vstage == 0;
  s.last_stage = vstage == pp * chunks - 1;
  return s;
}

GptSpec Plan::stage_spec(int stage, int64_t tp_rank) const {
  GptSpec s;
  s.model = recipe.model;
  s.B = micro;
  s.T = recipe.model.seq_len;
  s.tp = tp;
  s.tp_rank = tp_rank;
  s.sequence_parallel = recipe.parallel.sequence_parallel;
  int64_t first = 0;
  for (int i = 0; i < stage; ++i) first += stage_layers[i];
  s.first_layer = first;
  s.last_layer = first + stage_layers[stage];
  s.first_stage = stage == 0;
  s.last_stage = stage == pp - 1;
  s.vocab_padded = vocab_padded;
  s.act_dtype = dtype_of(recipe.precision.compute);
  s.recompute = recompute_sets(recipe.recompute, recipe.model.n_layers);
  return s;
}

const StageLedger& Plan::worst_stage() const {
  return *std::max_element(stages.begin(), stages.end(),
                           [](const StageLedger& a, const StageLedger& b) { return a.total() < b.total(); });
}

static Plan make_plan_impl(const Recipe& r, int64_t world_size, bool with_suggestions);

Plan make_plan(const Recipe& r, int64_t world_size) { return make_plan_impl(r, world_size, true); }

static Plan make_plan_impl(const Recipe& r, int64_t world_size, bool with_suggestions) {
  Plan p;
  p.recipe = r;
  p.tp = r.parallel.tp;
  p.pp = r.parallel.pp;
  int64_t tppp = p.tp * p.pp;
  int64_t devices = r.hardware.nodes * r.hardware.devices_per_node;
  if (world_size > 0) {
    if (world_size % tppp != 0)
      throw UserError(r.loc("parallel"),
                      fmt::format("world size {} is not divisible by tp {} x pp {} = {}", world_size, p.tp, p.pp, tppp),
                      fmt::format("launch a multiple of {} ranks, or change parallel.tp/pp", tppp));
    p.dp = world_size / tppp;
    if (r.parallel.dp && r.parallel.dp != p.dp)
      throw UserError(r.loc("parallel.dp"),
                      fmt::format("world size {} != dp {} x tp {} x pp {} = {}", world_size, r.parallel.dp, p.tp, p.pp,
                                  r.parallel.dp * tppp),
                      fmt::format("launch {} ranks (mpirun -np {}), or set parallel.dp: {} (or leave dp out to derive it)",
                                  r.parallel.dp * tppp, r.parallel.dp * tppp, p.dp));
  } else if (r.parallel.dp) {
    p.dp = r.parallel.dp;
  } else {
    if (devices % tppp != 0)
      throw UserError(r.loc("hardware"),
                      fmt::format("{} devices (nodes {} x devices_per_node {}) are not divisible by tp {} x pp {}", devices,
                                  r.hardware.nodes, r.hardware.devices_per_node, p.tp, p.pp),
                      "set parallel.dp explicitly or change the device count");
    p.dp = devices / tppp;
  }
  p.world = p.dp * tppp;
  if (world_size == 0 && r.hardware.device != "cpu" && p.world > devices)
    p.warnings.push_back(fmt::format("the layout needs {} devices but hardware lists {}", p.world, devices));
  resolve_batch(r, p);
  check_layout(r, p);
  p.tokens_per_step = p.global * r.model.seq_len;
  compute_ledger(r, p);
  // Logical parameter count: every stage's parameters of one tp rank times tp, minus replicated
  // ones counted tp times. Simpler and exact: build the unsharded single-stage graph's count.
  {
    GptSpec full;
    full.model = r.model;
    full.B = 1;
    full.T = 1;
    full.vocab_padded = p.vocab_padded;
    ops::Graph g = build_gpt_graph(full);
    std::set<std::string> seen;
    for (int id : g.params)
      if (seen.insert(g.tensors[id].name).second) p.param_count += ops::numel_of(g.tensors[id].shape);
  }
  // 6N per token for the matrices plus attention's 12 * L * T * C (Kaplan et al. 2020; PaLM's MFU).
  p.flops_per_token = 6.0 * static_cast<double>(p.param_count) +
                      12.0 * r.model.n_layers * r.model.seq_len * r.model.d_model;
  p.device_memory = device_memory_bytes(r.hardware);
  p.fits = p.worst_stage().total() <= p.device_memory;
  if (r.inference) {
    const InferenceConfig& ic = *r.inference;
    InferencePlan ip;
    ip.batch = ic.batch;
    ip.context = ic.context ? ic.context : r.model.seq_len;
    ip.kv_dtype = ic.kv_dtype;
    for (auto& st : p.stages) {
      double layers = static_cast<double>(st.last_layer - st.first_layer);
      double per_seq = 2.0 * layers * static_cast<double>(ip.context) *
                       static_cast<double>(r.model.d_model / p.tp) * dtype_bytes(ic.kv_dtype);
      double weights = static_cast<double>(st.params) * dtype_bytes(r.precision.compute == "fp32" ? "fp32" : "bf16");
      if (weights + per_seq * ip.batch > ip.weights + ip.kv_cache) {
        ip.weights = weights;
        ip.kv_per_sequence = per_seq;
        ip.kv_cache = per_seq * static_cast<double>(ip.batch);
      }
    }
    double room = p.device_memory - ip.weights;
    ip.max_batch = room > 0 && ip.kv_per_sequence > 0 ? static_cast<int64_t>(room / ip.kv_per_sequence) : 0;
    if (ip.max_batch < ip.batch)
      p.warnings.push_back(fmt::format("inference: the KV cache for batch {} does not fit; at most batch {}", ip.batch,
                                       ip.max_batch));
    p.inference = ip;
  }
  if (!p.fits && with_suggestions) suggest(r, p);
  return p;
}

nlohmann::json Plan::to_json() const {
  using nlohmann::json;
  json j;
  j["name"] = recipe.name;
  j["world"] = world;
  j["grid"] = {{"dp", dp}, {"tp", tp}, {"pp", pp}};
  j["batch"] = {{"global", global}, {"micro", micro}, {"accum", accum}, {"derived", derived},
                {"tokens_per_step", tokens_per_step}};
  j["vocab_padded"] = vocab_padded;
  j["stage_layers"] = stage_layers;
  j["bubble"] = bubble;
  j["param_count"] = param_count;
  j["flops_per_token"] = flops_per_token;
  j["device_memory_bytes"] = device_memory;
  j["fits"] = fits;
  json st = json::array();
  for (auto& s : stages)
    st.push_back({{"stage", s.stage},
                  {"layers", {s.first_layer, s.last_layer}},
                  {"params", s.params},
                  {"parameters_bytes", s.parameters},
                  {"gradients_bytes", s.gradients},
                  {"optimizer_bytes", s.optimizer},
                  {"activations_bytes", s.activations},
                  {"activations_per_micro_bytes", s.activations_per_micro},
                  {"recompute_transient_bytes", s.recompute_transient},
                  {"micro_in_flight", s.micro_in_flight},
                  {"workspace_bytes", s.workspace},
                  {"communication_bytes", s.communication},
                  {"total_bytes", s.total()}});
  j["stages"] = st;
  j["notes"] = notes;
  j["warnings"] = warnings;
  j["suggestions"] = suggestions;
  if (inference)
    j["inference"] = {{"batch", inference->batch},
                      {"context", inference->context},
                      {"kv_dtype", inference->kv_dtype},
                      {"weights_bytes", inference->weights},
                      {"kv_cache_bytes", inference->kv_cache},
                      {"kv_per_sequence_bytes", inference->kv_per_sequence},
                      {"max_batch", inference->max_batch}};
  return j;
}

std::string Plan::table() const {
  std::ostringstream o;
  const Recipe& r = recipe;
  o << fmt::format("plan for '{}' ({})\n", r.name, r.source_file);
  o << fmt::format("  model      gpt {:.1f}M params: {} layers, d_model {}, {} heads, mlp {}, vocab {}{}, seq {}\n",
                   param_count / 1e6, r.model.n_layers, r.model.d_model, r.model.n_heads, r.model.mlp_hidden(),
                   r.model.vocab_size, vocab_padded != r.model.vocab_size ? fmt::format(" (padded {})", vocab_padded) : "",
                   r.model.seq_len);
  o << fmt::format("  grid       world {} = dp {} x tp {} x pp {}", world, dp, tp, pp);
  if (pp > 1) o << fmt::format("  stages [{}]  schedule {}", join(stage_layers), r.parallel.schedule);
  if (r.parallel.zero) o << "  ZeRO-1";
  if (r.parallel.sequence_parallel && tp > 1) o << "  sequence-parallel";
  o << "\n";
  if (world > 1)
    o << fmt::format("  launch     mpirun -np {} runner train {}   (or srun -n {} ...)\n", world, r.source_file, world);
  o << fmt::format("  batch      global {} = micro {} x dp {} x accum {}{}  ({} tokens/step)\n", global, micro, dp, accum,
                   derived.empty() ? "" : " (derived: " + [&] {
                     std::string s;
                     for (size_t i = 0; i < derived.size(); ++i) s += (i ? ", " : "") + derived[i];
                     return s;
                   }() + ")",
                   tokens_per_step);
  o << fmt::format("  precision  {} compute, master {}, grad accum {}; recompute {}\n", r.precision.compute,
                   r.precision.compute == "fp32" ? "-" : r.precision.master_weights,
                   r.precision.compute == "fp32" ? "fp32" : r.precision.grad_accum, r.recompute.mode);
  if (pp > 1) o << fmt::format("  bubble     {:.1f}% = (p-1)/(m+p-1), p={} m={}\n", 100 * bubble, pp, accum);
  o << "\n  memory per rank        ";
  for (auto& s : stages) o << fmt::format("{:>12}", pp > 1 ? fmt::format("stage {}", s.stage) : std::string("rank"));
  o << "\n";
  auto row = [&](const char* name, auto get) {
    o << fmt::format("  {:<22}", name);
    for (auto& s : stages) o << fmt::format("{:>12}", format_bytes(get(s)));
    o << "\n";
  };
  row("parameters", [](const StageLedger& s) { return s.parameters; });
  row("gradients", [](const StageLedger& s) { return s.gradients; });
  row("optimizer states", [](const StageLedger& s) { return s.optimizer; });
  row("activations", [](const StageLedger& s) { return s.activations; });
  row("workspace", [](const StageLedger& s) { return s.workspace; });
  row("communication", [](const StageLedger& s) { return s.communication; });
  row("total", [](const StageLedger& s) { return s.total(); });
  if (pp > 1) {
    o << fmt::format("  {:<22}", "micro-batches held");
    for (auto& s : stages) o << fmt::format("{:>12}", s.micro_in_flight);
    o << "\n";
  }
  o << fmt::format("  device memory          {:>12}  ({})\n", format_bytes(device_memory), r.hardware.device);
  const auto& w = worst_stage();
  o << fmt::format("  verdict                {} ({:.0f}% of device memory)\n", fits ? "fits" : "DOES NOT FIT",
                   100.0 * w.total() / device_memory);
  if (inference)
    o << fmt::format("\n  inference  batch {} x context {} ({} KV): KV cache {} beside weights {}; largest batch that fits: {}\n",
                     inference->batch, inference->context, inference->kv_dtype, format_bytes(inference->kv_cache),
                     format_bytes(inference->weights), inference->max_batch);
  for (auto& n : notes) o << "  note: " << n << "\n";
  for (auto& n : warnings) o << "  warning: " << n << "\n";
  if (!fits) {
    o << "  what would fit:\n";
    for (auto& s : suggestions) o << "    - " << s << "\n";
  }
  return o.str();
}

}  // namespace runner
