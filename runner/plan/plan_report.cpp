// The plan's two reports: the human table (`runner plan`, the start-up lines of `runner train`)
// and the JSON (`runner plan --json`, the run directory's plan.json).
#include <algorithm>
#include <sstream>

#include <fmt/format.h>

#include "runner/plan/plan_internal.h"

namespace runner {

using plan_detail::join;

std::string format_bytes(double b) {
  const double gib = 1ull << 30, mib = 1ull << 20;
  if (b >= gib) return fmt::format("{:.2f} GiB", b / gib);
  if (b >= mib) return fmt::format("{:.1f} MiB", b / mib);
  return fmt::format("{:.0f} KiB", b / 1024.0);
}

namespace {

std::string format_flops(double f) {
  if (f >= 1e12) return fmt::format("{:.2f} TFLOP", f / 1e12);
  if (f >= 1e9) return fmt::format("{:.2f} GFLOP", f / 1e9);
  return fmt::format("{:.1f} MFLOP", f / 1e6);
}

// "0-3, 6, 8-9"
std::string layer_ranges(std::vector<int64_t> v) {
  std::sort(v.begin(), v.end());
  v.erase(std::unique(v.begin(), v.end()), v.end());
  std::string s;
  for (size_t i = 0; i < v.size();) {
    size_t j = i;
    while (j + 1 < v.size() && v[j + 1] == v[j] + 1) ++j;
    s += (s.empty() ? "" : ", ") + (j > i ? fmt::format("{}-{}", v[i], v[j]) : fmt::format("{}", v[i]));
    i = j + 1;
  }
  return s;
}

// recompute.mode auto: what was chosen and why, beside the rule of thumb (table() only).
void recompute_auto_lines(std::ostringstream& o, const Plan& p) {
  const RecomputeAuto& a = *p.recompute_auto;
  int64_t steps = 0;
  for (auto& s : p.recompute_auto->stages) steps += s.candidates;
  o << fmt::format("  recompute  auto: chose {} of {} steps (layer, module) by activation bytes saved per recomputed FLOP\n",
                   a.chosen.size(), steps);
  o << fmt::format("             {:<15}{:>12}{:>13}{:>11}{:>10}{:>8}   {}\n", "one layer:", "saves alone", "adds FLOPs",
                   "bytes/FLOP", "holds", ">15%", "chosen in layers (saves, adds per micro-batch)");
  for (const RecomputeModuleCost& m : a.modules) {
    std::vector<int64_t> layers;
    double saved = 0, flops = 0;
    for (const RecomputeStep& st : a.chosen)
      if (st.module == m.module) { layers.push_back(st.layer); saved += st.bytes_saved; flops += st.flops; }
    o << fmt::format("             {:<15}{:>12}{:>13}{:>11.4f}{:>9.0f}%{:>8}   {}\n", m.module, format_bytes(m.bytes_saved),
                     format_flops(m.flops), m.flops > 0 ? m.bytes_saved / m.flops : 0.0, 100 * m.share,
                     m.module == "layer" ? "" : (m.rule_of_thumb ? "yes" : "no"),
                     layers.empty() ? "-" : fmt::format("{} ({}, {})", layer_ranges(layers), format_bytes(saved), format_flops(flops)));
  }
  std::string rule;
  for (const RecomputeModuleCost& m : a.modules)
    if (m.rule_of_thumb) rule += (rule.empty() ? "" : ", ") + m.module;
  o << fmt::format("             rule of thumb (a module holding > 15% of its layer's {} would be recomputed): {}\n",
                   format_bytes(a.layer_activation_bytes), rule.empty() ? "none" : rule);
  for (const RecomputeStageChoice& s : a.stages) {
    const std::string who = p.pp > 1 ? fmt::format("stage {}", s.stage) : std::string("rank");
    if (s.before <= p.device_memory)
      o << fmt::format("             {}: {} fits {} without recompute\n", who, format_bytes(s.before), format_bytes(p.device_memory));
    else
      o << fmt::format("             {}: {} without recompute > {}; with the choice {}{}\n", who, format_bytes(s.before),
                       format_bytes(p.device_memory), format_bytes(s.after),
                       s.after <= p.device_memory ? "" : " (still too much: every step was taken)");
  }
}

// The ZeRO stage and what it divides over dp (ZeRO shards over the dp axis only: each account
// is this rank's tensor- and pipeline-parallel shard, divided by dp).
void zero_line(std::ostringstream& o, const Recipe& r, int64_t dp) {
  const int64_t z = r.parallel.zero;
  if (z == 0) return;
  const char* what = z == 1 ? "optimizer states" : z == 2 ? "gradients and optimizer states"
                                                          : "parameters, gradients and optimizer states";
  o << fmt::format("  zero       ZeRO-{}: {} divided by dp {}", z, what, dp);
  if (z == 3)
    o << (r.parallel.reshard_after_forward ? "; each layer gathered before its forward and again before its backward"
                                           : "; each layer gathered before its forward, kept until its backward");
  if (z >= 2) o << "; planned only (runner train runs zero 0 and 1)";
  o << "\n";
}

}  // namespace

std::string Plan::bubble_formula(const char* sep) const {
  if (chunks > 1) return fmt::format("(p-1)/(v*m+p-1){}p={} v={} m={}", sep, pp, chunks, accum);
  return fmt::format("(p-1)/(m+p-1){}p={} m={}", sep, pp, accum);
}

nlohmann::json Plan::to_json() const {
  using nlohmann::json;
  json j;
  j["name"] = recipe.name;
  j["world"] = world;
  j["grid"] = {{"dp", dp}, {"tp", tp}, {"pp", pp}};
  // The ZeRO stage and the accounts it divides by dp (docs/parallel.md).
  const int64_t z = recipe.parallel.zero;
  json divided = json::array();
  if (z >= 3) divided.push_back("parameters");
  if (z >= 2) divided.push_back("gradients");
  if (z >= 1) divided.push_back("optimizer");
  j["zero"] = {{"stage", z}, {"divided_by_dp", divided}, {"reshard_after_forward", recipe.parallel.reshard_after_forward}};
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
  if (recompute_auto) {
    const RecomputeAuto& a = *recompute_auto;
    json chosen = json::array(), mods = json::array(), rule = json::array(), stg = json::array(), sets = json::array();
    for (auto& c : a.chosen)
      chosen.push_back({{"stage", c.stage}, {"layer", c.layer}, {"module", c.module}, {"bytes_saved", c.bytes_saved}, {"flops", c.flops}});
    for (auto& m : a.modules) {
      mods.push_back({{"module", m.module}, {"bytes_saved_alone", m.bytes_saved}, {"flops_alone", m.flops},
                      {"bytes_per_flop", m.flops > 0 ? m.bytes_saved / m.flops : 0.0}, {"activation_bytes", m.activation_bytes},
                      {"share_of_layer", m.share}});
      if (m.rule_of_thumb) rule.push_back(m.module);
    }
    for (auto& s : a.stages)
      stg.push_back({{"stage", s.stage}, {"before_bytes", s.before}, {"after_bytes", s.after}, {"candidates", s.candidates}});
    for (auto& s : a.sets) sets.push_back(s);
    j["recompute"] = {{"mode", "auto"}, {"chosen", chosen}, {"modules", mods}, {"layer_activation_bytes", a.layer_activation_bytes},
                      {"rule_of_thumb", rule}, {"rule_of_thumb_share", 0.15}, {"stages", stg}, {"sets", sets}};
  }
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
  const std::string heads = r.model.kv_heads() == r.model.n_heads
                                ? fmt::format("{} heads", r.model.n_heads)
                                : fmt::format("{} heads ({} key-value)", r.model.n_heads, r.model.kv_heads());
  o << fmt::format("  model      gpt {:.1f}M params: {} layers, d_model {}, {}, mlp {}, vocab {}{}, seq {}\n",
                   param_count / 1e6, r.model.n_layers, r.model.d_model, heads, r.model.mlp_hidden(),
                   r.model.vocab_size, vocab_padded != r.model.vocab_size ? fmt::format(" (padded {})", vocab_padded) : "",
                   r.model.seq_len);
  o << fmt::format("  grid       world {} = dp {} x tp {} x pp {}", world, dp, tp, pp);
  if (pp > 1) o << fmt::format("  stages [{}]  schedule {}", join(stage_layers), to_string(r.parallel.schedule));
  if (r.parallel.zero) o << fmt::format("  ZeRO-{}", r.parallel.zero);
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
  o << fmt::format("  precision  {} compute, master {}, grad accum {}; recompute {}\n", to_string(r.precision.compute),
                   r.precision.compute == FloatFormat::fp32 ? "-" : to_string(r.precision.master_weights),
                   r.precision.compute == FloatFormat::fp32 ? "fp32" : to_string(r.precision.grad_accum), to_string(r.recompute.mode));
  if (recompute_auto) recompute_auto_lines(o, *this);
  zero_line(o, r, dp);
  if (pp > 1) o << fmt::format("  bubble     {:.1f}% = {}\n", 100 * bubble, bubble_formula(", "));
  o << "\n  memory per rank        ";
  for (auto& s : stages) o << fmt::format("{:>12}", pp > 1 ? fmt::format("stage {}", s.stage) : std::string("rank"));
  o << "\n";
  // A sharded account says so: "gradients /dp 8".
  const std::string per_dp = dp > 1 ? fmt::format(" /dp {}", dp) : "";
  auto sharded = [&](const char* name, int64_t stage) {
    return r.parallel.zero >= stage ? name + per_dp : std::string(name);
  };
  auto row = [&](const std::string& name, auto get) {
    o << fmt::format("  {:<22}", name);
    for (auto& s : stages) o << fmt::format("{:>12}", format_bytes(get(s)));
    o << "\n";
  };
  row(sharded("parameters", 3), [](const StageLedger& s) { return s.parameters; });
  row(sharded("gradients", 2), [](const StageLedger& s) { return s.gradients; });
  row(sharded("optimizer states", 1), [](const StageLedger& s) { return s.optimizer; });
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
