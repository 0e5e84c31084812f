// `runner status RUN_DIR` (see slurm.h): read-only, from the files a run writes: recipe.yaml,
// metrics.jsonl, events.jsonl, the checkpoint directory and the run lock (runner.lock).
//
// Whether the run is running is the lock's answer, not the files': its owner holds a flock on
// runner.lock for as long as it lives, and the kernel drops it however the owner ends. So the
// state is running (lock held), else what the last job's end record says (finished, stopped by
// a signal at a checkpoint, stopped on an error), else crashed (no end record: SIGKILL, a
// crash, a node loss). Only a running run gets an ETA.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <yaml-cpp/yaml.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/errors.h"
#include "runner/run/run_dir.h"
#include "runner/run/slurm.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

std::string age(double seconds) {
  if (seconds < 0) seconds = 0;
  if (seconds < 90) return fmt::format("{:.0f} s", seconds);
  if (seconds < 5400) return fmt::format("{:.0f} min", seconds / 60);
  if (seconds < 172800) return fmt::format("{:.1f} h", seconds / 3600);
  return fmt::format("{:.1f} days", seconds / 86400);
}

// Why the job that started with `start` ended, from the record after it (none: killed).
std::string cause_of(const nlohmann::json* end) {
  if (!end) return "killed without a stop record (SIGKILL, a crash, a node loss or a time limit without warning)";
  const std::string cause = end->value("cause", "?");
  if (cause == "preempted") {
    // SIGUSR1 is Slurm's warning before a time limit; SIGTERM and SIGINT a user's or scancel's.
    const std::string sig = end->value("signal", "a signal");
    return fmt::format("{} by {} at step {} (checkpoint written)", sig == "SIGUSR1" ? "preempted" : "stopped", sig,
                       end->value("step", int64_t{-1}));
  }
  return fmt::format("{} at step {} (exit {})", cause, end->value("step", int64_t{-1}), end->value("exit_code", 0));
}

// The fields of an automatic restart's record that `runner status` shows with that restart.
void add_restart_record(nlohmann::json& r, const nlohmann::json& rec) {
  r["automatic"] = true;
  r["cause"] = rec.value("cause", "?");
  for (const char* k : {"exit_code", "attempt", "max_restarts", "backoff_s", "nodes", "nodes_lost", "step", "checkpoint",
                        "detected"})
    if (rec.contains(k)) r[k] = rec[k];
}

std::string join_nodes(const nlohmann::json& list) {
  std::string out;
  if (list.is_array())
    for (const auto& n : list) out += (out.empty() ? "" : " ") + n.get<std::string>();
  return out.empty() ? "-" : out;
}

// Whether another process holds RUN_DIR/runner.lock, and what the file says of its owner (the
// live owner's line; a dead owner's when it ended without emptying it; empty after a clean
// exit). A shared lock taken and dropped at once: a `runner train` starting in that instant
// would be told the directory is in use, which a second try settles.
struct LockProbe {
  bool exists = false, held = false;
  std::string owner;
  std::string unsure;  // why the lock could not be tested here (a file system without flock), else empty
};

// The host of an owner line "host H pid P ...", else empty.
std::string owner_host(const std::string& owner) {
  if (owner.rfind("host ", 0) != 0) return "";
  const size_t end = owner.find(' ', 5);
  return owner.substr(5, end == std::string::npos ? std::string::npos : end - 5);
}

std::string this_host() {
  char host[256] = {0};
  return ::gethostname(host, sizeof host - 1) == 0 ? host : "";
}

LockProbe probe_lock(const fs::path& dir) {
  LockProbe p;
  const int fd = ::open((dir / "runner.lock").c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return p;
  p.exists = true;
  char buf[512];
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  if (n > 0) p.owner.assign(buf, static_cast<size_t>(n));
  while (!p.owner.empty() && (p.owner.back() == '\n' || p.owner.back() == '\r')) p.owner.pop_back();
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0) {
    p.held = errno == EWOULDBLOCK;
    if (!p.held) p.unsure = std::strerror(errno);
  }
  ::close(fd);  // drops the shared lock, if taken
  return p;
}

// The recipe as resolved: name (into s), the total steps and the checkpoint directory.
void status_recipe(const fs::path& dir, nlohmann::json& s, int64_t& total, fs::path& ckpt_dir) {
  try {
    YAML::Node y = YAML::LoadFile((dir / "recipe.yaml").string());
    s["name"] = y["name"] ? y["name"].as<std::string>() : "";
    if (y["train"] && y["train"]["steps"]) total = y["train"]["steps"].as<int64_t>();
    if (y["checkpoint"] && y["checkpoint"]["dir"] && !y["checkpoint"]["dir"].as<std::string>().empty())
      ckpt_dir = y["checkpoint"]["dir"].as<std::string>();
  } catch (const YAML::Exception&) {
    // no or unreadable recipe.yaml: what the other files say still holds
  }
  s["total_steps"] = total;
}

// Steps: metrics.jsonl, one record per step (the end-of-run summary has "summary").
struct StepRecords {
  int64_t last_step = 0;
  std::vector<double> step_ms;
  bool summary = false;
};

StepRecords status_steps(const fs::path& dir, nlohmann::json& s, double now) {
  StepRecords r;
  double loss = 0;
  for (const auto& j : read_jsonl(dir / "metrics.jsonl")) {
    if (j.contains("summary")) r.summary = true;
    if (!j.contains("step") || !j.contains("loss") || !j.contains("step_ms")) continue;
    r.last_step = std::max(r.last_step, j["step"].get<int64_t>());
    loss = j["loss"].get<double>();
    r.step_ms.push_back(j["step_ms"].get<double>());
  }
  s["last_step"] = r.last_step;
  if (!r.step_ms.empty()) s["last_loss"] = loss;
  struct stat mst{};
  if (::stat((dir / "metrics.jsonl").c_str(), &mst) == 0) s["last_step_age_s"] = now - static_cast<double>(mst.st_mtime);
  return r;
}

// The last checkpoint: LATEST, else the newest step file.
void status_checkpoint(const fs::path& ckpt_dir, nlohmann::json& s, double now) {
  std::string latest = read_latest(ckpt_dir.string());
  if (latest.empty()) {
    auto steps = list_checkpoint_steps(ckpt_dir.string());
    if (!steps.empty()) latest = checkpoint_file_name(steps.back());
  }
  if (latest.empty()) return;
  int64_t st = -1;
  parse_checkpoint_file_name(latest, &st);
  nlohmann::json c{{"file", (ckpt_dir / latest).string()}, {"step", st}};
  struct stat cst{};
  if (::stat((ckpt_dir / latest).c_str(), &cst) == 0) c["age_s"] = now - static_cast<double>(cst.st_mtime);
  s["checkpoint"] = c;
}

// Starts and stops: events.jsonl gives the restarts and the last start's layout; returns the
// last start's end record (null: none, or no start recorded; `started` says which).
nlohmann::json status_events(const fs::path& dir, nlohmann::json& s, bool& started) {
  const std::vector<nlohmann::json> events = read_jsonl(dir / "events.jsonl");
  std::vector<size_t> starts;
  for (size_t i = 0; i < events.size(); ++i)
    if (events[i].value("event", "") == "start") starts.push_back(i);
  nlohmann::json restarts = nlohmann::json::array();
  for (size_t k = 0; k + 1 < starts.size(); ++k) {
    const nlohmann::json* end = nullptr;
    for (size_t i = starts[k] + 1; i < starts[k + 1]; ++i)
      if (events[i].value("event", "") == "end") end = &events[i];
    nlohmann::json r{{"cause", cause_of(end)}, {"restarted_at", events[starts[k + 1]].value("time", "")},
                     {"resumed_from", events[starts[k + 1]].value("resumed_from", int64_t{-1})}};
    // An automatic restart's record (runner/run/restart.h): its cause, the nodes, the step reached.
    for (size_t i = starts[k] + 1; i <= starts[k + 1]; ++i)
      if (events[i].value("event", "") == "restart") add_restart_record(r, events[i]);
      else if (events[i].value("event", "") == "shrink" || events[i].value("event", "") == "grow") r["node_change"] = events[i];
    for (const auto& n : events[starts[k + 1]].value("notes", nlohmann::json::array())) r["notes"].push_back(n);
    restarts.push_back(r);
  }
  s["restarts"] = restarts;
  started = !starts.empty();
  // Restarts stopped (the limit, no progress) or refused (scancel, exit 2): the last attempt's word.
  for (size_t i = starts.empty() ? 0 : starts.back() + 1; i < events.size(); ++i)
    if (events[i].value("event", "") == "no_restart") {
      s["restarts_stopped"] = events[i];
      s.erase("restart_pending");
    } else if (events[i].value("event", "") == "restart") s["restart_pending"] = events[i];
  nlohmann::json last_end;
  if (!started) return last_end;
  const nlohmann::json& last = events[starts.back()];
  s["layout"] = {{"world", last.value("world", int64_t{0})}, {"dp", last.value("dp", int64_t{0})},
                 {"tp", last.value("tp", int64_t{0})},       {"pp", last.value("pp", int64_t{0})},
                 {"global", last.value("global", int64_t{0})}, {"micro", last.value("micro", int64_t{0})},
                 {"accum", last.value("accum", int64_t{0})}};
  if (last.contains("slurm")) s["slurm"] = last["slurm"];
  for (size_t i = starts.back() + 1; i < events.size(); ++i)
    if (events[i].value("event", "") == "end") last_end = events[i];
  return last_end;
}

// The state: "running" while the lock is held; else the last job's end record says
// "finished" or "stopped" (a signal at a checkpoint, or an error); else "crashed" ("unknown"
// when the owner ran on another host and wrote a step in the last 10 minutes, or the lock
// cannot be tested on this file system). "state_detail" is what `runner status` prints after it.
void status_state(const fs::path& dir, nlohmann::json& s, const LockProbe& lock, bool summary, bool started,
                  const nlohmann::json& end) {
  std::string state, detail;
  const std::string resume = fmt::format("`runner resume {}`", dir.string());
  const std::string from = s.contains("checkpoint")
                               ? fmt::format("continue from step {} with {}", s["checkpoint"]["step"].get<int64_t>(), resume)
                               : "no checkpoint was written: `runner train` starts it over";
  if (lock.held) {
    state = "running";
    detail = lock.owner.empty() ? "its owner holds the run lock and has not recorded itself yet" : lock.owner;
  } else if (!end.is_null() && end.value("cause", "") == "done") {
    state = "finished";
  } else if (!end.is_null()) {
    state = "stopped";
    detail = cause_of(&end) + "; " + from;
  } else if (summary && !started) {
    state = "finished";  // a run directory from before events.jsonl
  } else if (const std::string host = owner_host(lock.owner);
             !host.empty() && (!lock.unsure.empty() || (host != this_host() && s.value("last_step_age_s", 1e9) < 600))) {
    // The owner ran elsewhere and its lock looks free from here, but a network file system may
    // not show another client's lock (or none can be tested): recent records may be a live run.
    state = "unknown";
    detail = fmt::format("the owner ({}) left no stop record, and {}; the last step was recorded {} ago. Run `runner "
                         "status` on {} to know, or treat it as crashed: {}",
                         lock.owner,
                         lock.unsure.empty() ? "its lock on this file system may not be visible from " + this_host()
                                             : "the lock cannot be tested here (" + lock.unsure + ")",
                         age(s.value("last_step_age_s", 0.0)), host, from);
  } else {
    state = "crashed";
    detail = fmt::format("{} is gone without a stop record (SIGKILL, a crash, a node loss or a time limit without "
                         "warning); {}", lock.owner.empty() ? "its owner" : "its owner (" + lock.owner + ")", from);
  }
  s["state"] = state;
  if (!detail.empty()) s["state_detail"] = detail;
  if (lock.held && !lock.owner.empty()) s["owner"] = lock.owner;
}

// The restarts: each start after the first, with an automatic restart's record and a change
// of nodes; then a restart waiting for its backoff, or why restarts stopped.
void print_restarts(std::ostringstream& o, const nlohmann::json& s) {
  o << fmt::format("restarts    {}\n", s["restarts"].size());
  int k = 0;
  for (const auto& r : s["restarts"]) {
    o << fmt::format("  {:>3}. {}; {} at {}\n", ++k, r["cause"].get<std::string>(),
                     resumed_phrase(r["resumed_from"].get<int64_t>()), r["restarted_at"].get<std::string>());
    if (r.value("automatic", false))
      o << fmt::format("       automatic restart {} of {} after {:g} s backoff ({}): step {} reached, {}; "
                       "nodes had: {}; lost: {}\n", r.value("attempt", int64_t{0}), r.value("max_restarts", int64_t{0}),
                       r.value("backoff_s", 0.0), r.value("detected", ""), r.value("step", int64_t{-1}),
                       checkpoint_phrase(r.value("checkpoint", int64_t{-1})), join_nodes(r.value("nodes", nlohmann::json())),
                       join_nodes(r.value("nodes_lost", nlohmann::json())));
    if (r.contains("node_change")) {
      const auto& c = r["node_change"];
      o << fmt::format("       {} from {} to {} node(s): {}\n", c.value("event", "") == "grow" ? "grew" : "shrank",
                       c.value("nodes_before", int64_t{0}), c.value("nodes_now", int64_t{0}), c.value("node_list", ""));
    }
    if (r.contains("notes"))
      for (const auto& n : r["notes"]) o << "       " << n.get<std::string>() << "\n";
  }
  if (s.contains("restart_pending")) {
    const auto& p = s["restart_pending"];
    o << fmt::format("  restart {} of {} pending ({:g} s backoff): {}\n", p.value("attempt", int64_t{0}),
                     p.value("max_restarts", int64_t{0}), p.value("backoff_s", 0.0), p.value("cause", ""));
  }
  if (s.contains("restarts_stopped")) {
    const auto& n = s["restarts_stopped"];
    const std::string reason = n.value("reason", "");
    o << fmt::format("  restarts {}: {} at step {} ({})\n",
                     reason == "limit" || reason == "same step" ? "stopped" : "refused", n.value("cause", ""),
                     n.value("step", int64_t{-1}),
                     reason == "limit" ? fmt::format("the limit of {} restarts", n.value("max_restarts", int64_t{0}))
                     : reason == "same step" ? "failed again at the same step with no progress" : reason);
  }
}

}  // namespace

nlohmann::json run_status_json(const std::string& run_dir) {
  const fs::path dir(run_dir);
  if (!fs::is_directory(dir) || (!fs::exists(dir / "recipe.yaml") && !fs::exists(dir / "metrics.jsonl")))
    throw UserError({run_dir, 0, 0}, "not a run directory (no recipe.yaml or metrics.jsonl)",
                    "pass the directory `runner train` wrote (runs/NAME, or its --run-dir)");
  nlohmann::json s{{"run_dir", run_dir}};
  const double now = static_cast<double>(std::time(nullptr));
  int64_t total = 0;
  fs::path ckpt_dir = dir / "checkpoints";
  status_recipe(dir, s, total, ckpt_dir);
  const StepRecords steps = status_steps(dir, s, now);
  status_checkpoint(ckpt_dir, s, now);
  bool started = false;
  const nlohmann::json end = status_events(dir, s, started);
  status_state(dir, s, probe_lock(dir), steps.summary, started, end);

  // ETA, while running: the mean of the last (up to) 50 steps' times over the steps left.
  if (s["state"] == "running" && total > 0 && steps.last_step < total && !steps.step_ms.empty()) {
    const size_t n = std::min<size_t>(50, steps.step_ms.size());
    double ms_sum = 0;
    for (size_t i = steps.step_ms.size() - n; i < steps.step_ms.size(); ++i) ms_sum += steps.step_ms[i];
    const double per_step = ms_sum / static_cast<double>(n) / 1e3;
    s["eta_s"] = per_step * static_cast<double>(total - steps.last_step);
    s["step_s"] = per_step;
  }
  return s;
}

std::string run_status(const std::string& run_dir) {
  const nlohmann::json s = run_status_json(run_dir);
  std::ostringstream o;
  o << fmt::format("run         {}{}\n", s["run_dir"].get<std::string>(),
                   s.value("name", "").empty() ? "" : " (" + s["name"].get<std::string>() + ")");
  const std::string detail = s.value("state_detail", "");
  if (detail.rfind("stopped", 0) == 0) o << "state       " << detail << "\n";  // "stopped by SIGINT at step ..."
  else o << "state       " << s["state"].get<std::string>() << (detail.empty() ? "" : ": " + detail) << "\n";
  const int64_t total = s["total_steps"].get<int64_t>(), last = s["last_step"].get<int64_t>();
  std::string step = total > 0 ? fmt::format("{} / {} ({:.0f}%)", last, total, 100.0 * last / total) : std::to_string(last);
  if (s.contains("last_loss")) step += fmt::format(", loss {:.4f}", s["last_loss"].get<double>());
  if (s.contains("last_step_age_s")) step += fmt::format(", recorded {} ago", age(s["last_step_age_s"].get<double>()));
  o << "last step   " << step << "\n";
  if (s.contains("checkpoint")) {
    const auto& c = s["checkpoint"];
    o << fmt::format("checkpoint  step {} ({}){}\n", c["step"].get<int64_t>(), c["file"].get<std::string>(),
                     c.contains("age_s") ? ", written " + age(c["age_s"].get<double>()) + " ago" : "");
  } else {
    o << "checkpoint  none yet\n";
  }
  if (s.contains("layout")) {
    const auto& l = s["layout"];
    const int64_t world = l["world"].get<int64_t>(), dp = l["dp"].get<int64_t>();
    o << fmt::format("layout      {} rank{} = dp {} x tp {} x pp {}, global batch {} = micro {} x dp {} x accum {}\n", world,
                     world == 1 ? "" : "s", dp, l["tp"].get<int64_t>(), l["pp"].get<int64_t>(), l["global"].get<int64_t>(),
                     l["micro"].get<int64_t>(), dp, l["accum"].get<int64_t>());
  }
  if (s.contains("slurm")) {
    const auto& j = s["slurm"];
    o << fmt::format("slurm       job {} ({}), restart count {}, nodes {}, {} task(s)\n", j.value("job_id", ""),
                     j.value("job_name", ""), j.value("restart_count", int64_t{0}), j.value("node_list", ""),
                     j.value("ntasks", int64_t{0}));
  } else {
    o << "slurm       not run under Slurm\n";
  }
  print_restarts(o, s);
  if (s.contains("eta_s"))
    o << fmt::format("eta         {} ({} step{} left at {:.3f} s per step, the mean of the last steps)\n",
                     age(s["eta_s"].get<double>()), total - last, total - last == 1 ? "" : "s", s["step_s"].get<double>());
  else if (s["state"] == "running")
    o << "eta         unknown (no steps recorded yet)\n";
  else
    o << "eta         none (" << (s["state"] == "finished" ? "finished" : "not running") << ")\n";
  return o.str();
}

}  // namespace runner
