// The watchdog's thread, heartbeats and hang report; see watchdog.h for what and why.
#include "runner/train/watchdog.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <fmt/format.h>

#include "parallel/comm.h"
#include "runner/errors.h"
#include "runner/run/run_dir.h"
#include "runner/run/slurm.h"
#include "runner/signals.h"
#include "runner/train/startup.h"

namespace runner {

namespace fs = std::filesystem;

namespace {

std::atomic<int> g_phase{static_cast<int>(Phase::Startup)};
std::atomic<int64_t> g_step{0};
std::atomic<int64_t> g_ticks{0};

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// Slurm's name for the node when a Slurm step started us (nodes that share a kernel, as the
// test cluster's network namespaces do, have one host name but their own node names).
std::string this_hostname() {
  if (const char* n = std::getenv("SLURMD_NODENAME"); n != nullptr && *n != '\0') return n;
  char h[256] = {0};
  if (gethostname(h, sizeof(h) - 1) != 0) return "?";
  return h;
}

bool exempt_phase(Phase p) { return p == Phase::Startup || p == Phase::Checkpoint; }

nlohmann::json wait_json(const parallel::WaitInfo& w, int64_t now_ns) {
  if (!w.active) return nullptr;
  nlohmann::json members = nlohmann::json::array();
  for (int i = 0; i < w.ranks.size && w.ranks.stride != 0; ++i) members.push_back(w.ranks.world_rank(i));
  nlohmann::json j{{"op", parallel::comm_op_name(w.op)}, {"group", w.group}, {"members", members},
                   {"bytes", w.bytes}, {"for_s", (now_ns - w.since_ns) / 1e9}};
  if (w.peer >= 0) j["peer"] = w.peer;
  else j["seq"] = w.seq;
  return j;
}

// "allreduce on dp (world ranks 0,1; call #12, 8 bytes)" or "recv from rank 3 on pp (64 bytes)".
std::string describe_wait(const nlohmann::json& w) {
  if (w.is_null()) return "nothing";
  std::string members;
  for (const auto& m : w.value("members", nlohmann::json::array())) {
    if (!members.empty()) members += ',';
    members += m.dump();
  }
  const std::string op = w.value("op", "?"), group = w.value("group", "?");
  if (w.contains("peer"))
    return fmt::format("{} {} rank {} on {} ({} bytes)", op, op.find("send") != std::string::npos ? "to" : "from",
                       w["peer"].get<int>(), group, w.value("bytes", int64_t{0}));
  return fmt::format("{} on {} (world ranks {}; call #{}, {} bytes)", op, group, members.empty() ? "?" : members,
                     w.value("seq", int64_t{0}), w.value("bytes", int64_t{0}));
}

// Whether `theirs` (a heartbeat's wait) is the call `mine` waits on: the same collective of
// the same group, or the matching message between the two ranks.
bool same_call(const parallel::WaitInfo& mine, int self, const nlohmann::json& theirs) {
  if (theirs.is_null() || mine.group != theirs.value("group", std::string())) return false;
  if (mine.peer >= 0) return theirs.value("peer", -1) == self;
  return theirs.value("op", "") == std::string(parallel::comm_op_name(mine.op)) && theirs.value("seq", int64_t{-1}) == mine.seq;
}

// Whether process `pid` of this host has exited (or is a zombie its parent has not reaped).
bool process_gone(int pid) {
  if (pid <= 0) return false;
  if (::kill(pid, 0) != 0) return errno == ESRCH;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const size_t p = line.rfind(')');
  return p != std::string::npos && p + 2 < line.size() && (line[p + 2] == 'Z' || line[p + 2] == 'X');
}

// Whether process `pid` of this host is stopped (SIGSTOP) and runs this same program.
bool stopped_runner(int pid) {
  if (pid <= 0 || pid == getpid()) return false;
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  const size_t p = line.rfind(')');
  if (p == std::string::npos || p + 2 >= line.size() || (line[p + 2] != 'T' && line[p + 2] != 't')) return false;
  std::error_code a, b;
  const fs::path theirs = fs::read_symlink("/proc/" + std::to_string(pid) + "/exe", a), mine = fs::read_symlink("/proc/self/exe", b);
  return !a && !b && theirs == mine;
}

// The watchdog an MPI error reports to (one per process, while it runs).
std::atomic<Watchdog*> g_active{nullptr};
void on_comm_failure(const std::string& what) {
  if (Watchdog* w = g_active.load()) w->comm_failed(what);
}

}  // namespace

const char* phase_name(Phase p) {
  switch (p) {
    case Phase::Startup: return "startup";
    case Phase::Data: return "data";
    case Phase::Passes: return "forward/backward";
    case Phase::Optimizer: return "optimizer";
    case Phase::Boundary: return "between steps";
    case Phase::Checkpoint: return "checkpoint";
    case Phase::Eval: return "evaluation";
    case Phase::Done: return "done";
  }
  return "?";
}

void set_phase(Phase p, int64_t step) {
  g_step.store(step, std::memory_order_relaxed);
  g_phase.store(static_cast<int>(p), std::memory_order_relaxed);
}
void progress_tick() { g_ticks.fetch_add(1, std::memory_order_relaxed); }

TimeoutChoice choose_timeout(double explicit_s, double predicted_step_s, double measured_step_s) {
  if (explicit_s > 0) return {explicit_s, "train.collective_timeout", false};
  if (measured_step_s > 0)
    return {std::max(kTimeoutFloorS, kTimeoutStepMultiple * measured_step_s),
            fmt::format("{:g} x the measured step {:.3g} s, at least {:g} s", kTimeoutStepMultiple, measured_step_s, kTimeoutFloorS),
            true};
  if (predicted_step_s > 0)
    return {std::max(kTimeoutFloorS, kTimeoutStepMultiple * predicted_step_s),
            fmt::format("{:g} x the predicted step {:.3g} s, at least {:g} s; replaced after the first steps",
                        kTimeoutStepMultiple, predicted_step_s, kTimeoutFloorS),
            true};
  return {kTimeoutFloorS, fmt::format("the floor {:g} s (no predicted step); replaced after the first steps", kTimeoutFloorS), true};
}

double heartbeat_interval(double timeout_s) { return std::clamp(timeout_s / 10.0, 0.1, 1.0); }
double heartbeat_stale_after(double timeout_s) {
  return std::max(3.0 * heartbeat_interval(timeout_s), std::min(timeout_s / 2.0, 10.0));
}

std::string heartbeat_path(const std::string& run_dir, int rank) {
  return (fs::path(run_dir) / ".ranks" / fmt::format("rank-{}.json", rank)).string();
}

std::optional<Heartbeat> read_heartbeat(const std::string& run_dir, int rank) {
  std::ifstream f(heartbeat_path(run_dir, rank));
  if (!f) return std::nullopt;
  std::stringstream ss;
  ss << f.rdbuf();
  try {
    const nlohmann::json j = nlohmann::json::parse(ss.str());
    Heartbeat h;
    h.rank = j.value("rank", rank);
    h.pid = j.value("pid", 0);
    h.host = j.value("host", "?");
    h.phase = j.value("phase", "?");
    h.attempt = j.value("attempt", "");
    h.step = j.value("step", int64_t{0});
    h.exempt = j.value("exempt", false);
    h.time = j.value("time", 0.0);
    h.wait = j.value("wait", nlohmann::json());
    return h;
  } catch (const std::exception&) {
    return std::nullopt;  // written by another version, or torn on a file system without atomic rename
  }
}

nlohmann::json not_arrived(const parallel::WaitInfo& w, int self, const std::vector<int>& members,
                           const std::vector<std::optional<Heartbeat>>& beats, double now, double stale_s) {
  nlohmann::json out = nlohmann::json::array();
  for (size_t i = 0; i < members.size(); ++i) {
    if (members[i] == self) continue;
    const std::optional<Heartbeat>& h = beats[i];
    if (!h) {
      out.push_back({{"rank", members[i]}, {"state", "no heartbeat"}});
      continue;
    }
    const double age = now - h->time;
    const bool stale = age > stale_s;
    if (!stale && same_call(w, self, h->wait)) continue;  // arrived: it waits on the same call
    out.push_back({{"rank", members[i]}, {"host", h->host}, {"pid", h->pid}, {"state", stale ? "stopped" : "elsewhere"},
                   {"phase", h->phase}, {"step", h->step}, {"heartbeat_age_s", age}, {"doing", describe_wait(h->wait)}});
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Watchdog

Watchdog::Watchdog(std::string run_dir, int rank, int world, TimeoutChoice timeout, std::shared_ptr<spdlog::logger> log,
                   bool lead, bool log_on_console, std::string attempt)
    : run_dir_(std::move(run_dir)), host_(this_hostname()), attempt_(std::move(attempt)), rank_(rank), world_(world),
      parent_(getppid()), choice_(std::move(timeout)),
      log_(std::move(log)), lead_(lead), log_on_console_(log_on_console && log_ != nullptr), timeout_ms_(static_cast<int64_t>(choice_.seconds * 1e3)) {
  std::error_code ec;
  fs::create_directories(fs::path(run_dir_) / ".ranks", ec);
  const int64_t now = parallel::watch_now_ns();
  last_progress_ns_ = last_exempt_ns_ = now;
  beat(now);
  if (lead_)
    append_run_event(run_dir_, {{"event", "watchdog"}, {"timeout_s", choice_.seconds}, {"source", choice_.source},
                                {"heartbeat_s", heartbeat_interval(choice_.seconds)},
                                {"stale_s", heartbeat_stale_after(choice_.seconds)}});
  parallel::watch_enable(true);
  thread_ = std::thread([this] { loop(); });
  g_active.store(this);
  parallel::set_comm_failure_handler(&on_comm_failure);
}

Watchdog::~Watchdog() { stop(); }

void Watchdog::stop() {
  {
    std::lock_guard<std::mutex> g(mu_);
    if (stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  Watchdog* self = this;
  if (g_active.compare_exchange_strong(self, nullptr)) parallel::set_comm_failure_handler(nullptr);
  parallel::watch_enable(false);
  set_phase(Phase::Done, g_step.load());
  beat(parallel::watch_now_ns());
}

void Watchdog::step_done(double step_ms) {
  const int64_t n = steps_done_.fetch_add(1) + 1;
  progress_tick();
  if (!choice_.from_model || n < 2 || n > 1 + kMeasureSteps) return;
  step_ms_.push_back(step_ms);  // the first step (warm-up) is left out
  if (n != 1 + kMeasureSteps) return;
  const double measured = *std::max_element(step_ms_.begin(), step_ms_.end()) / 1e3;
  const TimeoutChoice c = choose_timeout(0, 0, measured);
  timeout_ms_.store(static_cast<int64_t>(c.seconds * 1e3));
  if (!lead_) return;
  if (log_) log_->info("watchdog: collective timeout now {:g} s ({})", c.seconds, c.source);
  append_run_event(run_dir_, {{"event", "watchdog"}, {"timeout_s", c.seconds}, {"source", c.source}});
}

// A tick that comes much later than its period means this process itself was frozen (SIGSTOP,
// a paused VM): by the rule that calls another rank's heartbeat stale, it was the stopped one.
// Its own waits then look as long as the freeze, and a record of them would blame a hang on the
// ranks that were waiting for it (and, written when Slurm's teardown sends SIGCONT, would come
// after theirs). So its timers start over at that tick instead; the others name it.
void Watchdog::loop() {
  std::unique_lock<std::mutex> lk(mu_);
  int64_t last_tick = parallel::watch_now_ns(), last_beat = last_tick;
  while (!stopping_) {
    // Checks every quarter second at most (a dead peer or a gone launcher is seen within it);
    // the heartbeat is written at its own interval. Inside a collective, or once a stop signal
    // came, every 50 ms: a launcher that saw a rank die sends SIGTERM and SIGKILL one second
    // apart (Open MPI's odls_base_sigkill_timeout), and in between this rank must name the
    // dead one; its SIGKILL leaves no other chance, and a busy machine delays each tick.
    const bool urgent = stop_requested() || parallel::watch_current().active;
    const auto period = std::chrono::duration<double>(std::min(urgent ? 0.05 : 0.25, heartbeat_interval(timeout_s())));
    cv_.wait_for(lk, period, [this] { return stopping_; });
    if (stopping_) break;
    lk.unlock();
    const int64_t now = parallel::watch_now_ns();
    const double gap_s = (now - last_tick) / 1e9;
    last_tick = now;
    // The launcher is gone (mpirun returned, the step ended): so is the job. A rank left
    // running would hold its cores and, continued after a stop, write into the run's records.
    if (world_ > 1 && getppid() != parent_) {
      const std::string msg = fmt::format("watchdog: rank {} (host {}, pid {}): its launcher (pid {}) is gone, so is the job; "
                                          "exiting (exit {}) without a record", rank_, host_, getpid(), parent_, kExitHang);
      std::fprintf(stderr, "%s\n", msg.c_str());
      if (log_) {
        log_->error("{}", msg);
        log_->flush();
      }
      std::fflush(nullptr);
      std::_Exit(kExitHang);
    }
    if ((now - last_beat) / 1e9 >= heartbeat_interval(timeout_s()) * 0.999) {
      beat(now);
      last_beat = now;
    }
    if (gap_s > heartbeat_stale_after(timeout_s())) {
      last_exempt_ns_ = now;
      last_progress_ns_ = now;
      if (log_) log_->warn("watchdog: this process was frozen for {:.1f} s (stopped or paused); its own waits start over", gap_s);
    } else {
      check(now);
    }
    lk.lock();
  }
}

bool Watchdog::exempt_now() const {
  return exempt_phase(static_cast<Phase>(g_phase.load(std::memory_order_relaxed))) || steps_done_.load() == 0;
}

void Watchdog::beat(int64_t now_ns) {
  const nlohmann::json j{{"rank", rank_}, {"host", host_}, {"pid", static_cast<int>(getpid())},
                         {"step", g_step.load(std::memory_order_relaxed)},
                         {"phase", phase_name(static_cast<Phase>(g_phase.load(std::memory_order_relaxed)))},
                         {"exempt", exempt_now()}, {"time", wall_now()}, {"attempt", attempt_},
                         {"wait", wait_json(parallel::watch_current(), now_ns)}};
  const std::string path = heartbeat_path(run_dir_, rank_), tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) return;  // the run directory went away: nothing to tell
    f << j.dump() << "\n";
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
}

void Watchdog::check(int64_t now_ns) {
  const int phase = g_phase.load(std::memory_order_relaxed);
  const int64_t ticks = g_ticks.load(std::memory_order_relaxed);
  if (phase != seen_phase_) phase_since_ns_ = now_ns;
  if (phase != seen_phase_ || ticks != seen_ticks_) last_progress_ns_ = now_ns;
  seen_phase_ = phase;
  seen_ticks_ = ticks;
  // Start-up and the first step exempt this rank's waits too (the others may still be loading
  // with no heartbeat yet). Its own checkpoint phase does not: a collective write waits on the
  // others, and whether they are writing too (fresh and exempt) or stopped is theirs to say.
  if (static_cast<Phase>(phase) == Phase::Startup || steps_done_.load() == 0) last_exempt_ns_ = now_ns;
  check_stop_signal(now_ns);
  const parallel::WaitInfo w = parallel::watch_current();
  if (w.active) check_wait(w, now_ns);
  else check_stall(now_ns);
}

// A launcher that saw one of its ranks die stops the others with SIGTERM, then SIGKILL a second
// later (Open MPI), and this rank may be anywhere then: in a collective, or writing its
// checkpoint with no collective marked. So for the first two seconds after a stop signal the
// ranks on this host are looked at on every tick, and one that is gone is named: otherwise
// only the launcher's words ("exited on signal 9") would tell what happened. Ranks that ended
// cleanly (preempted with their checkpoint, phase done) are not gone.
void Watchdog::check_stop_signal(int64_t now_ns) {
  if (world_ == 1 || !stop_requested()) return;
  if (stop_seen_ns_ == 0) stop_seen_ns_ = now_ns;
  if ((now_ns - stop_seen_ns_) / 1e9 > 2.0) return;
  if (!host_peers_) {  // every heartbeat read once; hosts do not change within a job
    std::vector<int> all;
    for (int r = 0; r < world_; ++r) all.push_back(r);
    const std::vector<std::optional<Heartbeat>> beats = read_beats(all);
    host_peers_.emplace();
    for (size_t i = 0; i < all.size(); ++i)
      if (beats[i] && beats[i]->host == host_) host_peers_->push_back(all[i]);
  }
  const nlohmann::json gone = gone_members(*host_peers_, read_beats(*host_peers_));
  if (gone.empty()) return;
  hang(fmt::format("was asked to stop ({}, as a launcher stops a job one of whose ranks died)", stop_signal_name()),
       {{"kind", "gone"}, {"signal", stop_signal_name()}}, gone);
}

std::vector<int> Watchdog::members_of(const parallel::WaitInfo& w) const {
  std::vector<int> m;
  if (w.peer >= 0) return {w.peer};
  if (w.ranks.stride == 0) {  // an irregular group: everyone's heartbeat
    for (int r = 0; r < world_; ++r) m.push_back(r);
    return m;
  }
  for (int i = 0; i < w.ranks.size; ++i) m.push_back(w.ranks.world_rank(i));
  return m;
}

std::vector<std::optional<Heartbeat>> Watchdog::read_beats(const std::vector<int>& ranks) const {
  std::vector<std::optional<Heartbeat>> b;
  for (int r : ranks) b.push_back(r == rank_ ? std::nullopt : read_heartbeat(run_dir_, r));
  return b;
}

void Watchdog::check_wait(const parallel::WaitInfo& w, int64_t now_ns) {
  const double timeout = timeout_s();
  // A member whose process on this host is gone never arrives: no need to wait for the timeout.
  // Looked for once a wait is half a second old (after a stop signal, check_stop_signal looks
  // at once).
  if ((now_ns - w.since_ns) / 1e9 >= std::min(0.5, heartbeat_interval(timeout))) {
    const std::vector<int> members = members_of(w);
    const nlohmann::json gone = gone_members(members, read_beats(members));
    if (!gone.empty()) {
      const nlohmann::json wj = wait_json(w, now_ns);
      nlohmann::json rec{{"kind", "gone"}, {"op", wj["op"]}, {"group", wj["group"]}, {"members", wj["members"]},
                         {"bytes", w.bytes}, {"waited_s", (now_ns - w.since_ns) / 1e9}};
      hang(fmt::format("waited {:.1f} s for {}", (now_ns - w.since_ns) / 1e9, describe_wait(wj)), rec, gone);
    }
  }
  const double since_s = (now_ns - std::max(w.since_ns, last_exempt_ns_)) / 1e9;
  if (since_s < timeout / 2) return;  // the other ranks' heartbeats are read only once a wait is long
  const std::vector<int> members = members_of(w);
  const std::vector<std::optional<Heartbeat>> beats = read_beats(members);
  const double now = wall_now(), stale = heartbeat_stale_after(timeout);
  for (const auto& h : beats)
    if (h && h->exempt && now - h->time <= stale) {  // a member writes a checkpoint, or starts up
      last_exempt_ns_ = now_ns;
      return;
    }
  if (since_s <= timeout) return;
  const nlohmann::json wj = wait_json(w, now_ns);
  const nlohmann::json missing = not_arrived(w, rank_, members, beats, now, stale);
  nlohmann::json rec{{"kind", "wait"}, {"op", wj["op"]}, {"group", wj["group"]}, {"members", wj["members"]},
                     {"bytes", w.bytes}, {"waited_s", (now_ns - w.since_ns) / 1e9}};
  if (w.peer >= 0) rec["peer"] = w.peer;
  else rec["seq"] = w.seq;
  hang(fmt::format("waited {:.1f} s for {}", (now_ns - w.since_ns) / 1e9, describe_wait(wj)), rec, missing);
}

// No progress and no communication marked: a stuck loader or kernel here, or a wait the comm
// layer does not mark (a GPU stream behind an NCCL collective, MPI-IO inside a collective
// checkpoint write). Past half the timeout every heartbeat is read: a rank writing a
// checkpoint or starting up pushes the deadline out, as for a wait, and stopped ranks are
// named. Inside this rank's own checkpoint write only a stopped rank makes it a hang (a slow
// file system is not one).
void Watchdog::check_stall(int64_t now_ns) {
  const double timeout = timeout_s();
  const double idle_s = (now_ns - std::max(last_progress_ns_, last_exempt_ns_)) / 1e9;
  const Phase p = static_cast<Phase>(g_phase.load(std::memory_order_relaxed));
  if (idle_s <= timeout && (world_ == 1 || idle_s < timeout / 2)) return;
  std::vector<int> all;
  for (int r = 0; r < world_; ++r) all.push_back(r);
  const std::vector<std::optional<Heartbeat>> beats = read_beats(all);
  const double now = wall_now(), stale = heartbeat_stale_after(timeout);
  for (const auto& h : beats)
    if (h && h->exempt && now - h->time <= stale) {
      last_exempt_ns_ = now_ns;
      return;
    }
  if (idle_s <= timeout) return;
  nlohmann::json missing = nlohmann::json::array();
  if (p != Phase::Checkpoint)
    missing.push_back({{"rank", rank_}, {"host", host_}, {"pid", static_cast<int>(getpid())}, {"state", "stalled"},
                       {"phase", phase_name(p)}, {"step", g_step.load()}, {"heartbeat_age_s", 0.0}, {"doing", "nothing"}});
  for (const auto& m : not_arrived(parallel::WaitInfo{}, rank_, all, beats, now, stale))
    if (m.value("state", "") == "stopped") missing.push_back(m);
  if (missing.empty()) {  // this rank's own checkpoint write, slow but with everyone alive
    last_progress_ns_ = now_ns;
    return;
  }
  hang(fmt::format("made no progress for {:.1f} s with no communication marked ({})", idle_s,
                   p == Phase::Checkpoint ? "inside its checkpoint write" : "a stuck data loader, kernel or process"),
       {{"kind", "stall"}, {"waited_s", idle_s}}, missing);
}

namespace {
// One line of a hang's message: a member that did not arrive, and what its heartbeat says.
std::string missing_member_line(const nlohmann::json& m) {
  const std::string state = m.value("state", "?");
  std::string line = fmt::format("rank {}", m.value("rank", -1));
  const std::string doing = m.value("doing", "nothing");
  const std::string waiting = doing == "nothing" ? "" : ", waiting on " + doing;
  if (m.contains("host")) line += fmt::format(" (host {}, pid {})", m.value("host", "?"), m.value("pid", 0));
  if (state == "gone")
    line += fmt::format(" is gone: its process exited (last seen in {} at step {})", m.value("phase", "?"),
                        m.value("step", int64_t{0}));
  else if (state == "stopped")
    line += fmt::format(" did not arrive: its heartbeat stopped {:.1f} s ago (a stopped or dead process, or an "
                        "unreachable node); last seen in {} at step {}{}",
                        m.value("heartbeat_age_s", 0.0), m.value("phase", "?"), m.value("step", int64_t{0}), waiting);
  else if (state == "elsewhere")
    line += fmt::format(" did not arrive: it is in {} at step {}{}", m.value("phase", "?"), m.value("step", int64_t{0}),
                        waiting);
  else if (state == "stalled")
    line += " is stuck itself";
  else
    line += " did not arrive and wrote no heartbeat (its watchdog never started)";
  return line;
}
}  // namespace

// One message, the records, exit 5. Runs on the watchdog's thread while the trainer's is
// blocked (in MPI, a kernel, a read): nothing can unwind it, so logs are flushed and the
// process ends with _Exit; the launcher stops the other ranks.
void Watchdog::hang(const std::string& what, nlohmann::json rec, const nlohmann::json& missing) {
  const Phase p = static_cast<Phase>(g_phase.load(std::memory_order_relaxed));
  const int64_t step = g_step.load(std::memory_order_relaxed);
  const std::string kind = rec.value("kind", "");
  // A peer that is gone stops the job before the timeout: no "longer than" then.
  std::string msg = kind == "gone" || kind == "comm_error"
                        ? fmt::format("watchdog: rank {} (host {}, pid {}) {}, at step {} ({})", rank_, host_, getpid(), what,
                                      step, phase_name(p))
                        : fmt::format("watchdog: rank {} (host {}, pid {}) {}, at step {} ({}); longer than the collective "
                                      "timeout {:g} s ({})", rank_, host_, getpid(), what, step, phase_name(p), timeout_s(),
                                      choice_.source);
  std::string who;
  for (const auto& m : missing) {
    msg += "\n  " + missing_member_line(m);
    if (who.empty()) who = fmt::format("rank {}{}", m.value("rank", -1), m.contains("host") ? " on " + m.value("host", "?") : "");
  }
  if (missing.empty())
    msg += rec.value("kind", "") == "comm_error"
               ? "\n  no rank could be named: every heartbeat is fresh (a rank on another host may have died just now)"
               : "\n  every member is waiting on this call: the network or the MPI library is stuck";
  // A stopped rank on this host outlives the job otherwise: the launcher's SIGTERM waits for a
  // SIGCONT that may never come. Woken, it ends by itself: its peer (this rank) is gone, MPI
  // returns an error, and its watchdog finds this hang recorded (or its launcher gone). Not
  // killed: the launcher would then report its SIGKILL instead of this rank's exit 5.
  for (const auto& m : missing)
    if (m.value("state", "") == "stopped" && m.value("host", "") == host_ && stopped_runner(m.value("pid", 0))) {
      ::kill(m.value("pid", 0), SIGCONT);
      msg += fmt::format("\n  rank {} (pid {}) was stopped on this host: woken (SIGCONT), so that it ends with the job",
                         m.value("rank", -1), m.value("pid", 0));
    }
  msg += fmt::format("\n  stopping the job (exit {}); a restart resumes from the last published checkpoint", kExitHang);
  if (!log_on_console_) {
    std::fprintf(stderr, "%s\n", msg.c_str());
    std::fflush(stderr);
  }
  if (log_) {
    log_->error("{}", msg);
    log_->flush();
  }
  // One hang, one record. A rank of an attempt the run has moved past (it was stopped, and
  // continued after the next attempt started) records nothing; of this attempt's ranks, the
  // first to take the hang's marker records it.
  const std::string recorder = hang_recorder();
  if (!recorder.empty()) {
    if (log_) log_->error("watchdog: {}; no record written", recorder);
    std::fprintf(stderr, "watchdog: rank %d: %s; no record written\n", rank_, recorder.c_str());
    std::fflush(nullptr);
    std::_Exit(kExitHang);
  }
  rec.update({{"event", "hang"}, {"rank", rank_}, {"host", host_}, {"pid", static_cast<int>(getpid())}, {"step", step},
              {"phase", phase_name(p)}, {"timeout_s", timeout_s()}, {"timeout_source", choice_.source},
              {"not_arrived", missing}, {"message", msg.substr(0, msg.find('\n'))}});
  append_run_event(run_dir_, rec);
  std::string cause;
  if (!missing.empty() && missing[0].value("state", "") == "gone")
    cause = fmt::format("hang: {} is gone (its process exited)", who);
  else if (rec.value("kind", "") == "comm_error")
    cause = fmt::format("hang: {} (an MPI error in rank {})", who.empty() ? "a peer failed" : who + " did not arrive", rank_);
  else if (!missing.empty() && missing[0].value("state", "") == "stalled")
    cause = fmt::format("hang: {} made no progress in {}", who, phase_name(p));
  else if (rec.value("kind", "") == "stall")
    cause = fmt::format("hang: {} did not arrive (rank {} waited in {})", who, rank_, phase_name(p));
  else
    cause = fmt::format("hang: {} at {} on {}", who.empty() ? "no rank missing (network or MPI stuck)" : who + " did not arrive",
                        rec.value("op", "?"), rec.value("group", "?"));
  append_end_event(run_dir_, cause.c_str(), step, kExitHang);
  std::fflush(nullptr);
  std::_Exit(kExitHang);
}

nlohmann::json Watchdog::gone_members(const std::vector<int>& ranks, const std::vector<std::optional<Heartbeat>>& beats) const {
  nlohmann::json out = nlohmann::json::array();
  const double now = wall_now();
  for (size_t i = 0; i < ranks.size(); ++i) {
    const std::optional<Heartbeat>& h = beats[i];
    // Only this attempt's heartbeats: a requeued job's ranks start beside the files of the
    // previous attempt's (dead) processes until they write their own. A rank that ended
    // cleanly (phase done) is not gone either: the timeout judges what it left waiting.
    if (ranks[i] == rank_ || !h || h->host != host_ || h->phase == "done") continue;
    if (!attempt_.empty() && h->attempt != attempt_) continue;
    if (!process_gone(h->pid)) continue;
    out.push_back({{"rank", ranks[i]}, {"host", h->host}, {"pid", h->pid}, {"state", "gone"}, {"phase", h->phase},
                   {"step", h->step}, {"heartbeat_age_s", now - h->time}, {"doing", describe_wait(h->wait)}});
  }
  return out;
}

void Watchdog::comm_failed(const std::string& what) {
  std::vector<int> all;
  for (int r = 0; r < world_; ++r) all.push_back(r);
  const std::vector<std::optional<Heartbeat>> beats = read_beats(all);
  nlohmann::json missing = gone_members(all, beats);
  if (missing.empty())  // on another host: a stale heartbeat is the sign
    for (const auto& m : not_arrived(parallel::WaitInfo{}, rank_, all, beats, wall_now(), heartbeat_stale_after(timeout_s())))
      if (m.value("state", "") == "stopped") missing.push_back(m);
  hang(fmt::format("got an error from MPI ({})", what), {{"kind", "comm_error"}, {"mpi_error", what}}, missing);
}

std::string Watchdog::hang_recorder() const {
  if (attempt_.empty()) return "";
  std::string last;
  for (const auto& e : read_jsonl((fs::path(run_dir_) / "events.jsonl").string()))
    if (e.value("event", "") == "start" && e.contains("attempt")) last = e.value("attempt", "");
  if (!last.empty() && last != attempt_)
    return fmt::format("this rank belongs to an earlier attempt of the run ({}; the run started again as {})", attempt_, last);
  const std::string marker = (fs::path(run_dir_) / ".ranks" / ("hang-" + attempt_)).string();
  const int fd = ::open(marker.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd >= 0) {
    ::close(fd);
    return "";
  }
  return errno == EEXIST ? std::string("another rank of this attempt recorded the hang first") : std::string();
}

}  // namespace runner
