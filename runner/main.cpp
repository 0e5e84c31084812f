// The `runner` command line: the parser built from the commands (runner/cli/, one file each),
// then the one named dispatched.
//
// Every user error ends here as `file:line:col: what; how to fix` on stderr with exit
// code 2, before anything is allocated or written.
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>

#include <unistd.h>

#include <CLI/CLI.hpp>

#include "ops/knobs.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/isolated.h"
#include "runner/data/data.h"
#include "runner/cli/command.h"
#include "runner/errors.h"
#include "runner/recipe/recipe.h"
#include "runner/run/restart.h"
#include "runner/signals.h"
#include "runner/train/fault_hook.h"
#include "runner/train/mpi_job.h"
#include "runner/train/startup.h"

using namespace runner;

namespace {

// An unknown command is named (CLI11 would only say an argument was not expected); 0 when the
// first argument is a command or an option.
int refuse_unknown_command(const CLI::App& app, int argc, char** argv) {
  if (argc <= 1 || argv[1][0] == '-') return 0;
  bool known = false;
  std::string names;  // listed from the parser, so a new command is never left out
  for (const CLI::App* c : app.get_subcommands({})) {
    known = known || c->check_name(argv[1]);
    if (!c->get_group().empty()) names += (names.empty() ? "" : ", ") + c->get_name();
  }
  if (known) return 0;
  std::fprintf(stderr, "unknown command '%s'; the commands are %s (see runner --help)\n", argv[1], names.c_str());
  return kExitUserError;
}

// Resume verification under MPI runs in a fresh process of this executable (runner/checkpoint/isolated.h).
void set_checkpoint_verifier_to_self() {
  char exe[4096];
  if (const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1); n > 0) set_checkpoint_verifier(std::string(exe, n));
}

// Runs the parsed command; user errors print once (rank 0 of a job) and exit 2.
int run_command(cli::Command& cmd, int* argc, char*** argv) {
  set_checkpoint_verifier_to_self();
  std::optional<Launch> launch;
  if (cmd.start() == cli::Start::ranks) {
    install_signal_handlers();  // Slurm's warning may come during start-up: it must not kill the process
    launch.emplace(argc, argv);
  }
  if (cmd.start() == cli::Start::ranks_if_launched && parallel::mpi_launched()) launch.emplace(argc, argv);
  const bool quiet_rank = launch && launch->rank() != 0;  // identical errors print once
  // A command a stop signal interrupted unwinds (its temporaries removed) with whatever error the
  // interruption raised: it exits as a stopped command, 3, not as a user error.
  const auto failed = [] { return stop_requested() ? kExitPreempted : kExitUserError; };
  try {
    return cmd.run(launch);
  } catch (const Stopped& e) {
    std::cout.flush();
    if (!quiet_rank) std::fprintf(stderr, "runner: %s\n", e.what());
    return kExitPreempted;
  } catch (const UserError& e) {
    std::cout.flush();
    if (!quiet_rank) std::fprintf(stderr, "%s\n", e.what());
    return failed();
  } catch (const std::filesystem::filesystem_error& e) {  // no exception reaches terminate (a clean message, not an abort)
    std::cout.flush();
    std::fprintf(stderr, "%s: %s (%s)\n", e.path1().c_str(), e.code().message().c_str(), e.what());
    return failed();
  } catch (const std::exception& e) {
    std::cout.flush();
    std::fprintf(stderr, "error: %s\n", e.what());
    return failed();
  }
}

}  // namespace

int main(int argc, char** argv) {
  default_passive_waiting(argv);  // before anything starts OpenMP's threads (runner/train/startup.h)
  disable_hdf5_exit_cleanup();  // a failed write's half-closed file must not crash the exit
  // Recipe validation reads the prepared data's tokenizer vocabulary through the data room.
  runner::set_data_vocabulary(runner::prepared_vocabulary);
  CLI::App app{"runner: a declarative training job runner for transformer language models"};
  app.set_version_flag("--version", std::string("runner ") + RUNNER_VERSION);
  app.require_subcommand(1);
  std::unique_ptr<cli::Command> commands[] = {  // in the help's order
      cli::plan_command(app),    cli::calibrate_command(app), cli::train_command(app),  cli::resume_command(app),
      cli::inspect_command(app), cli::verify_checkpoint_command(app),
      cli::data_command(app),    cli::tokenizer_command(app),
      cli::report_command(app),  cli::export_command(app), cli::import_command(app),
      cli::generate_command(app), cli::launch_command(app), cli::status_command(app),
      cli::restart_check_command(app),
  };
  if (int rc = refuse_unknown_command(app, argc, argv)) return rc;
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUserError;
  }
  // The RUNNER_* knobs, read once (a malformed one exits 2 before anything is written), and the
  // fault points they arm below the trainer, in every command: the checkpoint verifier's
  // process too (RUNNER_CKPT_FAULT_VERIFY_ABORT).
  try {
    arm_fault_points(ops::knobs().faults);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitUserError;
  }
  for (auto& cmd : commands) {
    if (!cmd->chosen()) continue;
    if (cmd->start() != cli::Start::isolated) {
      const int rc = run_command(*cmd, &argc, &argv);
      // Under the batch script: this rank's own code (srun reports only the highest of all).
      if (cmd->start() == cli::Start::ranks) record_rank_exit(rc);
      return rc;
    }
    std::optional<Launch> none;
    return cmd->run(none);
  }
  return 0;
}
