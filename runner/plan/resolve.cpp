// Plan resolution: the grid, the batch equation (global = micro x dp x accum) and the layout
// rules (divisibility by tp, the stage split over pp, the pipeline schedule). Every problem a
// user can fix is a UserError at the recipe field's file:line:col, with the numbers and a fix;
// the independent ones are reported together.
#include <cmath>
#include <algorithm>
#include <cstdlib>
#include <vector>

#include <fmt/format.h>

#include "runner/device/devices.h"
#include "runner/plan/plan_internal.h"

namespace runner::plan_detail {

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
std::vector<int64_t> nearest_divisors(int64_t n, int64_t x, int count) {
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

void resolve_grid(const Recipe& r, int64_t world_size, Plan& p) {
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
  if (world_size == 0 && !device_kind(r.hardware).host && p.world > devices)
    p.warnings.push_back(fmt::format("the layout needs {} devices but hardware lists {}", p.world, devices));
}

// global = known x dp x other: derives `other` from global and the `known` factor, or says
// which values of the known factor (or of global) would divide.
namespace {

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

}  // namespace

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
  } else if (!m && r.locs.count("batch.micro")) {
    // `micro: 0` (derive it) with no global: global = micro x dp x accum has two unknowns, no
    // one answer. (A recipe that leaves micro out altogether takes the default, micro 1.)
    throw UserError(r.loc("batch.micro"),  // batch.micro, else the batch section, else the file
                    fmt::format("the batch is under-determined: neither batch.global nor batch.micro is set (micro {} "
                                "means derive it), and global = micro x dp {} x accum {} has two unknowns",
                                b.micro, dp, a ? std::to_string(a) : std::string("(derived)")),
                    fmt::format("set batch.micro (sequences per micro-batch, e.g. micro: 8), or batch.global (e.g. "
                                "global: {}; micro is derived), or both with accum left out",
                                8 * dp * std::max<int64_t>(a, 1)));
  } else {
    if (!a) { a = 1; p.derived.push_back("accum"); }
    g = m * dp * a;
    p.derived.push_back("global");
  }
  // The plan replays every micro-batch of a step along its schedule; a step of more than this
  // many is not a training job (found by the soak: accum 817885513917 planned for minutes).
  constexpr int64_t kMaxAccum = 1 << 16;
  if (a > kMaxAccum)
    throw UserError(r.loc(b.accum ? "batch.accum" : "batch.global"),
                    fmt::format("{} micro-batches per step (accum) is more than a plan replays ({} at most)", a, kMaxAccum),
                    fmt::format("raise batch.micro or lower batch.global so that accum = global / (micro x dp) <= {}",
                                kMaxAccum));
  p.global = g;
  p.micro = m;
  p.accum = a;
}

namespace {

// Tensor parallelism: heads, the MLP width and (with sequence parallelism) seq_len divide by
// tp; the vocabulary is padded to a multiple of it. Key-value heads split over tp when it
// divides them and are replicated otherwise (runner/model/gpt.h, kv_replicated).
void check_tensor_parallel(const Recipe& r, Plan& p) {
  const ModelConfig& m = r.model;
  const int64_t tp = p.tp;
  if (m.n_heads % tp != 0)
    throw UserError(r.loc("parallel.tp"), fmt::format("model.n_heads {} is not divisible by parallel.tp {}", m.n_heads, tp),
                    "choose tp among " + or_list(nearest_divisors(m.n_heads, tp, 3)));
  if (kv_replicated(m, tp))
    p.notes.push_back(fmt::format("{} key-value heads do not split over tp {}: every tensor-parallel rank holds all of them "
                                  "(replicated, as Megatron-LM does; their gradients are summed over tp)",
                                  m.kv_heads(), tp));
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
}

// The layers over the pipeline stages: an explicit split, or an even one.
void check_stage_split(const Recipe& r, Plan& p) {
  const ModelConfig& m = r.model;
  const int64_t pp = p.pp;
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
}

// The pipeline schedule: enough micro-batches, the interleaved chunks, the bubble.
void check_schedule(const Recipe& r, Plan& p) {
  const int64_t pp = p.pp;
  if (pp > 1 && p.accum < pp)
    throw UserError(r.loc("batch"),
                    fmt::format("a {}-stage pipeline needs at least {} micro-batches per step, got accum {}", pp, pp, p.accum),
                    fmt::format("raise batch.accum to >= {} (or global to >= {})", pp, p.micro * p.dp * pp));
  if (r.parallel.schedule == PipelineSchedule::interleaved && pp > 1) {
    int64_t v = r.parallel.virtual_stages;
    for (auto layers : p.stage_layers)
      if (layers % v != 0)
        throw UserError(r.loc("parallel.virtual_stages"),
                        fmt::format("interleaved schedule: each stage's {} layers must split into {} chunks", layers, v),
                        "choose virtual_stages dividing the layers per stage");
  }
  int64_t v = (r.parallel.schedule == PipelineSchedule::interleaved) ? std::max<int64_t>(1, r.parallel.virtual_stages) : 1;
  p.chunks = pp > 1 ? v : 1;
  if (p.chunks > 1 && p.accum % pp != 0)
    throw UserError(r.loc("batch"),
                    fmt::format("the interleaved schedule sends micro-batches through the stages in groups of pp = {}: "
                                "accum {} is not a multiple of {}", pp, p.accum, pp),
                    fmt::format("set batch.accum to a multiple of {} (e.g. {})", pp, (p.accum + pp - 1) / pp * pp));
  p.bubble = pp > 1 ? static_cast<double>(pp - 1) / static_cast<double>(v * p.accum + pp - 1) : 0.0;
  if (p.bubble > 0.25)
    p.warnings.push_back(fmt::format("pipeline bubble {:.0f}% = {}: raise accum to shrink it", 100 * p.bubble,
                                     p.bubble_formula(" with ")));
}

// Warnings and notes on a layout that is valid but may not be what the user meant.
void layout_notes(const Recipe& r, Plan& p) {
  const int64_t tp = p.tp;
  if (tp > r.hardware.devices_per_node && !device_kind(r.hardware).host)
    p.warnings.push_back(fmt::format("tp {} spans more than one node ({} devices per node): tensor parallelism across nodes is slow",
                                     tp, r.hardware.devices_per_node));
  if (r.parallel.zero >= 1 && p.dp == 1)
    p.notes.push_back(fmt::format("ZeRO-{} with dp 1 shards nothing", r.parallel.zero));
  // 16-bit gradient accumulation: every addition into the buffer rounds the running sum.
  const PrecisionConfig& pr = r.precision;
  if (pr.compute == FloatFormat::fp32 && pr.grad_accum != FloatFormat::fp32)
    p.notes.push_back(fmt::format("precision.grad_accum {} has no effect with compute fp32 (gradients stay fp32)",
                                  to_string(pr.grad_accum)));
  if (pr.compute != FloatFormat::fp32 && pr.grad_accum != FloatFormat::fp32) {
    const int64_t adds = p.accum;
    const double u = pr.grad_accum == FloatFormat::bf16 ? std::ldexp(1.0, -9) : std::ldexp(1.0, -12);
    p.warnings.push_back(fmt::format(
        "precision.grad_accum {}: each of the {} micro-batch additions per step rounds the running gradient sum to "
        "{} bits of mantissa (relative error ~{:.1e} x sqrt({}) = {:.1e}, against ~1e-7 in fp32), and small late "
        "contributions are lost; the drift grows with accum. Keep fp32 (the default) unless the gradient memory is "
        "what does not fit{}",
        to_string(pr.grad_accum), adds, pr.grad_accum == FloatFormat::bf16 ? 8 : 11, u, adds, u * std::sqrt(static_cast<double>(adds)),
        pr.grad_accum == FloatFormat::fp16 ? "; an fp16 sum of loss-scaled gradients also overflows sooner than any one micro-batch's gradient" : ""));
  }
}

}  // namespace

void resolve_and_check(const Recipe& r, Plan& p) {
  // Every independent problem in one pass, so a user fixes them all at once: the batch equation, tensor parallelism
  // and the stage split do not depend on each other; the schedule needs the batch's accum and
  // the split, so it is judged only when both resolved.
  std::vector<UserError::Entry> problems;
  const auto collect = [&](auto&& check) {
    try {
      check();
      return true;
    } catch (const UserError& e) {
      for (UserError::Entry& x : e.all()) problems.push_back(std::move(x));
      return false;
    }
  };
  const bool batch = collect([&] { resolve_batch(r, p); });
  collect([&] { check_tensor_parallel(r, p); });
  const bool split = collect([&] { check_stage_split(r, p); });
  if (batch && split) collect([&] { check_schedule(r, p); });
  if (!problems.empty()) throw UserError(std::move(problems));
  layout_notes(r, p);
}

}  // namespace runner::plan_detail
