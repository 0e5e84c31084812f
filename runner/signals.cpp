// Signal handling for preemption (see signals.h).
#include "runner/signals.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace runner {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<int> g_count{0};
std::atomic<bool> g_data_prepare{false};  // StopWork::data_prepare: the first message says so
// The abort record (set_abort_record): the file's path, NUL-terminated, valid when g_abort_set.
char g_abort_path[4096];
std::atomic<bool> g_abort_set{false};
std::atomic<int64_t> g_step{-1};
static_assert(std::atomic<int64_t>::is_always_lock_free, "signal handlers need lock-free atomics");
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "signal handlers need lock-free atomics");

void write_stderr(const char* s) {
  ssize_t r = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)r;
}

// Fixed strings only: a handler may not format.
const char* first_message(int sig) {
  if (g_data_prepare.load())
    return sig == SIGINT ? "\nrunner: Ctrl-C (SIGINT): stopping; no output file is written. Press Ctrl-C again to exit at once\n"
                         : "runner: stop signal: stopping; no output file is written. Signal again to exit at once\n";
  switch (sig) {
    case SIGINT:
      return "\nrunner: Ctrl-C (SIGINT): finishing the step, then writing a checkpoint and exiting (code 3); "
             "`runner resume RUN_DIR` continues. Press Ctrl-C again to exit at once without one\n";
    case SIGUSR1:
      return "runner: SIGUSR1: finishing the step, then writing a checkpoint; signal again to exit at once\n";
    default:
      return "runner: SIGTERM: finishing the step, then writing a checkpoint; signal again to exit at once\n";
  }
}

// The end record of a run the second signal stops, in one write(2) so that it cannot tear
// against another appender: fixed text and the step's digits.
void append_abort_record(int sig) {
  if (!g_abort_set.load()) return;
  char line[256] = "{\"event\":\"end\",\"cause\":\"exited at once on a second signal (no checkpoint at this step)\","
                   "\"exit_code\":";
  size_t n = std::strlen(line);
  auto put_int = [&](int64_t v) {
    char digits[24];
    int k = 0;
    if (v < 0) {
      line[n++] = '-';
      v = -v;
    }
    do digits[k++] = static_cast<char>('0' + v % 10);
    while ((v /= 10) > 0);
    while (k > 0) line[n++] = digits[--k];
  };
  auto put = [&](const char* s) {
    for (; *s; ++s) line[n++] = *s;
  };
  put_int(128 + sig);
  put(sig == SIGINT ? ",\"signal\":\"SIGINT (Ctrl-C)\"" : sig == SIGUSR1 ? ",\"signal\":\"SIGUSR1\"" : ",\"signal\":\"SIGTERM\"");
  put(",\"step\":");
  put_int(g_step.load());
  put("}\n");
  const int fd = ::open(g_abort_path, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return;
  ssize_t r = ::write(fd, line, n);
  (void)r;
  ::close(fd);
}

extern "C" void on_stop_signal(int sig) {
  int saved_errno = errno;
  if (g_count.fetch_add(1) > 0) {
    // 128 + the signal, as a shell reports a process the signal ended (130 for Ctrl-C twice).
    write_stderr(sig == SIGINT ? "\nrunner: second Ctrl-C (SIGINT): exiting now, without a checkpoint at this step "
                                 "(the last published checkpoint stays valid)\n"
                               : "runner: second signal: exiting now, without a checkpoint at this step (the last "
                                 "published checkpoint stays valid)\n");
    append_abort_record(sig);
    ::_exit(128 + sig);
  }
  g_signal.store(sig);
  g_stop.store(true);
  write_stderr(first_message(sig));
  errno = saved_errno;
}

void set_handler(int sig, void (*fn)(int)) {
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = fn;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;  // slow system calls (file writes) resume instead of failing with EINTR
  sigaction(sig, &sa, nullptr);
}

}  // namespace

void install_signal_handlers(StopWork work) {
  g_data_prepare.store(work == StopWork::data_prepare);
  set_handler(SIGTERM, on_stop_signal);
  set_handler(SIGUSR1, on_stop_signal);
  set_handler(SIGINT, on_stop_signal);
  // A closed stdout or stderr (`| tee` whose tee exited on the same Ctrl-C) must not kill the
  // process on its next write: the write fails with EPIPE instead, the console sink stops, and
  // the stop path (checkpoint, end record) runs as for any signal.
  if (work == StopWork::training) set_handler(SIGPIPE, SIG_IGN);
}

void uninstall_signal_handlers() {
  set_handler(SIGTERM, SIG_DFL);
  set_handler(SIGUSR1, SIG_DFL);
  set_handler(SIGINT, SIG_DFL);
  set_handler(SIGPIPE, SIG_DFL);
}

bool stop_requested() { return g_stop.load(std::memory_order_relaxed); }
int stop_signal() { return g_signal.load(); }
const char* stop_signal_name() {
  switch (g_signal.load()) {
    case SIGINT: return "SIGINT (Ctrl-C)";
    case SIGTERM: return "SIGTERM";
    case SIGUSR1: return "SIGUSR1";
    default: return "a stop request";
  }
}
const std::atomic<bool>& stop_flag() { return g_stop; }

void set_abort_record(const std::string& events_path) {
  g_abort_set.store(false);
  if (events_path.empty() || events_path.size() >= sizeof g_abort_path) return;
  std::memcpy(g_abort_path, events_path.c_str(), events_path.size() + 1);
  g_abort_set.store(true);
}

void throw_if_stopped(const std::string& output) {
  if (!stop_requested()) return;
  throw Stopped(std::string("stopped by ") + stop_signal_name() + "; nothing was written to " + output +
                " (a previous output there is unchanged): run the command again");
}

void note_step(int64_t step) { g_step.store(step, std::memory_order_relaxed); }

void request_stop_for_test() {
  g_count.fetch_add(1);
  g_stop.store(true);
}

void reset_stop_for_test() {
  g_stop.store(false);
  g_signal.store(0);
  g_count.store(0);
}

}  // namespace runner
