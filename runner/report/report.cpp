// runner report: RUN_DIR/report.html, see report.h. Every chart is inline SVG drawn here;
// the page has no script, no external reference, nothing to fetch.
#include "runner/report/report.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <cmath>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "runner/atomic_output.h"
#include "runner/errors.h"
#include "runner/report/format.h"
#include "runner/report/recipe_view.h"

namespace runner {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

std::string esc(const std::string& s) {
  std::string o;
  o.reserve(s.size());
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

double num(const json& j, const char* k, double def = NAN) {
  if (!j.is_object() || !j.contains(k) || !j[k].is_number()) return def;
  return j[k].get<double>();
}

std::string fmtv(double v) {
  if (!std::isfinite(v)) return "-";
  double a = std::fabs(v);
  if (v == std::round(v) && a < 1e9) return fmt::format("{:.0f}", v);
  if (a != 0 && (a >= 1e6 || a < 1e-3)) return fmt::format("{:.3g}", v);
  if (a >= 100) return fmt::format("{:.0f}", v);
  if (a >= 1) return fmt::format("{:.3g}", v);
  return fmt::format("{:.3f}", v);
}

const char* const kColors[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                               "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

struct Series {
  std::string name;
  std::vector<std::pair<double, double>> pts;
};

// Plot frame: 560 x 240 with margins; maps data to pixels. The axes' ends and ticks come from
// format.h (round values); a value axis widens to its outer ticks, a step axis keeps its ends.
struct Frame {
  double w = 560, h = 240, l = 60, r = 12, t = 26, b = 34;
  double x0 = 0, x1 = 1, y0 = 0, y1 = 1;
  bool logx = false, logy = false;
  report::Ticks xt, yt;
  double tx(double x) const {
    double a = logx ? std::log10(x) : x, lo = logx ? std::log10(x0) : x0, hi = logx ? std::log10(x1) : x1;
    return l + (a - lo) / (hi - lo) * (w - l - r);
  }
  double ty(double y) const {
    double a = logy ? std::log10(y) : y, lo = logy ? std::log10(y0) : y0, hi = logy ? std::log10(y1) : y1;
    return h - b - (a - lo) / (hi - lo) * (h - t - b);
  }
  // A step (or other) x axis over [lo, hi]: ticks inside it.
  void x_axis(double lo, double hi, int max_ticks, bool integer) {
    xt = report::linear_ticks(lo, hi, max_ticks, /*loose=*/false, integer);
    x0 = xt.lo, x1 = xt.hi;
  }
  // A value y axis holding [lo, hi] (and 0 when `zero`): it widens to round ticks.
  void y_axis(double lo, double hi, bool zero, bool integer = false) {
    if (zero && lo > 0) lo = 0;
    if (zero && hi <= lo) hi = lo + 1;  // all zero: 0 to 1, not a band around 0
    yt = report::linear_ticks(lo, hi, 5, /*loose=*/true, integer);
    y0 = yt.lo, y1 = yt.hi;
  }
  void log_axes(double xlo, double xhi, double ylo, double yhi) {
    logx = logy = true;
    xt = report::log_ticks(xlo, xhi), yt = report::log_ticks(ylo, yhi);
    x0 = xt.lo, x1 = xt.hi, y0 = yt.lo, y1 = yt.hi;
  }
};

std::string axes(const Frame& f, const std::string& title, const std::string& xl, const std::string& yl) {
  std::string s = fmt::format(R"(<svg class="plot" width="{}" height="{}" viewBox="0 0 {} {}" role="img">)", f.w, f.h, f.w, f.h);
  s += fmt::format(R"(<text x="{}" y="16" class="t">{}</text>)", f.l, esc(title));
  s += fmt::format(R"(<rect x="{}" y="{}" width="{}" height="{}" fill="#fff" stroke="#999"/>)", f.l, f.t, f.w - f.l - f.r,
                   f.h - f.t - f.b);
  for (double yv : f.yt.at) {
    s += fmt::format(R"(<line x1="{:.1f}" x2="{:.1f}" y1="{:.1f}" y2="{:.1f}" stroke="#eee"/>)", f.l, f.w - f.r, f.ty(yv), f.ty(yv));
    s += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="ay">{}</text>)", f.l - 4, f.ty(yv) + 4, report::tick_label(yv, f.yt.step));
  }
  for (double xv : f.xt.at)
    s += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="ax">{}</text>)", f.tx(xv), f.h - f.b + 14, report::tick_label(xv, f.xt.step));
  s += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="ax">{}</text>)", (f.l + f.w - f.r) / 2, f.h - 4, esc(xl));
  s += fmt::format(R"~(<text x="12" y="{:.1f}" class="ay" transform="rotate(-90 12 {:.1f})">{}</text>)~", (f.t + f.h - f.b) / 2,
                   (f.t + f.h - f.b) / 2, esc(yl));
  return s;
}

std::string legend(const Frame& f, const std::vector<std::string>& names) {
  std::string s;
  double x = f.l + 6;
  for (size_t i = 0; i < names.size(); ++i) {
    s += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="10" height="10" fill="{}"/><text x="{:.1f}" y="{:.1f}" class="lg">{}</text>)",
                     x, f.t + 4, kColors[i % 10], x + 13, f.t + 13, esc(names[i]));
    x += 20 + 6.2 * names[i].size();
  }
  return s;
}

struct ChartOpts {
  bool zero = false;                 // the y axis starts at 0
  double y_at_least = -INFINITY;     // and reaches at least this (100 for a percentage)
  std::vector<double> marks;         // steps drawn as dashed vertical lines (where the run was resumed)
  double x_from = INFINITY, x_to = -INFINITY;  // the steps the run trained: every curve on the same step axis
};

std::string line_chart(const std::string& title, const std::string& yl, const std::vector<Series>& ss, const ChartOpts& o = {}) {
  Frame f;
  const bool zero = o.zero;
  double xlo = o.x_from, xhi = o.x_to, ylo = INFINITY, yhi = -INFINITY;
  for (auto& s : ss)
    for (auto [x, y] : s.pts)
      if (std::isfinite(x) && std::isfinite(y)) xlo = std::min(xlo, x), xhi = std::max(xhi, x), ylo = std::min(ylo, y), yhi = std::max(yhi, y);
  if (!std::isfinite(ylo)) return "<p class=\"na\">" + esc(title) + ": no data yet</p>";
  f.x_axis(xlo, xhi > xlo ? xhi : xlo + 1, 6, /*integer=*/true);
  f.y_axis(ylo, std::max(yhi, o.y_at_least), zero);
  std::string s = axes(f, title, "step", yl);
  for (double m : o.marks)
    if (m >= f.x0 && m <= f.x1)
      s += fmt::format(R"(<line class="resume" x1="{:.1f}" x2="{:.1f}" y1="{}" y2="{}" stroke="#888" stroke-dasharray="4,3"><title>resumed from step {}</title></line>)",
                       f.tx(m), f.tx(m), f.t, f.h - f.b, fmtv(m));
  std::vector<std::string> names;
  for (size_t i = 0; i < ss.size(); ++i) {
    names.push_back(ss[i].name);
    std::string d;
    for (auto [x, y] : ss[i].pts)
      if (std::isfinite(y)) d += fmt::format("{:.1f},{:.1f} ", f.tx(x), f.ty(y));
    s += fmt::format(R"(<polyline fill="none" stroke="{}" stroke-width="1.5" points="{}"/>)", kColors[i % 10], d);
    if (ss[i].pts.size() < 40)
      for (auto [x, y] : ss[i].pts)
        if (std::isfinite(y)) s += fmt::format(R"(<circle cx="{:.1f}" cy="{:.1f}" r="2.5" fill="{}"/>)", f.tx(x), f.ty(y), kColors[i % 10]);
  }
  if (ss.size() > 1) s += legend(f, names);
  return s + "</svg>";
}

const char* const kParts[] = {"data_ms",       "forward_ms",       "backward_ms",   "optimizer_ms", "comm_exposed_ms",
                              "pipeline_idle_ms", "loss_scale_ms", "rollback_ms",   "checkpoint_ms", "other_ms"};

// Steps binned into at most 100 bars, each the mean breakdown of its steps.
std::string breakdown_chart(const std::vector<json>& steps) {
  std::vector<const json*> bs;
  for (auto& s : steps)
    if (s.contains("breakdown")) bs.push_back(&s);
  if (bs.empty()) return "<p class=\"na\">no breakdown in the step records</p>";
  const size_t nb = std::min<size_t>(100, bs.size());
  std::vector<std::array<double, 10>> bins(nb);
  std::vector<double> first(nb), last(nb);
  std::vector<int> cnt(nb);
  for (size_t i = 0; i < bs.size(); ++i) {
    size_t k = i * nb / bs.size();
    for (int p = 0; p < 10; ++p) bins[k][p] += std::max(0.0, num((*bs[i])["breakdown"], kParts[p], 0));
    double st = num(*bs[i], "step", i);
    if (!cnt[k]) first[k] = st;
    last[k] = st;
    ++cnt[k];
  }
  double ymax = 0;
  for (size_t k = 0; k < nb; ++k) {
    double t = 0;
    for (auto& v : bins[k]) v /= std::max(1, cnt[k]), t += v;
    ymax = std::max(ymax, t);
  }
  Frame f;
  f.w = 1140, f.h = 280;
  // Bars are uniform bins over the records in order: the axis reads in steps.
  f.x_axis(first[0], last[nb - 1] + 1, 10, /*integer=*/true);
  f.x0 = first[0], f.x1 = last[nb - 1] + 1;  // the bars fill the frame; the ticks lie inside it
  f.y_axis(0, ymax * 1.15 + 1e-9, true);
  std::string s = axes(f, "Step-time breakdown (ms, mean per bar)", "step (hover a bar for its numbers)", "ms");
  double bw = (f.w - f.l - f.r) / nb;
  for (size_t k = 0; k < nb; ++k) {
    double acc = 0;
    std::string tip = fmt::format("steps {}-{}", first[k], last[k]);
    for (int p = 0; p < 10; ++p) tip += fmt::format("&#10;{}: {:.2f}", kParts[p], bins[k][p]);
    s += "<g><title>" + tip + "</title>";
    for (int p = 0; p < 10; ++p) {
      if (bins[k][p] <= 0) continue;
      double y0 = f.ty(acc), y1 = f.ty(acc + bins[k][p]);
      s += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.2f}" fill="{}"/>)", f.l + k * bw + 0.5, y1,
                       std::max(0.5, bw - 1), y0 - y1, kColors[p]);
      acc += bins[k][p];
    }
    s += "</g>";
  }
  std::vector<std::string> names;
  for (auto* p : kParts) names.emplace_back(std::string(p).substr(0, std::string(p).size() - 3));
  return s + legend(f, names) + "</svg>";
}

double pct(std::vector<double> v, double q) {
  if (v.empty()) return NAN;
  std::sort(v.begin(), v.end());
  size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * v.size())) - (q > 0 ? 1 : 0));
  return v[i];
}

std::string histogram(const std::vector<double>& ms) {
  if (ms.empty()) return "<p class=\"na\">no step times yet</p>";
  double lo = *std::min_element(ms.begin(), ms.end()), hi = *std::max_element(ms.begin(), ms.end());
  if (hi <= lo) hi = lo + 1;
  const int nb = 40;
  std::vector<int> c(nb);
  for (double v : ms) c[std::min(nb - 1, static_cast<int>((v - lo) / (hi - lo) * nb))]++;
  Frame f;
  f.x_axis(lo, hi, 6, /*integer=*/false);
  f.x0 = lo, f.x1 = hi;  // the 40 bins fill the frame
  f.y_axis(0, *std::max_element(c.begin(), c.end()) * 1.1, true, /*integer=*/true);
  std::string s = axes(f, "Step-time distribution", "step time (ms)", "steps");
  for (int i = 0; i < nb; ++i) {
    double x0 = f.tx(lo + (hi - lo) * i / nb), x1 = f.tx(lo + (hi - lo) * (i + 1) / nb);
    s += fmt::format(R"(<rect x="{:.1f}" y="{:.1f}" width="{:.1f}" height="{:.1f}" fill="#1f77b4"/>)", x0, f.ty(c[i]),
                     std::max(0.5, x1 - x0 - 0.5), f.ty(0) - f.ty(c[i]));
  }
  double p50 = pct(ms, 0.5), p99 = pct(ms, 0.99);
  for (auto [v, name, col] : {std::tuple{p50, "P50", "#2ca02c"}, std::tuple{p99, "P99", "#d62728"}}) {
    s += fmt::format(R"(<line class="{}" x1="{:.1f}" x2="{:.1f}" y1="{}" y2="{}" stroke="{}" stroke-width="2" stroke-dasharray="5,3"/>)",
                     name, f.tx(v), f.tx(v), f.t, f.h - f.b, col);
    const bool right = f.tx(v) > f.w - 110;  // label left of a line near the right edge
    s += fmt::format(R"(<text x="{:.1f}" y="{}" class="lg" fill="{}" text-anchor="{}">{} {:.1f} ms</text>)", f.tx(v) + (right ? -3 : 3),
                     f.t + (name[1] == '5' ? 14 : 28), col, right ? "end" : "start", name, v);
  }
  return s + "</svg>";
}

// Horizontal grouped bars: each account, planned vs measured.
std::string memory_chart(const json& plan, const json& measured) {
  static const char* acc[] = {"parameters", "gradients", "optimizer", "activations", "communication", "workspace"};
  if (!plan.contains("stages") && measured.is_null()) return "<p class=\"na\">no plan or measurement</p>";
  std::vector<std::pair<std::string, std::pair<double, double>>> rows;
  double mx = 1;
  for (auto* a : acc) {
    double pv = 0;
    if (plan.contains("stages"))
      for (auto& st : plan["stages"]) pv = std::max(pv, num(st, (std::string(a) + "_bytes").c_str(), 0));
    double mv = NAN;
    if (measured.is_object() && measured.contains(a)) {
      auto& m = measured[a];
      mv = m.is_number() ? m.get<double>() : num(m, "measured");
    }
    rows.push_back({a, {pv, mv}});
    mx = std::max({mx, pv, std::isfinite(mv) ? mv : 0});
  }
  const double W = 560, L = 110, rowh = 30;
  const double H = 40 + rowh * rows.size();
  std::string s = fmt::format(R"(<svg class="plot" width="{}" height="{}" viewBox="0 0 {} {}" role="img">)", W, H, W, H);
  s += R"(<text x="110" y="16" class="t">Memory per account, largest stage: plan vs measured</text>)";
  s += R"(<rect x="300" y="22" width="10" height="10" fill="#aec7e8"/><text x="313" y="31" class="lg">plan</text>)"
       R"(<rect x="350" y="22" width="10" height="10" fill="#1f77b4"/><text x="363" y="31" class="lg">measured</text>)";
  for (size_t i = 0; i < rows.size(); ++i) {
    double y = 38 + rowh * i;
    auto [pv, mv] = rows[i].second;
    s += fmt::format(R"(<text x="{}" y="{:.1f}" class="ay">{}</text>)", L - 4, y + 16, rows[i].first);
    double wp = pv / mx * (W - L - 120), wm = std::isfinite(mv) ? mv / mx * (W - L - 120) : 0;
    s += fmt::format(R"(<rect x="{}" y="{:.1f}" width="{:.1f}" height="11" fill="#aec7e8"/>)", L, y + 2, wp);
    s += fmt::format(R"(<rect x="{}" y="{:.1f}" width="{:.1f}" height="11" fill="#1f77b4"/>)", L, y + 14, wm);
    s += fmt::format(R"(<text x="{:.1f}" y="{:.1f}" class="lg">{} / {}</text>)", L + std::max(wp, wm) + 4, y + 16, report::bytes_text(pv),
                     report::bytes_text(mv));
  }
  return s + "</svg>";
}

std::string roofline_chart(const json& prof) {
  double peak = num(prof["roofline"], "peak_gflops_per_s"), bw = num(prof["roofline"], "bandwidth_gb_per_s");
  if (!std::isfinite(peak) || !std::isfinite(bw) || !prof.contains("ops")) return "<p class=\"na\">no roofline in profile.json</p>";
  Frame f;
  double ilo = 0.05, ihi = 1000, glo = INFINITY;
  for (auto& o : prof["ops"]) {
    double ai = num(o, "intensity"), g = num(o, "gflops_per_s");
    if (ai > 0 && g > 0) ilo = std::min(ilo, ai / 2), ihi = std::max(ihi, ai * 2), glo = std::min(glo, g);
  }
  f.log_axes(ilo, ihi, std::min(std::isfinite(glo) ? glo / 3 : peak / 1000, bw * ilo), peak * 3);
  ilo = std::max(f.x0, f.y0 / bw), ihi = f.x1;  // the roof spans the widened axes
  std::string s = axes(f, "Roofline: operators (forward+backward+recompute)", "arithmetic intensity (FLOP/byte)", "GFLOP/s");
  double ridge = peak / bw;
  s += fmt::format(R"(<polyline class="roof" fill="none" stroke="#d62728" stroke-width="2" points="{:.1f},{:.1f} {:.1f},{:.1f} {:.1f},{:.1f}"/>)",
                   f.tx(ilo), f.ty(bw * ilo), f.tx(ridge), f.ty(peak), f.tx(ihi), f.ty(peak));
  int i = 0;
  for (auto& o : prof["ops"]) {
    double ai = num(o, "intensity"), g = num(o, "gflops_per_s");
    if (!(ai > 0 && g > 0)) continue;
    std::string op = o.value("op", "?");
    s += fmt::format(R"(<g class="op"><title>{}: {:.2f} FLOP/B, {:.2f} GFLOP/s, {:.0f}% of roof</title><circle cx="{:.1f}" cy="{:.1f}" r="5" fill="{}"/><text x="{:.1f}" y="{:.1f}" class="lg">{}</text></g>)",
                     esc(op), ai, g, 100 * num(o, "of_roof", 0), f.tx(ai), f.ty(g), kColors[i % 10], f.tx(ai) + 7, f.ty(g) + 4, esc(op));
    ++i;
  }
  return s + "</svg>";
}

std::string ops_table(const json& prof) {
  std::string s = "<table><tr><th>op</th><th>calls</th><th>ms</th><th>share</th><th>fwd ms</th><th>bwd ms</th><th>recompute ms</th>"
                  "<th>GFLOP</th><th>GFLOP/s</th><th>GB/s</th><th>FLOP/B</th><th>bound</th><th>of roof</th></tr>";
  int n = 0;
  for (auto& o : prof["ops"]) {
    if (n++ >= 15) break;
    double calls = num(o["forward"], "calls", 0) + num(o["backward"], "calls", 0) + num(o["recompute"], "calls", 0);
    s += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{:.1f}%</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.0f}%</td></tr>",
                     esc(o.value("op", "?")), fmtv(calls), fmtv(num(o, "ms")), 100 * num(o, "share", 0), fmtv(num(o["forward"], "ms")),
                     fmtv(num(o["backward"], "ms")), fmtv(num(o["recompute"], "ms")), fmtv(num(o, "flops") / 1e9),
                     fmtv(num(o, "gflops_per_s")), fmtv(num(o, "gb_per_s")), fmtv(num(o, "intensity")),
                     esc(o.value("bound", "")), 100 * num(o, "of_roof", 0));
  }
  return s + "</table>";
}

std::string kv_table(const report::Rows& rows) {
  std::string s = "<table class=\"kv\">";
  for (const auto& [k, v] : rows) s += "<tr><th>" + esc(k) + "</th><td>" + esc(v) + "</td></tr>";
  return s + "</table>";
}

std::string per_rank_table(const json& rows) {
  std::string s = "<table><tr><th>rank</th><th>stage</th>";
  for (auto* p : kParts) s += "<th>" + std::string(p).substr(0, std::string(p).size() - 3) + "</th>";  // the caption says ms
  s += "</tr>";
  for (auto& r : rows) {
    s += fmt::format("<tr><td>{}</td><td>{}</td>", fmtv(num(r, "rank")), fmtv(num(r, "stage")));
    for (auto* p : kParts) s += "<td>" + fmtv(num(r, p)) + "</td>";
    s += "</tr>";
  }
  return s + "</table>";
}

const char* kStyle = R"(body{font-family:sans-serif;margin:16px;color:#222;background:#fafafa}
h1{font-size:22px}h2{font-size:17px;border-bottom:1px solid #ccc;margin-top:26px}
.grid{display:flex;flex-wrap:wrap;gap:12px}.plot{background:#fff;border:1px solid #ddd}
.t{font-size:13px;font-weight:bold}.ax{font-size:10px;text-anchor:middle}.ay{font-size:10px;text-anchor:end}.lg{font-size:10px}
table{border-collapse:collapse;font-size:12px;background:#fff}td,th{border:1px solid #ddd;padding:2px 6px;text-align:right}
th{background:#eee}td:first-child{text-align:left}.kv th,.kv td,.history td{text-align:left}.note{font-size:12px;color:#555}
pre{background:#fff;border:1px solid #ddd;padding:8px;font-size:11px;max-height:480px;overflow:auto}
.alert{color:#a00}.na{color:#888;font-style:italic}.status{padding:6px;background:#ffe;border:1px solid #cc9;display:inline-block})";


// What a run directory holds, read once: every metrics.jsonl record by kind, the plan, the
// profile and the recipe (a missing or unreadable optional file is left empty).
struct RunFiles {
  std::vector<json> steps, evals, monitors, alerts, events;
  json summary, plan, prof;
  std::string recipe_text;
  report::RecipeView recipe;  // recipe_text without what does not apply to the run
  std::vector<std::string> rank_profiles;
};

RunFiles read_run_files(const fs::path& run_dir, ReportInfo& info) {
  const fs::path mpath = run_dir / "metrics.jsonl";
  if (!fs::is_directory(run_dir))
    throw UserError({run_dir.string()}, "not a directory", "give the run directory a `runner train` wrote (e.g. runs/quickstart)");
  if (!fs::exists(mpath))
    throw UserError({mpath.string()}, "no metrics.jsonl: this is not a run directory, or the run has not started a step",
                    "give the run directory a `runner train` wrote (e.g. runs/quickstart)");
  RunFiles f;
  std::ifstream in(mpath);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      ++info.skipped_lines;
      continue;
    }
    if (j.contains("summary")) f.summary = j;
    else if (j.contains("alert")) f.alerts.push_back(j);
    else if (j.contains("monitor")) f.monitors.push_back(j);
    else if (j.contains("eval")) f.evals.push_back(j);
    else if (j.contains("step") && j.contains("step_ms")) f.steps.push_back(j);
  }
  if (f.steps.empty())
    throw UserError({mpath.string()}, "no step record yet", "wait for the run's first step, or give a run directory that trained");
  info.steps = static_cast<int>(f.steps.size());
  info.finished = !f.summary.is_null();
  if (std::ifstream ev(run_dir / "events.jsonl"); ev)
    for (std::string line; std::getline(ev, line);) {
      json j = json::parse(line, nullptr, false);
      if (!j.is_discarded() && j.is_object()) f.events.push_back(std::move(j));
    }
  // The summary's wall time is its own job's: beside it, every job's of the run.
  if (f.summary.is_object()) {
    const report::JobsWall w = report::jobs_wall(f.events, f.steps);
    if (w.jobs > 1) {
      f.summary["jobs"] = w.jobs;
      f.summary["all_jobs_wall_s"] = w.wall_s;
    }
  }
  f.recipe_text = fs::exists(run_dir / "recipe.yaml") ? slurp(run_dir / "recipe.yaml") : "";
  if (!f.recipe_text.empty()) f.recipe = report::recipe_view(f.recipe_text);
  if (fs::exists(run_dir / "plan.json")) f.plan = json::parse(slurp(run_dir / "plan.json"), nullptr, false);
  if (f.plan.is_discarded()) f.plan = json();
  if (fs::exists(run_dir / "profile.json")) f.prof = json::parse(slurp(run_dir / "profile.json"), nullptr, false);
  if (f.prof.is_discarded()) f.prof = json();
  info.profiled = f.prof.is_object() && f.prof.contains("ops");
  for (auto& e : fs::directory_iterator(run_dir)) {
    std::string n = e.path().filename().string();
    if (n.rfind("profile.rank", 0) == 0) f.rank_profiles.push_back(n);
  }
  std::sort(f.rank_profiles.begin(), f.rank_profiles.end());
  return f;
}

// `scale` 100: a fraction drawn in percent.
Series series(const std::vector<json>& recs, const char* key, const std::string& name, double scale = 1) {
  Series s{name, {}};
  for (auto& r : recs)
    if (r.contains(key) && r[key].is_number()) s.pts.push_back({num(r, "step"), scale * r[key].get<double>()});
  return s;
}

// The page's head, the status line and the summary (or latest monitor) table.
std::string head_section(const RunFiles& f, const ReportInfo& info, const std::string& name) {
  std::string h = "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>runner report: " + esc(name) +
                  "</title><style>" + kStyle + "</style></head><body>\n";
  h += "<h1>runner report: " + esc(name) + "</h1>\n";
  const json& last = f.steps.back();
  h += fmt::format("<p class=\"status\">{} &middot; {} step records, last step {} &middot; {}{}</p>\n",
                   info.finished ? "finished" : "in progress (no summary record yet)", f.steps.size(), fmtv(num(last, "step")),
                   f.plan.contains("grid") ? "layout " + esc(report::layout_text(f.plan["grid"])) : std::string("layout unknown"),
                   info.skipped_lines ? fmt::format(" &middot; {} unreadable line(s) skipped", info.skipped_lines) : "");
  if (info.finished) h += kv_table(report::summary_rows(f.summary, f.plan));
  else if (!f.monitors.empty()) h += kv_table(report::monitor_rows(f.monitors.back()));
  return h;
}

// Whether the run scaled its loss (fp16 with a dynamic or static scale), so that a loss-scale
// chart means something: the recipe says so; without a readable one, the records do.
bool loss_scaled(const RunFiles& f) {
  if (f.recipe.loss_scaling) return *f.recipe.loss_scaling;
  if (f.summary.is_object() && f.summary.contains("loss_scale")) return true;
  for (const auto& s : f.steps)
    if (num(s, "loss_scale", 1) != 1) return true;
  return false;
}

// Training curves, throughput, the step-time breakdown and memory.
std::string charts_section(const RunFiles& f, const ReportInfo& info) {
  const auto& steps = f.steps;
  const auto& monitors = f.monitors;
  std::string h = "<h2>Training</h2><div class=\"grid\">\n";
  ChartOpts on_steps;  // every curve over the run's steps, so that the charts line up
  on_steps.x_from = num(steps.front(), "step", 0), on_steps.x_to = num(steps.back(), "step", 0);
  ChartOpts from_zero = on_steps;
  from_zero.zero = true;
  std::vector<Series> loss{series(steps, "loss", "train")};
  if (!f.evals.empty()) loss.push_back(series(f.evals, "val_loss", "eval"));
  ChartOpts loss_opts = on_steps;
  for (const auto& e : f.events)
    if (e.value("event", "") == "start" && num(e, "resumed_from", -1) >= 0) loss_opts.marks.push_back(num(e, "resumed_from"));
  h += line_chart(loss_opts.marks.empty() ? "Loss" : "Loss (dashed: resumed)", "loss", loss, loss_opts);
  // The addition task's evaluations score answers: the curve a reader of its console lines expects.
  Series acc = series(f.evals, "accuracy", "accuracy", 100);
  ChartOpts percent = from_zero;
  percent.y_at_least = 100;
  if (!acc.pts.empty()) h += line_chart("Held-out accuracy (addition, exact match)", "% right", {acc}, percent);
  // Text and token data: validation perplexity (exp of the held-out loss), beside the loss chart.
  Series ppl = series(f.evals, "val_ppl", "val perplexity");
  if (!ppl.pts.empty()) h += line_chart("Validation perplexity", "perplexity", {ppl}, on_steps);
  h += line_chart("Learning rate", "lr", {series(steps, "lr", "lr")}, from_zero);
  h += line_chart("Gradient norm", "norm", {series(steps, "grad_norm", "grad norm")}, from_zero);
  if (loss_scaled(f)) h += line_chart("Loss scale", "scale", {series(steps, "loss_scale", "loss scale")}, from_zero);
  h += "</div>\n<h2>Throughput</h2><div class=\"grid\">\n";
  h += line_chart("Tokens/s", "tokens/s", {series(steps, "tokens_per_s", "step"), series(monitors, "tokens_per_s", "monitor (window)")},
                  from_zero);
  h += line_chart("Step time", "ms", {series(steps, "step_ms", "step_ms")}, from_zero);
  if (!monitors.empty())
    h += line_chart("MFU and utilization", "%", {series(monitors, "mfu", "MFU", 100), series(monitors, "utilization", "utilization", 100)},
                    percent);
  std::vector<double> ms;
  for (auto& s : steps) ms.push_back(num(s, "step_ms"));
  h += histogram(ms);
  h += "</div>\n<h2>Where the time went</h2>\n" + breakdown_chart(steps);
  const json* per_rank = nullptr;
  if (info.finished && f.summary.contains("breakdown_per_rank")) per_rank = &f.summary["breakdown_per_rank"];
  else if (!monitors.empty() && monitors.back().contains("per_rank")) per_rank = &monitors.back()["per_rank"];
  if (per_rank) h += "<p>Mean breakdown per rank (ms):</p>" + per_rank_table(*per_rank);

  h += "<h2>Memory</h2>\n";
  json measured;
  if (info.finished && f.summary.contains("ledger")) measured = f.summary["ledger"];
  else if (!monitors.empty() && monitors.back().contains("peak_memory")) measured = monitors.back()["peak_memory"];
  h += memory_chart(f.plan, measured);
  return h;
}

// The jobs that made the run (events.jsonl): starts, resumes, ends and what else was recorded.
std::string history_section(const RunFiles& f) {
  std::string h = "<h2>Run history</h2>\n";
  if (f.events.empty()) return h + "<p class=\"na\">no events.jsonl</p>\n";
  h += "<table class=\"history\"><tr><th>time</th><th>what</th><th>details</th></tr>";
  for (const auto& r : report::event_rows(f.events))
    h += "<tr><td>" + esc(r.time) + "</td><td>" + esc(r.what) + "</td><td>" + esc(r.details) + "</td></tr>";
  return h + "</table>\n";
}

// The operator profile (or the run's time per operator kind) and the alerts.
std::string operators_section(const RunFiles& f, const ReportInfo& info) {
  const json& prof = f.prof;
  std::string h = "<h2>Operators</h2>\n";
  if (info.profiled) {
    h += fmt::format("<p>Profiled steps {} to {} on rank {} ({} steps, operators {:.1f} ms of {:.1f} ms).{}</p>",
                     fmtv(num(prof, "from_step")), fmtv(num(prof, "to_step")), fmtv(num(prof, "rank")), fmtv(num(prof, "steps")),
                     num(prof, "operators_ms", 0), num(prof, "steps_ms", 0),
                     f.rank_profiles.empty() ? "" : " Per rank: " + esc(fmt::format("{}", fmt::join(f.rank_profiles, ", "))) + ".");
    h += "<div class=\"grid\">" + roofline_chart(prof) + "</div>" + ops_table(prof);
  } else if (info.finished && f.summary.contains("top_ops")) {
    h += "<p>No profile.json (train with <code>--profile FROM:TO</code> for FLOPs and the roofline); time per operator kind over the run:</p><table><tr><th>op</th><th>calls</th><th>forward ms</th><th>backward ms</th><th>recompute ms</th></tr>";
    for (auto& o : f.summary["top_ops"])
      h += fmt::format("<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", esc(o.value("op", "?")), fmtv(num(o, "calls")),
                       fmtv(num(o, "forward_ms")), fmtv(num(o, "backward_ms")), fmtv(num(o, "recompute_ms")));
    h += "</table>";
  } else {
    h += "<p class=\"na\">no operator profile (train with --profile FROM:TO)</p>";
  }

  h += history_section(f);
  h += "<h2>Alerts</h2>\n";
  if (f.alerts.empty()) h += "<p>No alert fired.</p>";
  else {
    h += "<table><tr><th>alert</th><th>step</th><th>value</th><th>threshold</th><th>message</th><th>what to do</th></tr>";
    for (auto& a : f.alerts)
      h += fmt::format("<tr class=\"alert\"><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>", esc(a.value("alert", "")),
                       fmtv(num(a, "step")), fmtv(num(a, "value")), fmtv(num(a, "threshold")), esc(a.value("message", "")),
                       esc(a.value("action", "")));
    h += "</table>";
  }
  return h;
}

// The resolved recipe, less the fields the run does not read (named above it).
std::string recipe_section(const RunFiles& f) {
  std::string h = "<h2>Recipe (resolved)</h2>";
  if (f.recipe_text.empty()) return h + "<pre>(no recipe.yaml)</pre>\n";
  if (!f.recipe.left_out.empty()) {
    h += "<p class=\"note\">Left out here as they do not apply to this run (recipe.yaml in the run directory has every field): ";
    for (size_t i = 0; i < f.recipe.left_out.size(); ++i) h += (i ? "; " : "") + esc(f.recipe.left_out[i]);
    h += ".</p>";
  }
  return h + "<pre>" + esc(f.recipe.text) + "</pre>\n";
}

}  // namespace

ReportInfo write_report(const fs::path& run_dir) {
  ReportInfo info;
  const RunFiles f = read_run_files(run_dir, info);
  const std::string name =
      f.plan.is_object() ? f.plan.value("name", run_dir.filename().string()) : run_dir.filename().string();
  std::string h = head_section(f, info, name) + charts_section(f, info) + operators_section(f, info);
  h += recipe_section(f);
  h += "<h2>Plan</h2>";
  if (f.plan.is_null()) h += "<p class=\"na\">no plan.json</p>\n";
  else h += kv_table(report::plan_rows(f.plan)) + "<details><summary>plan.json</summary><pre>" + esc(f.plan.dump(2)) + "</pre></details>\n";
  h += "</body></html>\n";

  info.path = run_dir / "report.html";
  // Replaced whole (the report is regenerated on every call): a failed write keeps the last one.
  StagedFile(info.path.string(), true, "report").commit(h);
  return info;
}

}  // namespace runner
