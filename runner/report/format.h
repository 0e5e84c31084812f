// The report's numbers as a reader takes them in: axis ticks on round values (1, 2 or 5 times
// a power of ten) and the summary table's figures in their units (ms, %, k tokens/s, a layout
// as "dp 2 x tp 1 x pp 1"), never a raw JSON object.
//
// Design: pure functions of numbers and JSON records, apart from the page, so that the tests
// check the rules themselves (awkward ranges, every summary field) without rendering a run.
#pragma once
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace runner::report {

// Ticks of a linear axis: `step` is 1, 2 or 5 x 10^k and every tick a multiple of it.
// `loose`: lo and hi widen to the ticks around the data (a value axis starts and ends on a
// labelled tick); else the ticks lie inside [lo, hi] (a step axis keeps the run's own ends).
// `integer`: no step below 1 (steps, counts). At most `max_intervals` intervals.
struct Ticks {
  double lo = 0, hi = 1, step = 1;
  std::vector<double> at;
};
Ticks linear_ticks(double lo, double hi, int max_intervals, bool loose, bool integer = false);
// Ticks of a log axis over [lo, hi] (both > 0): lo and hi widen to whole decades, a tick each
// decade (every second or more when they are many).
Ticks log_ticks(double lo, double hi);

// A tick's label: as few digits as the step needs ("0.0002", "2.5", "40k", "3M", "1e-7").
std::string tick_label(double v, double step);

// Figures with their units.
std::string count_text(double v);     // 30720 -> "30,720"
std::string rate_text(double v);      // 63088 -> "63.1k"
std::string ms_text(double ms);       // "6.50 ms", "51.0 ms", "1.20 s"
std::string seconds_text(double s);   // "0.64 s", "3 min 12 s", "2 h 05 min"
std::string percent_text(double f);   // 0.352 -> "35.2%"
std::string bytes_text(double b);     // "1.5 MiB"
std::string flops_text(double f);     // 1.49e11 -> "149 GFLOP/s"
// {"dp":2,"tp":1,"pp":1,...} -> "dp 2 x tp 1 x pp 1" (+ ranks, ZeRO and the schedule when they say something).
std::string layout_text(const nlohmann::json& layout);
// {"p50":6.5,"p90":10.7,...} -> "p50 6.50 ms, p90 10.7 ms, p99 ..., max ...".
std::string percentiles_text(const nlohmann::json& ms);

// The rows (label, value) of the report's summary table from a run's summary record (and
// its plan, for the MFU), or of its latest monitor record while the run is in progress. Every
// value is text in its unit; a field this table does not know is shown as plain "key value".
using Rows = std::vector<std::pair<std::string, std::string>>;
Rows summary_rows(const nlohmann::json& summary, const nlohmann::json& plan);
// The wall time of every job of a run (events.jsonl's starts, each to its end record; a job
// that crashed without one counts the steps it kept, their interval_ms), and how many jobs.
// A summary's wall_s is its own job's alone.
struct JobsWall {
  double wall_s = 0;
  int jobs = 0;
};
JobsWall jobs_wall(const std::vector<nlohmann::json>& events, const std::vector<nlohmann::json>& steps);
Rows monitor_rows(const nlohmann::json& monitor);
// The plan's figures (plan.json): parameters, layout, the batch equation, FLOPs per token,
// whether it fits, and its warnings, notes and suggestions.
Rows plan_rows(const nlohmann::json& plan);

// The run's history from events.jsonl (one record a job start or end; others by their name and
// fields): when, what ("started", "resumed from step 100", "ended: done"), the details in words.
// A start that follows a start with no end between says the job before it was killed.
struct EventRow {
  std::string time, what, details;
};
std::vector<EventRow> event_rows(const std::vector<nlohmann::json>& events);

}  // namespace runner::report
