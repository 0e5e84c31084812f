// Preemption: SIGTERM and SIGUSR1 (what Slurm sends before it kills or requeues a job), and
// SIGINT (Ctrl-C) the same way, so an interrupted run keeps its work.
//
// The first signal only sets a flag: the runner finishes the current step, writes a
// checkpoint and exits with kExitPreempted. Every loop that can run long (training,
// evaluation, warm-up, data preparation) polls stop_requested(). A second signal means
// "now": the handler calls _exit(128 + that signal) at once, saying so (the last published
// checkpoint stays valid: checkpoints are atomic). Handlers are async-signal-safe: an atomic store,
// a write(2) of a fixed message, _exit.
#pragma once
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace runner {

constexpr int kExitPreempted = 3;      // stopped by a signal after writing a checkpoint
constexpr int kExitSignalAbort = 143;  // second signal SIGTERM: exited at once (128 + SIGTERM)
constexpr int kExitInterruptAbort = 130;  // second signal SIGINT (Ctrl-C twice): 128 + SIGINT

// What the first signal stops: a training run (it checkpoints at the next step boundary and
// exits 3) or a command writing an output (data prepare, export, import, tokenizer training: it
// stops without publishing anything, the previous output untouched, and exits 3). Only the
// message differs.
enum class StopWork { training, data_prepare, output = data_prepare };

// What a command writing an output throws when a stop signal arrived: unwinding removes its
// temporaries; the command line reports it and exits kExitPreempted.
class Stopped : public std::runtime_error {
 public:
  explicit Stopped(const std::string& what) : std::runtime_error(what) {}
};
// Throws Stopped ("stopped by SIGTERM; nothing was written to `output`") when a signal asked to stop.
void throw_if_stopped(const std::string& output);

// Installs the handlers (idempotent); for training it also ignores SIGPIPE (a dead pipe on
// stdout or stderr fails the write, it does not end the run). Call once at start, before training.
void install_signal_handlers(StopWork work = StopWork::training);
// Restores the default dispositions (tests, or a runner embedded in something else).
void uninstall_signal_handlers();

bool stop_requested();
int stop_signal();  // the signal that asked to stop (SIGTERM, SIGUSR1, SIGINT), 0 if none (or a test request)
// "SIGINT (Ctrl-C)", "SIGTERM", "SIGUSR1", or "a stop request" (a test's): for messages and events.
const char* stop_signal_name();
// The flag itself, for code that takes a `const std::atomic<bool>*` (prepare_text_to_hdf5).
const std::atomic<bool>& stop_flag();

// Rank 0 of a run: where a second signal, which exits at once, appends its end record (the
// run's events.jsonl), so `runner status` says how the run ended rather than calling it a crash;
// empty: nowhere. The record holds the last step noted (note_step), written by the handler
// with write(2) alone.
void set_abort_record(const std::string& events_path);
void note_step(int64_t step);

void request_stop_for_test();  // as if a first signal had arrived (stop_signal() stays 0)
void reset_stop_for_test();    // clears the flag and the count of signals seen

}  // namespace runner
