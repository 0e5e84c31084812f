// Signal handling for preemption (see signals.h).
#include "runner/signals.h"

#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace runner {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
std::atomic<int> g_count{0};
static_assert(std::atomic<bool>::is_always_lock_free && std::atomic<int>::is_always_lock_free,
              "signal handlers need lock-free atomics");

void write_stderr(const char* s) {
  ssize_t r = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)r;
}

extern "C" void on_stop_signal(int sig) {
  int saved_errno = errno;
  if (g_count.fetch_add(1) > 0) {
    write_stderr("runner: second signal: exiting now (the last published checkpoint stays valid)\n");
    ::_exit(kExitSignalAbort);
  }
  g_signal.store(sig);
  g_stop.store(true);
  write_stderr(sig == SIGUSR1 ? "runner: SIGUSR1: finishing the step, then writing a checkpoint; signal again to exit at once\n"
                              : "runner: SIGTERM: finishing the step, then writing a checkpoint; signal again to exit at once\n");
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

void install_signal_handlers() {
  set_handler(SIGTERM, on_stop_signal);
  set_handler(SIGUSR1, on_stop_signal);
}

void uninstall_signal_handlers() {
  set_handler(SIGTERM, SIG_DFL);
  set_handler(SIGUSR1, SIG_DFL);
}

bool stop_requested() { return g_stop.load(std::memory_order_relaxed); }
int stop_signal() { return g_signal.load(); }
const std::atomic<bool>& stop_flag() { return g_stop; }

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
