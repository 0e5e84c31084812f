// The automatic restart policy (see restart.h): which failures are restarted, how often, after
// how long, and the records that say so.
#include "runner/run/restart.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "ops/knobs.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"
#include "runner/run/run_dir.h"
#include "runner/plan/plan.h"
#include "runner/signals.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

double mtime(const fs::path& p) {
  struct stat st{};
  return ::stat(p.c_str(), &st) == 0 ? static_cast<double>(st.st_mtime) : 0;
}

std::string signal_name(int sig) {
  static const char* names[] = {"", "SIGHUP", "SIGINT", "SIGQUIT", "SIGILL", "SIGTRAP", "SIGABRT", "SIGBUS", "SIGFPE",
                                "SIGKILL", "SIGUSR1", "SIGSEGV", "SIGUSR2", "SIGPIPE", "SIGALRM", "SIGTERM"};
  return sig > 0 && sig < 16 ? names[sig] : fmt::format("signal {}", sig);
}

int64_t index_of_last(const std::vector<nlohmann::json>& ev, const char* kind) {
  for (int64_t i = static_cast<int64_t>(ev.size()) - 1; i >= 0; --i)
    if (ev[i].value("event", "") == kind) return i;
  return -1;
}

std::string job_of(const nlohmann::json& j) {
  if (j.contains("slurm")) return j["slurm"].value("job_id", "");
  return j.value("job_id", "");
}

// The nodes of the run's last start (empty: none recorded).
std::vector<std::string> last_nodes(const RunHistory& h) {
  const int64_t s = index_of_last(h.events, "start");
  if (s < 0 || !h.events[s].contains("slurm")) return {};
  return expand_hostlist(h.events[s]["slurm"].value("node_list", ""));
}

// Failures of this Slurm job so far, the last one (null: none), and whether the run started
// again after it (a start record follows it).
struct Failures {
  int64_t restarts = 0;
  const nlohmann::json* last = nullptr;
  bool started_since = false;
};
Failures failures_of(const RunHistory& h, const std::string& job) {
  Failures f;
  for (const auto& e : h.events) {
    const std::string kind = e.value("event", "");
    if (kind == "start" && f.last) f.started_since = true;
    if (kind != "restart" && kind != "no_restart") continue;
    if (!e.value("counted", false) || job_of(e) != job) continue;
    f.last = &e;
    f.started_since = false;
    if (kind == "restart") ++f.restarts;
  }
  return f;
}

// The record of a failure, then the limit and the same-step rule: a restart or a refusal.
RestartDecision judge(const RunHistory& h, const RestartPolicy& p, const SlurmEnv& env, nlohmann::json rec,
                      const std::vector<std::string>& lost) {
  const std::vector<std::string> had = last_nodes(h);
  const Failures f = failures_of(h, env.job_id);
  const nlohmann::json* previous = f.last;
  // One failure, one decision: this attempt of the job (its restart count) was judged already
  // (the check asked twice, or both the start and the script saw it): the same answer, no
  // second record, nothing counted twice.
  if (previous && !f.started_since && previous->value("restart_count", int64_t{-1}) == env.restart_count) {
    RestartDecision d;
    d.action = previous->value("event", "") == "restart" ? RestartDecision::Action::restart : RestartDecision::Action::refuse;
    d.backoff_s = previous->value("backoff_s", 0.0);
    d.message = fmt::format("this failure was judged already ({}): {}", previous->value("event", ""),
                            previous->value("cause", "?"));
    return d;
  }
  const int64_t attempt = f.restarts + 1;
  rec["job_id"] = env.job_id;
  rec["restart_count"] = env.restart_count;
  rec["attempt"] = attempt;
  rec["max_restarts"] = p.max_restarts;
  rec["nodes"] = had;
  rec["nodes_lost"] = lost;
  rec["step"] = h.step_reached;
  rec["checkpoint"] = h.checkpoint;
  rec["counted"] = true;  // a failure: counts against the limit (a refusal for a scancel does not)
  const std::string cause = rec.value("cause", "?");
  RestartDecision d;
  std::string why;
  if (attempt > p.max_restarts) {
    why = p.max_restarts == 0 ? "train.max_restarts is 0"
                              : fmt::format("the limit of {} restart{} (train.max_restarts) is reached", p.max_restarts,
                                            p.max_restarts == 1 ? "" : "s");
    rec["reason"] = "limit";
  } else if (previous && f.started_since && previous->value("step", int64_t{-2}) == h.step_reached &&
             previous->value("checkpoint", int64_t{-2}) == h.checkpoint) {
    // Only a run that started again and failed where it failed before repeats itself: an
    // attempt whose ranks never started (the previous step's ranks still being torn down when
    // srun launched) ran no step, and counts against the limit alone.
    why = fmt::format("it failed again at step {} with no progress since the previous failure ({}): a "
                      "restart would repeat it", h.step_reached, checkpoint_phrase(h.checkpoint));
    rec["reason"] = "same step";
  }
  const std::string where = fmt::format("step {}, {}{}", h.step_reached, checkpoint_phrase(h.checkpoint),
                                        lost.empty() ? "" : fmt::format(", nodes lost: {}", fmt::join(lost, " ")));
  if (!why.empty()) {
    rec["event"] = "no_restart";
    d.action = RestartDecision::Action::refuse;
    d.message = fmt::format("no restart: {} ({}); {}. Fix the cause, then submit the script again", cause, where, why);
  } else {
    rec["event"] = "restart";
    d.action = RestartDecision::Action::restart;
    d.backoff_s = restart_backoff(p, attempt);
    rec["backoff_s"] = d.backoff_s;
    d.message = fmt::format("restart {} of {} after {:g} s: {} ({})", attempt, p.max_restarts, d.backoff_s, cause, where);
  }
  d.record = rec;
  return d;
}

// A refusal that is no failure (scancel, exit 2, numerics): recorded, not counted.
RestartDecision refuse(const RunHistory& h, const SlurmEnv& env, const std::string& cause, int code,
                       const std::string& why) {
  RestartDecision d;
  d.action = RestartDecision::Action::refuse;
  d.record = {{"event", "no_restart"}, {"cause", cause}, {"exit_code", code}, {"reason", why},
              {"job_id", env.job_id},  {"step", h.step_reached}, {"checkpoint", h.checkpoint},
              {"nodes", last_nodes(h)}, {"counted", false}};
  d.message = fmt::format("no restart: {} (exit {}, step {}); {}", cause, code, h.step_reached, why);
  return d;
}

RestartDecision note(RestartDecision::Action a, std::string message) {
  RestartDecision d;
  d.action = a;
  d.message = std::move(message);
  return d;
}

bool has(const std::vector<int>& v, int x) { return std::find(v.begin(), v.end(), x) != v.end(); }

}  // namespace

RestartPolicy restart_policy(const Recipe& r) { return {r.train.max_restarts, r.train.restart_backoff}; }

double restart_backoff(const RestartPolicy& p, int64_t attempt) {
  return p.backoff_s * std::ldexp(1.0, static_cast<int>(std::clamp<int64_t>(attempt, 1, 30) - 1));
}

RunHistory read_run_history(const std::string& run_dir, const std::string& checkpoint_dir) {
  RunHistory h;
  const fs::path dir(run_dir);
  h.events = read_jsonl(dir / "events.jsonl");
  for (const auto& j : read_jsonl(dir / "metrics.jsonl"))
    if (j.contains("step") && j.contains("loss") && j["step"].is_number_integer()) h.step_reached = j["step"].get<int64_t>();
  const std::string latest = read_latest(checkpoint_dir);
  if (!latest.empty()) parse_checkpoint_file_name(latest, &h.checkpoint);
  h.last_activity = std::max(mtime(dir / "metrics.jsonl"), mtime(dir / "events.jsonl"));
  return h;
}

RestartDecision decide_after_attempt(const RunHistory& h, const RestartPolicy& p, const AttemptOutcome& o,
                                     const SlurmEnv& env) {
  using A = RestartDecision::Action;
  const std::string state = o.job_state;
  // Slurm's own requeue of a failed node's job: it runs the script again; that start records it.
  static const std::set<std::string> requeueing{"NODE_FAIL", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "PENDING"};
  if (requeueing.count(state))
    return note(A::slurm_requeues, fmt::format("job is {}: Slurm requeues it itself; its next start records the restart", state));
  if (has(o.rank_codes, kExitNoRestart) || o.srun_code == kExitNoRestart)
    return note(A::none, "the runner refused to continue at start and said why (events.jsonl): no requeue");
  if (o.srun_code == 0 && o.rank_codes.empty()) return note(A::none, "finished");
  // The code that names the failure: a rank's own (srun reports the highest, often a peer's
  // signal), or the attempt's stop record (the watchdog's exit 5 says who hung).
  int code = o.srun_code;
  std::vector<int> codes = o.rank_codes;
  if (const int64_t s = index_of_last(h.events, "start"); s >= 0)
    for (size_t i = static_cast<size_t>(s) + 1; i < h.events.size(); ++i)
      if (h.events[i].value("event", "") == "end" && h.events[i].value("exit_code", 0) != 0)
        codes.push_back(h.events[i].value("exit_code", 0));
  for (int c : codes) code = c == kExitUserError || c == kExitNumerics || c == kExitHang ? c : code;
  if (has(codes, kExitUserError)) code = kExitUserError;
  if (state == "CANCELLED" || (o.term_signal && state != "TIMEOUT"))
    return refuse(h, env, "cancelled (scancel)", code, "a cancelled job is never restarted");
  if (state == "TIMEOUT") return refuse(h, env, "the time limit", code, "submit the script again to continue");
  if (code == kExitUserError)
    return refuse(h, env, "a user error (a bad recipe, input or allocation)", code,
                  "exit 2 is never restarted: fix what the message above says, then submit again");
  if (code == kExitNumerics)
    return refuse(h, env, "stopped on its numerics (fp16 overflows)", code, "a restart would repeat it");
  if (code == kExitPreempted)
    return note(A::none, "preempted: the script's requeue of exit 3 applies (not a failure)");
  std::string cause = code == kExitHang ? "a hang: the watchdog stopped the run (exit 5)"
                      : code > 128      ? fmt::format("a rank killed by {} (exit {})", signal_name(code - 128), code)
                                        : fmt::format("a rank or srun failed (exit {})", code);
  std::vector<std::string> lost;
  for (const std::string& n : last_nodes(h))
    if (std::find(o.nodes_down.begin(), o.nodes_down.end(), n) != o.nodes_down.end()) lost.push_back(n);
  if (!lost.empty()) cause = fmt::format("node lost ({}); {}", fmt::join(lost, " "), cause);
  return judge(h, p, env, {{"cause", cause}, {"exit_code", code}, {"detected", "after srun"}}, lost);
}

RestartDecision decide_at_start(const RunHistory& h, const RestartPolicy& p, const SlurmEnv& env, double now) {
  const int64_t s = index_of_last(h.events, "start");
  if (!env.in_job || s < 0 || !h.events[s].contains("slurm")) return {};
  for (size_t i = static_cast<size_t>(s) + 1; i < h.events.size(); ++i) {
    const std::string kind = h.events[i].value("event", "");
    if (kind == "end" || kind == "restart" || kind == "no_restart") return {};  // that attempt's end is known
  }
  const nlohmann::json& sl = h.events[s]["slurm"];
  const int64_t before = sl.value("restart_count", int64_t{0});
  if (sl.value("job_id", "") != env.job_id || env.restart_count <= before) return {};  // a new job: a resubmission
  std::vector<std::string> lost;
  const std::vector<std::string> now_nodes = expand_hostlist(env.node_list);
  for (const std::string& n : expand_hostlist(sl.value("node_list", "")))
    if (std::find(now_nodes.begin(), now_nodes.end(), n) == now_nodes.end()) lost.push_back(n);
  const std::string cause = fmt::format(
      "the previous attempt vanished without a stop record and Slurm requeued the job (restart count {} -> {}): a node "
      "failure{}", before, env.restart_count, lost.empty() ? "" : fmt::format(" ({} not in this allocation)", fmt::join(lost, " ")));
  RestartDecision d = judge(h, p, env, {{"cause", cause}, {"exit_code", nullptr}, {"detected", "at start"}}, lost);
  if (d.action == RestartDecision::Action::restart) {
    // Slurm's requeue waited no backoff: what is left of it since the attempt's last record.
    const double left = std::max(0.0, d.backoff_s - std::max(0.0, now - h.last_activity));
    d.record["backoff_s"] = left;
    d.record["backoff_full_s"] = d.backoff_s;
    d.backoff_s = left;
    d.message = fmt::format("restart {} of {} ({:g} s of the {:g} s backoff left to wait): {} (step {}, {})",
                            d.record["attempt"].get<int64_t>(), p.max_restarts, left, d.record["backoff_full_s"].get<double>(),
                            cause, h.step_reached, checkpoint_phrase(h.checkpoint));
  }
  return d;
}

nlohmann::json node_change_record(const RunHistory& h, const SlurmEnv& env) {
  const int64_t s = index_of_last(h.events, "start");
  if (!env.in_job || s < 0 || !h.events[s].contains("slurm")) return nullptr;
  const int64_t before = h.events[s]["slurm"].value("nnodes", int64_t{0});
  if (before <= 0 || env.nnodes <= 0 || before == env.nnodes) return nullptr;
  const std::vector<std::string> was = expand_hostlist(h.events[s]["slurm"].value("node_list", ""));
  const std::vector<std::string> now = expand_hostlist(env.node_list);
  std::vector<std::string> gone, added;
  for (const auto& n : was)
    if (std::find(now.begin(), now.end(), n) == now.end()) gone.push_back(n);
  for (const auto& n : now)
    if (std::find(was.begin(), was.end(), n) == was.end()) added.push_back(n);
  return {{"event", env.nnodes < before ? "shrink" : "grow"}, {"nodes_before", before}, {"nodes_now", env.nnodes},
          {"node_list", env.node_list}, {"nodes_lost", gone}, {"nodes_added", added}, {"job_id", env.job_id},
          {"step", h.checkpoint}};
}

std::vector<std::string> expand_hostlist(const std::string& list) {
  std::vector<std::string> out;
  // Split at commas outside brackets.
  std::vector<std::string> names;
  std::string cur;
  int depth = 0;
  for (char c : list) {
    depth += c == '[' ? 1 : c == ']' ? -1 : 0;
    if (c == ',' && depth == 0) {
      names.push_back(cur);
      cur.clear();
    } else if (!std::isspace(static_cast<unsigned char>(c))) {
      cur += c;
    }
  }
  names.push_back(cur);
  for (const std::string& n : names) {
    if (n.empty()) continue;
    const size_t a = n.find('['), b = n.find(']');
    if (a == std::string::npos || b == std::string::npos || b < a) {
      out.push_back(n);
      continue;
    }
    const std::string pre = n.substr(0, a), post = n.substr(b + 1), body = n.substr(a + 1, b - a - 1);
    std::stringstream ranges(body);
    for (std::string r; std::getline(ranges, r, ',');) {
      const size_t dash = r.find('-');
      const std::string lo = r.substr(0, dash), hi = dash == std::string::npos ? lo : r.substr(dash + 1);
      const long x = std::atol(lo.c_str()), y = std::atol(hi.c_str());
      for (long i = x; i <= y && i - x < 100000; ++i) {
        std::string num = std::to_string(i);
        if (num.size() < lo.size()) num = std::string(lo.size() - num.size(), '0') + num;  // n[01-03]
        out.push_back(pre + num + post);
      }
    }
  }
  return out;
}

std::vector<std::string> down_nodes(const std::string& sinfo_lines) {
  std::vector<std::string> out;
  std::stringstream in(sinfo_lines);
  const char sep = sinfo_lines.find(';') != std::string::npos ? ';' : '\n';
  for (std::string line; std::getline(in, line, sep);) {
    std::stringstream f(line);
    std::string name, state;
    if (!(f >> name >> state)) continue;
    static const std::regex bad("^(down|drain|fail|unknown|no_respond|maint|future|power_down).*|.*\\*$");
    if (std::regex_match(state, bad) && std::find(out.begin(), out.end(), name) == out.end()) out.push_back(name);
  }
  return out;
}

void record_rank_exit(int code) {
  const std::string& path = ops::knobs().exit_record;
  if (path.empty() || code == 0) return;
  const char* rank = std::getenv("SLURM_PROCID");
  std::ofstream f(path, std::ios::app);
  f << (rank ? rank : "?") << " " << code << "\n";  // one short line: appends from the ranks do not interleave
}

std::vector<int> read_rank_exits(const std::string& path) {
  std::vector<int> out;
  std::ifstream in(path);
  std::string rank;
  for (int code; in >> rank >> code;)
    if (code != 0) out.push_back(code);
  return out;
}

int64_t min_elastic_nodes(const Recipe& r, int64_t per_node, int64_t max_nodes) {
  const Plan want = make_plan(r, 0);
  for (int64_t n = 1; n < max_nodes; ++n) {
    Recipe e = r;
    e.parallel.dp = 0;
    e.batch.global = want.global;
    e.batch.micro = want.micro;
    e.batch.accum = 0;
    try {
      if (make_plan(e, n * per_node).fits) return n;
    } catch (const UserError&) {
      // tp x pp does not divide these ranks, or the global batch does not split over their dp
    }
  }
  return max_nodes;
}

}  // namespace runner
