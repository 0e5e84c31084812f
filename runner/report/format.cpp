// The report's ticks and figures, see format.h. Ticks are integer multiples of a decimal step
// computed as i * m / 10^k (not by adding steps), so 0.1 + 0.2 never shows as 0.30000000000000004.
#include "runner/report/format.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <ctime>
#include <iomanip>
#include <optional>
#include <sstream>

#include <fmt/format.h>

namespace runner::report {

namespace {

using nlohmann::json;

// i x m x 10^e with the decimal rounding of the written number.
double decimal(long long i, int m, int e) {
  const double v = static_cast<double>(i) * m;
  return e >= 0 ? v * std::pow(10.0, e) : v / std::pow(10.0, -e);
}

double num(const json& j, const char* k, double def = NAN) {
  if (!j.is_object() || !j.contains(k) || !j[k].is_number()) return def;
  return j[k].get<double>();
}

// A figure of no known unit: integers whole, others to 3 significant digits.
std::string plain(double v) {
  if (!std::isfinite(v)) return "-";
  if ((v == std::round(v) || std::fabs(v) >= 1000) && std::fabs(v) < 1e15) return count_text(v);
  return fmt::format("{:.3g}", v);
}

// Any JSON value as text: objects and arrays as "key value, key value", never braces.
std::string any_text(const json& v) {
  if (v.is_number()) return plain(v.get<double>());
  if (v.is_string()) return v.get<std::string>();
  if (v.is_boolean()) return v.get<bool>() ? "yes" : "no";
  if (v.is_null()) return "-";
  std::string s;
  if (v.is_array()) {
    for (const auto& e : v) s += (s.empty() ? "" : ", ") + any_text(e);
    return s.empty() ? "none" : s;
  }
  for (const auto& [k, e] : v.items()) s += (s.empty() ? "" : ", ") + k + " " + any_text(e);
  return s.empty() ? "-" : s;
}

// SI prefix of `v` to 3 significant digits: 63088 -> "63.1k", 1.49e11 FLOP/s -> "149 GFLOP/s".
// A value that rounds up to 1000 of a prefix takes the next one (999.7k -> 1M, not 1e+03k).
std::string si(double v, const char* unit) {
  static const std::pair<double, const char*> kPrefix[] = {{1e15, "P"}, {1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  const char* sep = *unit ? " " : "";
  for (auto [f, p] : kPrefix)
    if (std::fabs(v) >= f * 0.9995) return fmt::format("{:.3g}{}{}{}", v / f, sep, p, unit);
  return fmt::format("{:.3g}{}{}", v, sep, unit);
}

std::string mfu_text(const json& s, const json& plan) {
  double mfu = num(s, "mfu");
  const double peak = num(s, "peak_flops"), fpt = num(plan, "flops_per_token"), tps = num(s, "tokens_per_s");
  // As the run's last line computes it (runner/observe/metrics.cpp) when the record has none.
  if (!std::isfinite(mfu) && std::isfinite(peak) && std::isfinite(fpt) && std::isfinite(tps)) mfu = fpt * tps / std::max(1.0, peak);
  if (!std::isfinite(mfu)) return "";
  return percent_text(mfu) + (std::isfinite(peak) ? " of " + flops_text(peak) + " peak" : "");
}

std::string comm_text(const json& s) {
  const double hidden = num(s, "comm_hidden_ms", 0), exposed = num(s, "comm_exposed_ms", 0);
  if (s.contains("layout") && num(s["layout"], "dp", 1) <= 1 && hidden == 0)
    return "no data-parallel gradient exchange (dp 1)";
  return fmt::format("{} ({} hidden behind backward, {} exposed)", percent_text(num(s, "comm_hidden_fraction", 0)),
                     ms_text(hidden), ms_text(exposed));
}

std::string idle_text(const json& v) {
  if (!v.is_array()) return any_text(v);
  if (v.size() <= 1) return "no pipeline (pp 1)";
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += fmt::format("{}stage {} {}", i ? ", " : "", i, percent_text(v[i].get<double>()));
  return s;
}

std::string loss_scale_text(const json& v) {
  if (!v.is_object()) return any_text(v);
  return fmt::format("{:g} at the end, {} overflowed step(s) skipped", num(v, "final", 0), plain(num(v, "skipped_steps", 0)));
}

}  // namespace

Ticks linear_ticks(double lo, double hi, int max_intervals, bool loose, bool integer) {
  if (!std::isfinite(lo) || !std::isfinite(hi)) lo = 0, hi = 1;
  if (hi < lo) std::swap(lo, hi);
  if (hi - lo <= 1e-12 * std::max(std::fabs(lo), std::fabs(hi))) {  // one value: a band around it
    const double d = lo == 0 ? 1 : std::fabs(lo) * 0.1;
    lo -= d, hi += d;
  }
  max_intervals = std::max(1, max_intervals);
  const double raw = (hi - lo) / max_intervals;
  int e = static_cast<int>(std::floor(std::log10(raw)));
  if (integer) e = std::max(e, 0);
  for (;; ++e) {  // the smallest 1-2-5 step whose ticks fit in max_intervals
    for (int m : {1, 2, 5}) {
      const double step = decimal(1, m, e);
      if (step < raw * (1 - 1e-9)) continue;
      const double a = loose ? std::floor(lo / step + 1e-9) : std::ceil(lo / step - 1e-9);
      const double b = loose ? std::ceil(hi / step - 1e-9) : std::floor(hi / step + 1e-9);
      if (b - a > max_intervals) continue;
      Ticks t;
      t.step = step;
      for (auto i = static_cast<long long>(a); i <= static_cast<long long>(b); ++i) t.at.push_back(decimal(i, m, e));
      t.lo = loose ? t.at.front() : lo;
      t.hi = loose ? t.at.back() : hi;
      return t;
    }
  }
}

Ticks log_ticks(double lo, double hi) {
  if (!(lo > 0) || !std::isfinite(lo)) lo = 1e-3;
  if (!(hi > lo) || !std::isfinite(hi)) hi = lo * 10;
  const int a = static_cast<int>(std::floor(std::log10(lo) + 1e-9));
  int b = static_cast<int>(std::ceil(std::log10(hi) - 1e-9));
  if (b == a) ++b;
  const int every = std::max(1, static_cast<int>(std::ceil((b - a) / 6.0)));
  b = a + every * ((b - a + every - 1) / every);
  Ticks t;
  for (int e = a; e <= b; e += every) t.at.push_back(decimal(1, 1, e));
  t.lo = t.at.front(), t.hi = t.at.back(), t.step = 0;
  return t;
}

std::string tick_label(double v, double step) {
  if (step <= 0) step = std::fabs(v);  // a log axis: each tick its own step
  if (std::fabs(v) < step * 1e-6 || v == 0) return "0";
  // One prefix for the whole axis, from its step: 5k, 10k, 15k (not 5000 and 10k).
  static const std::pair<double, const char*> kPrefix[] = {{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}};
  for (auto [f, p] : kPrefix)
    if (step >= f * (1 - 1e-9)) return fmt::format("{:.0f}{}", v / f, p);
  const int e = static_cast<int>(std::floor(std::log10(step) + 1e-9));
  if (e >= 0) return fmt::format("{:.0f}", v);
  if (e >= -4) return fmt::format("{:.{}f}", v, -e);
  std::string s = fmt::format("{:g}", v);  // 2e-05 -> 2e-5
  const auto x = s.find("e-0");
  if (x != std::string::npos) s.erase(x + 2, 1);
  return s;
}

std::string count_text(double v) {
  if (!std::isfinite(v)) return "-";
  std::string d = fmt::format("{:.0f}", std::fabs(v)), s;
  for (size_t i = 0; i < d.size(); ++i) {
    if (i && (d.size() - i) % 3 == 0) s += ',';
    s += d[i];
  }
  return (v < 0 ? "-" : "") + s;
}

std::string rate_text(double v) { return std::isfinite(v) ? si(v, "") : "-"; }

std::string ms_text(double ms) {
  if (!std::isfinite(ms)) return "-";
  if (std::fabs(ms) >= 1000) return fmt::format("{:.2f} s", ms / 1000);
  if (std::fabs(ms) >= 10) return fmt::format("{:.1f} ms", ms);
  return fmt::format("{:.2f} ms", ms);
}

std::string seconds_text(double s) {
  if (!std::isfinite(s)) return "-";
  if (s < 10) return fmt::format("{:.2f} s", s);
  if (s < 60) return fmt::format("{:.0f} s", s);
  const auto t = static_cast<long long>(std::llround(s));
  if (t < 3600) return fmt::format("{} min {:02} s", t / 60, t % 60);
  return fmt::format("{} h {:02} min", t / 3600, t % 3600 / 60);
}

std::string percent_text(double f) { return std::isfinite(f) ? fmt::format("{:.1f}%", 100 * f) : "-"; }

std::string bytes_text(double b) {
  if (!std::isfinite(b)) return "-";
  const char* u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (std::fabs(b) >= 1024 && i < 4) b /= 1024, ++i;
  return i == 0 ? fmt::format("{:.0f} B", b) : fmt::format("{:.1f} {}", b, u[i]);
}

std::string flops_text(double f) { return std::isfinite(f) ? si(f, "FLOP/s") : "-"; }

std::string layout_text(const json& l) {
  if (!l.is_object()) return any_text(l);
  const double dp = num(l, "dp", 1), tp = num(l, "tp", 1), pp = num(l, "pp", 1);
  std::string s = fmt::format("dp {} x tp {} x pp {}", plain(dp), plain(tp), plain(pp));
  std::vector<std::string> more;
  const double world = num(l, "world", dp * tp * pp);
  more.push_back(world == 1 ? "1 rank" : plain(world) + " ranks");
  if (num(l, "zero", 0) > 0) more.push_back("ZeRO-" + plain(num(l, "zero")));
  if (pp > 1 && l.contains("schedule") && l["schedule"].is_string()) more.push_back(l["schedule"].get<std::string>() + " schedule");
  return s + " (" + fmt::format("{}", fmt::join(more, ", ")) + ")";
}

std::string percentiles_text(const json& ms) {
  if (!ms.is_object()) return ms.is_number() ? ms_text(ms.get<double>()) : any_text(ms);
  std::string s;
  for (const char* k : {"p50", "p90", "p99", "max"})
    if (ms.contains(k) && ms[k].is_number()) s += fmt::format("{}{} {}", s.empty() ? "" : ", ", k, ms_text(ms[k].get<double>()));
  for (const auto& [k, v] : ms.items())
    if (k != "p50" && k != "p90" && k != "p99" && k != "max" && v.is_number())
      s += fmt::format("{}{} {}", s.empty() ? "" : ", ", k, ms_text(v.get<double>()));
  return s;
}

namespace {

std::string any_wall(const json& v) { return v.is_number() ? seconds_text(v.get<double>()) : any_text(v); }

// "2026-12-03T12:00:00Z" (append_run_event's time) as Unix seconds; nullopt when it is not one.
std::optional<double> event_time(const json& e) {
  if (!e.contains("time") || !e["time"].is_string()) return std::nullopt;
  std::tm tm{};
  std::istringstream in(e["time"].get<std::string>());
  in >> std::get_time(&tm, "%Y-%m-%dT%H:%M:%SZ");
  if (in.fail()) return std::nullopt;
  return static_cast<double>(timegm(&tm));
}

}  // namespace

JobsWall jobs_wall(const std::vector<json>& events, const std::vector<json>& steps) {
  std::vector<size_t> starts;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].value("event", "") == "start") starts.push_back(i);
  JobsWall w;
  w.jobs = static_cast<int>(starts.size());
  for (size_t k = 0; k < starts.size(); ++k) {
    const size_t next = k + 1 < starts.size() ? starts[k + 1] : events.size();
    std::optional<double> t0 = event_time(events[starts[k]]), t1;
    for (size_t i = starts[k] + 1; i < next && !t1; ++i)
      if (events[i].value("event", "") == "end") t1 = event_time(events[i]);
    if (t0 && t1) {
      w.wall_s += std::max(0.0, *t1 - *t0);
      continue;
    }
    // No end record (a crash, a kill): the steps it trained and kept, up to where the next job resumed.
    const int64_t from = std::max<int64_t>(0, events[starts[k]].value("resumed_from", int64_t{0}));
    const int64_t to = k + 1 < starts.size() ? events[next].value("resumed_from", int64_t{-1}) : INT64_MAX;
    for (const json& st : steps) {
      const int64_t step = st.value("step", int64_t{0});
      if (step > from && step <= to) w.wall_s += st.value("interval_ms", st.value("step_ms", 0.0)) / 1e3;
    }
  }
  return w;
}

Rows summary_rows(const json& s, const json& plan) {
  Rows r;
  auto add = [&](const char* key, const char* label, auto&& text) {
    if (s.contains(key) && !s[key].is_null()) r.emplace_back(label, text(s[key]));
  };
  add("layout", "layout", [](const json& v) { return layout_text(v); });
  add("steps", "steps", [](const json& v) { return any_text(v); });
  add("tokens", "tokens", [](const json& v) { return v.is_number() ? count_text(v.get<double>()) : any_text(v); });
  if (s.value("jobs", 0) > 1 && s.contains("all_jobs_wall_s") && s["all_jobs_wall_s"].is_number())
    r.emplace_back("wall time", fmt::format("{} over {} jobs (the last: {})", seconds_text(s["all_jobs_wall_s"].get<double>()),
                                            s["jobs"].get<int>(), s.contains("wall_s") ? any_wall(s["wall_s"]) : "?"));
  else
    add("wall_s", "wall time", [](const json& v) { return any_wall(v); });
  add("tokens_per_s", "tokens/s", [](const json& v) { return v.is_number() ? rate_text(v.get<double>()) : any_text(v); });
  if (const std::string m = mfu_text(s, plan); !m.empty()) r.emplace_back("MFU", m);
  add("step_ms", "step time", [](const json& v) { return percentiles_text(v); });
  add("val_loss", "final val loss", [](const json& v) { return v.is_number() ? fmt::format("{:.4f}", v.get<double>()) : any_text(v); });
  add("val_ppl", "final val perplexity", [](const json& v) { return v.is_number() ? fmt::format("{:.2f}", v.get<double>()) : any_text(v); });
  add("accuracy", "accuracy", [](const json& v) { return v.is_number() ? percent_text(v.get<double>()) : any_text(v); });
  add("skipped_steps", "skipped steps", [](const json& v) { return any_text(v); });
  add("loss_scale", "fp16 loss scale", [](const json& v) { return loss_scale_text(v); });
  add("scale_conflict", "loss-scale conflict", [](const json& v) { return any_text(v); });
  if (s.contains("comm_hidden_fraction")) r.emplace_back("communication hidden", comm_text(s));
  add("pipeline_idle_fraction", "pipeline idle", [](const json& v) { return idle_text(v); });
  add("plan_bubble", "plan bubble", [](const json& v) { return v.is_number() ? percent_text(v.get<double>()) : any_text(v); });
  add("checkpoint_ms", "checkpoint time", [](const json& v) { return v.is_number() ? ms_text(v.get<double>()) : any_text(v); });
  add("alerts", "alerts", [](const json& v) { return any_text(v); });
  // Fields shown above, folded into another row, or drawn in their own section.
  static const char* const kDone[] = {"summary", "layout", "steps", "tokens", "wall_s", "all_jobs_wall_s", "jobs", "tokens_per_s", "mfu", "peak_flops",
                                      "step_ms", "val_loss", "val_ppl", "accuracy", "skipped_steps", "loss_scale", "scale_conflict",
                                      "comm_hidden_fraction", "comm_hidden_ms", "comm_exposed_ms", "pipeline_idle_fraction",
                                      "plan_bubble", "checkpoint_ms", "alerts", "ledger", "top_ops", "breakdown_per_rank"};
  for (const auto& [k, v] : s.items()) {
    if (std::find(std::begin(kDone), std::end(kDone), k) != std::end(kDone)) continue;
    std::string label = k;
    std::replace(label.begin(), label.end(), '_', ' ');
    r.emplace_back(label, any_text(v));
  }
  return r;
}

Rows plan_rows(const json& p) {
  Rows r;
  if (!p.is_object()) return r;
  if (p.contains("param_count")) r.emplace_back("parameters", count_text(num(p, "param_count")));
  if (p.contains("grid")) {
    json g = p["grid"];
    if (g.is_object() && p.contains("world")) g["world"] = p["world"];
    r.emplace_back("layout", layout_text(g));
  }
  if (p.contains("batch") && p["batch"].is_object()) {
    const json& b = p["batch"];
    const double dp = p.contains("grid") ? num(p["grid"], "dp", 1) : 1;
    r.emplace_back("batch", fmt::format("global {} = micro {} x dp {} x accum {}, {} tokens per step", plain(num(b, "global")),
                                        plain(num(b, "micro")), plain(dp), plain(num(b, "accum")), count_text(num(b, "tokens_per_step"))));
  }
  if (p.contains("flops_per_token")) r.emplace_back("FLOPs per token", si(num(p, "flops_per_token"), "FLOP"));
  if (p.contains("fits")) {
    double largest = 0;
    if (p.contains("stages") && p["stages"].is_array())
      for (const auto& st : p["stages"]) largest = std::max(largest, num(st, "total_bytes", 0));
    const bool fits = p["fits"].is_boolean() && p["fits"].get<bool>();
    r.emplace_back("fits", fmt::format("{}: largest stage {} of {} device memory", fits ? "yes" : "no", bytes_text(largest),
                                       bytes_text(num(p, "device_memory_bytes"))));
  }
  if (p.contains("grid") && num(p["grid"], "pp", 1) > 1) r.emplace_back("pipeline bubble", percent_text(num(p, "bubble")));
  for (auto [key, label] : {std::pair{"warnings", "warning"}, std::pair{"notes", "note"}, std::pair{"suggestions", "suggestion"}})
    if (p.contains(key) && p[key].is_array())
      for (const auto& v : p[key]) r.emplace_back(label, any_text(v));
  return r;
}

Rows monitor_rows(const json& m) {
  Rows r;
  if (m.contains("step")) r.emplace_back("step", any_text(m["step"]));
  if (m.contains("tokens_per_s")) r.emplace_back("tokens/s (window)", rate_text(num(m, "tokens_per_s")));
  if (m.contains("mfu")) r.emplace_back("MFU", percent_text(num(m, "mfu")));
  if (m.contains("utilization")) r.emplace_back("utilization", percent_text(num(m, "utilization")));
  if (m.contains("step_ms")) r.emplace_back("step time", percentiles_text(m["step_ms"]));
  if (m.contains("skipped_steps")) r.emplace_back("skipped steps", any_text(m["skipped_steps"]));
  if (m.contains("peak_bytes")) r.emplace_back("peak memory", bytes_text(num(m, "peak_bytes")));
  if (m.contains("device_reported") && m["device_reported"].is_object()) {  // a GPU's own figures beside the accounts
    const json& d = m["device_reported"];
    r.emplace_back("device memory (CUDA)", fmt::format("allocator in use {}, reserved {}; driver used {} of {}",
                                                       bytes_text(num(d, "pool_used")), bytes_text(num(d, "pool_reserved")),
                                                       bytes_text(num(d, "driver_used")), bytes_text(num(d, "total"))));
  }
  if (m.contains("per_rank") && m["per_rank"].is_array() && m["per_rank"].size() > 1 && m.contains("slowest_rank"))
    r.emplace_back("slowest rank", any_text(m["slowest_rank"]));
  return r;
}

namespace {

std::string time_text(const json& e) {
  std::string t = e.contains("time") && e["time"].is_string() ? e["time"].get<std::string>() : "";
  if (t.size() == 20 && t[10] == 'T' && t[19] == 'Z') t = t.substr(0, 10) + " " + t.substr(11, 8) + " UTC";
  return t;
}

EventRow start_row(const json& e) {
  const double from = num(e, "resumed_from", -1);
  EventRow r{time_text(e), from >= 0 ? "resumed from step " + plain(from) : "started", ""};
  r.details = layout_text(e);
  if (e.contains("global"))
    r.details += fmt::format(", global batch {} = micro {} x dp {} x accum {}", plain(num(e, "global")), plain(num(e, "micro")),
                             plain(num(e, "dp", 1)), plain(num(e, "accum")));
  if (e.contains("host") && e["host"].is_string()) r.details += ", host " + e["host"].get<std::string>();
  if (e.contains("notes") && e["notes"].is_array())
    for (const auto& n : e["notes"]) r.details += "; " + any_text(n);
  return r;
}

}  // namespace

std::vector<EventRow> event_rows(const std::vector<json>& events) {
  std::vector<EventRow> rows;
  bool open = false;  // a start not yet ended
  for (const json& e : events) {
    const std::string kind = e.contains("event") && e["event"].is_string() ? e["event"].get<std::string>() : "";
    if (kind == "start") {
      if (open) rows.push_back({"", "no end record", "the job above was killed or crashed; the next went on from its last checkpoint"});
      rows.push_back(start_row(e));
      open = true;
    } else if (kind == "end") {
      const std::string cause = e.contains("cause") ? any_text(e["cause"]) : "?";
      rows.push_back({time_text(e), "ended: " + cause,
                      fmt::format("step {}, exit code {}", plain(num(e, "step")), plain(num(e, "exit_code")))});
      open = false;
    } else {
      json rest = e;
      rest.erase("time");
      rest.erase("event");
      rows.push_back({time_text(e), kind.empty() ? "?" : kind, any_text(rest)});
    }
  }
  return rows;
}

}  // namespace runner::report
