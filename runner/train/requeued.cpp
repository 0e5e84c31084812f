// Judging a start after Slurm's own requeue (see requeued.h).
#include "runner/train/requeued.h"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <thread>

#include <fmt/format.h>

#include "runner/agree.h"
#include "runner/observe/console_sink.h"
#include "runner/run/restart.h"
#include "runner/run/slurm.h"

namespace runner {

int judge_requeued_start(parallel::Communicator& world, const Recipe& r, const RunPaths& paths) {
  const SlurmEnv env = slurm_env();
  if (!env.in_job) return 0;
  RestartDecision d;
  nlohmann::json change;
  agree(world, [&] {
    const RunHistory h = read_run_history(paths.run_dir, paths.checkpoint_dir);
    d = decide_at_start(h, restart_policy(r), env, static_cast<double>(std::time(nullptr)));
    change = node_change_record(h, env);
  });
  if (world.rank() == 0) {
    if (!d.record.is_null()) append_run_event(paths.run_dir, d.record);
    if (!change.is_null()) append_run_event(paths.run_dir, change);
    if (!d.message.empty()) console_write(stderr, fmt::format("runner: {}\n", d.message));
    if (!change.is_null())
      console_write(stdout, fmt::format("runner: {} from {} to {} node(s) ({})\n",
                                        change["event"].get<std::string>() == "grow" ? "grown" : "shrunk",
                                        change["nodes_before"].get<int64_t>(), change["nodes_now"].get<int64_t>(), env.node_list));
  }
  if (d.action == RestartDecision::Action::refuse) return kExitNoRestart;
  if (d.backoff_s > 0) std::this_thread::sleep_for(std::chrono::duration<double>(d.backoff_s));
  return 0;
}

}  // namespace runner
