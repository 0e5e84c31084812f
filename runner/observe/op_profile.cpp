// Medium-depth profiling (see op_profile.h).
#include "runner/observe/op_profile.h"

#include <algorithm>
#include <map>

#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include "runner/errors.h"
#include "runner/plan/plan_internal.h"

namespace runner {

ProfileWindow parse_profile(const std::string& spec, int64_t steps, const SourceLoc& where, const std::string& what) {
  ProfileWindow w;
  if (spec.empty()) return w;
  auto bad = [&](const std::string& why) {
    return UserError(where, fmt::format("{} '{}': {}", what, spec, why),
                     fmt::format("give the steps to profile as FROM:TO (e.g. 20:30) or one step, within 1..{}", steps));
  };
  auto number = [&](const std::string& s) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos) throw bad("not a step number: '" + s + "'");
    return std::stoll(s);
  };
  const size_t colon = spec.find(':');
  w.from = number(spec.substr(0, colon));
  w.to = colon == std::string::npos ? w.from : number(spec.substr(colon + 1));
  if (w.from < 1 || w.to < w.from) throw bad("FROM must be at least 1 and TO at least FROM");
  if (w.to > steps) throw bad(fmt::format("the run has {} steps", steps));
  return w;
}

std::vector<OpFigures> op_figures(const std::vector<const ops::Graph*>& graphs, int64_t micro_passes,
                                  const std::vector<ops::OpProfile>& measured) {
  std::map<std::string, OpFigures> by;
  const double m = static_cast<double>(micro_passes);
  for (const ops::Graph* g : graphs)
    for (const ops::Node& n : g->nodes) {
      OpFigures& f = by[ops::op_name(n.kind)];
      const double fl = plan_detail::node_flops(*g, n);
      double io = 0;
      for (int x : n.in) io += static_cast<double>(g->tensors[static_cast<size_t>(x)].nbytes());
      for (int x : n.out) io += static_cast<double>(g->tensors[static_cast<size_t>(x)].nbytes());
      const bool matmul = n.kind == ops::OpKind::Linear || n.kind == ops::OpKind::LinearGelu ||
                          n.kind == ops::OpKind::Attention;
      f.forward.flops += fl * m;
      f.forward.bytes += io * m;
      f.backward.flops += (matmul ? 2.0 : 1.0) * fl * m;
      f.backward.bytes += 2.0 * io * m;
      if (n.recompute) {
        f.recompute.flops += fl * m;
        f.recompute.bytes += io * m;
      }
    }
  std::vector<OpFigures> out;
  for (const ops::OpProfile& p : measured) {
    auto it = by.find(p.name);
    OpFigures f = it != by.end() ? it->second : OpFigures{};
    f.op = p.name;
    f.forward.ms = p.forward_ms;
    f.backward.ms = p.backward_ms;
    f.recompute.ms = p.recompute_ms;
    f.forward.calls = p.calls;  // the executor counts forward calls; every forward has its backward
    f.backward.calls = p.calls;
    f.recompute.calls = p.recompute_ms > 0 || f.recompute.flops > 0 ? p.calls : 0;
    if (f.recompute.calls == 0) f.recompute.flops = f.recompute.bytes = 0;
    out.push_back(f);
  }
  std::sort(out.begin(), out.end(), [](const OpFigures& a, const OpFigures& b) { return a.ms() > b.ms(); });
  return out;
}

nlohmann::json profile_json(const std::vector<OpFigures>& ops, const ProfileWindow& w, double steps_ms, const Roofline& roof,
                            spdlog::logger* log) {
  auto pass = [](const OpPassFigures& p) {
    return nlohmann::json{{"calls", p.calls}, {"ms", p.ms}, {"flops", p.flops}, {"bytes", p.bytes},
                          {"gflops_per_s", p.ms > 0 ? p.flops / (p.ms / 1e3) / 1e9 : 0.0},
                          {"gb_per_s", p.ms > 0 ? p.bytes / (p.ms / 1e3) / 1e9 : 0.0}};
  };
  double op_ms = 0;
  for (const OpFigures& f : ops) op_ms += f.ms();
  nlohmann::json arr = nlohmann::json::array();
  for (const OpFigures& f : ops) {
    const double intensity = f.bytes() > 0 ? f.flops() / f.bytes() : 0;
    const double achieved = f.ms() > 0 ? f.flops() / (f.ms() / 1e3) : 0;
    const double r = roof.roof(intensity);
    arr.push_back({{"op", f.op},
                   {"intensity", intensity},
                   {"bound", intensity >= roof.ridge() ? "compute" : "memory"},
                   {"roof_gflops_per_s", r / 1e9},
                   {"of_roof", r > 0 ? achieved / r : 0.0},
                   {"ms", f.ms()},
                   {"share", steps_ms > 0 ? f.ms() / steps_ms : 0.0},
                   {"flops", f.flops()},
                   {"bytes", f.bytes()},
                   {"gflops_per_s", f.ms() > 0 ? f.flops() / (f.ms() / 1e3) / 1e9 : 0.0},
                   {"gb_per_s", f.ms() > 0 ? f.bytes() / (f.ms() / 1e3) / 1e9 : 0.0},
                   {"forward", pass(f.forward)},
                   {"backward", pass(f.backward)},
                   {"recompute", pass(f.recompute)}});
  }
  if (log) {
    log->info("roofline: sgemm peak {:.1f} GFLOP/s, memory {:.1f} GB/s, ridge {:.1f} FLOP/byte", roof.peak_flops / 1e9,
              roof.bandwidth / 1e9, roof.ridge());
    log->info("profile of steps {}..{} ({:.0f} ms in those steps, {:.0f} ms in operators)", w.from, w.to, steps_ms, op_ms);
    log->info("  {:<13} {:>9} {:>9} {:>9} {:>7} {:>10} {:>9} {:>9} {:>8} {:>8}", "operator", "fwd ms", "bwd ms", "recomp ms",
              "share", "GFLOP", "GFLOP/s", "GB/s", "bound", "of roof");
    for (size_t i = 0; i < std::min<size_t>(10, ops.size()); ++i) {
      const OpFigures& f = ops[i];
      const double intensity = f.bytes() > 0 ? f.flops() / f.bytes() : 0;
      const double achieved = f.ms() > 0 ? f.flops() / (f.ms() / 1e3) : 0;
      const double r = roof.roof(intensity);
      log->info("  {:<13} {:>9.1f} {:>9.1f} {:>9.1f} {:>6.1f}% {:>10.3f} {:>9.1f} {:>9.2f} {:>8} {:>7.0f}%", f.op, f.forward.ms,
                f.backward.ms, f.recompute.ms, steps_ms > 0 ? 100 * f.ms() / steps_ms : 0.0, f.flops() / 1e9, achieved / 1e9,
                f.ms() > 0 ? f.bytes() / (f.ms() / 1e3) / 1e9 : 0.0, intensity >= roof.ridge() ? "compute" : "memory",
                r > 0 ? 100 * achieved / r : 0.0);
    }
  }
  return {{"roofline", {{"peak_gflops_per_s", roof.peak_flops / 1e9}, {"bandwidth_gb_per_s", roof.bandwidth / 1e9},
                        {"ridge_flops_per_byte", roof.ridge()}}},
          {"from_step", w.from}, {"to_step", w.to}, {"steps", w.to - w.from + 1}, {"steps_ms", steps_ms},
          {"operators_ms", op_ms}, {"ops", arr}};
}

namespace {
// The track of a synchronous span, by category.
int track_of(const ops::TraceSpan& s) {
  const std::string c = s.cat;
  if (c == "comm" || c == "p2p") return 4;
  if (c == "pipeline" || c == "pass") return 3;
  return 2;
}
}  // namespace

nlohmann::json trace_json(const std::vector<TraceStep>& steps, int rank, const std::string& grid_name, int64_t origin_ns) {
  nlohmann::json ev = nlohmann::json::array();
  auto us = [&](int64_t ns) { return static_cast<double>(ns - origin_ns) / 1e3; };
  auto dur = [](int64_t a, int64_t b) { return static_cast<double>(b - a) / 1e3; };
  ev.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", rank}, {"args", {{"name", fmt::format("rank {} ({})", rank, grid_name)}}}});
  ev.push_back({{"ph", "M"}, {"name", "process_sort_index"}, {"pid", rank}, {"args", {{"sort_index", rank}}}});
  const char* tracks[] = {"steps", "operators", "step phases", "pipeline", "communication (blocking)"};
  for (int t = 0; t < 5; ++t)
    ev.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", rank}, {"tid", t}, {"args", {{"name", tracks[t]}}}});
  int64_t async_id = 0;
  for (const TraceStep& s : steps) {
    ev.push_back({{"ph", "X"}, {"name", fmt::format("step {}", s.step)}, {"cat", "step"}, {"pid", rank}, {"tid", 0},
                  {"ts", us(s.t0_ns)}, {"dur", dur(s.t0_ns, s.t1_ns)}, {"args", {{"step", s.step}}}});
    for (const ops::TraceEvent& e : s.ops) {
      const ops::Node& n = e.graph->nodes[e.node];
      const char* pass = e.pass == 'f' ? "forward" : e.pass == 'b' ? "backward" : "recompute";
      ev.push_back({{"ph", "X"}, {"name", n.name}, {"cat", pass}, {"pid", rank}, {"tid", 1}, {"ts", us(e.t0_ns)},
                    {"dur", dur(e.t0_ns, e.t1_ns)},
                    {"args", {{"op", ops::op_name(n.kind)}, {"pass", pass}, {"step", s.step}, {"node", e.node}}}});
    }
    for (const ops::TraceSpan& sp : s.spans) {
      const std::string cat = sp.cat;
      const bool comm = cat == "comm" || cat == "p2p";
      nlohmann::json args = {{"step", s.step}};
      std::string name = sp.name;
      if (comm) {
        args["op"] = sp.name;
        args["group"] = sp.group;
        args["bytes"] = sp.bytes;
        name += std::string(" ") + sp.group;
        if (cat == "p2p") {
          args["peer"] = sp.peer;
          args["tag"] = sp.tag;
          name += (sp.name == "send" || sp.name == "isend" ? " to " : " from ") + std::to_string(sp.peer);
        }
      } else {
        if (sp.peer >= 0) args["peer"] = sp.peer;
        if (*sp.group) args["group"] = sp.group;
        if (sp.bytes >= 0) args["bytes"] = sp.bytes;
      }
      if (sp.micro >= 0) args["micro"] = sp.micro;
      if (sp.async) {
        const double total = dur(sp.t0_ns, sp.t1_ns) / 1e3;
        const double exposed = static_cast<double>(sp.wait_ns) / 1e6;
        args["exposed_ms"] = exposed;
        args["hidden_ms"] = std::max(0.0, total - exposed);
        const int64_t id = static_cast<int64_t>(rank) * 100000000 + async_id++;  // unique across the merged ranks
        ev.push_back({{"ph", "b"}, {"name", name}, {"cat", cat}, {"id", id}, {"pid", rank}, {"tid", 4},
                      {"ts", us(sp.t0_ns)}, {"args", args}});
        ev.push_back({{"ph", "e"}, {"name", name}, {"cat", cat}, {"id", id}, {"pid", rank}, {"tid", 4},
                      {"ts", us(sp.t1_ns)}});
      } else {
        ev.push_back({{"ph", "X"}, {"name", name}, {"cat", cat}, {"pid", rank}, {"tid", track_of(sp)}, {"ts", us(sp.t0_ns)},
                      {"dur", dur(sp.t0_ns, sp.t1_ns)}, {"args", args}});
      }
    }
  }
  return {{"traceEvents", ev}, {"displayTimeUnit", "ms"}};
}

nlohmann::json comm_calls_json(const std::vector<TraceStep>& steps) {
  nlohmann::json per = nlohmann::json::array();
  for (const TraceStep& s : steps) per.push_back({{"step", s.step}, {"calls", s.calls}});
  return {{"per_step", per}};
}

}  // namespace runner
