// Running under Slurm (see slurm.h).
#include "runner/run/slurm.h"

#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <map>
#include <regex>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "runner/device/devices.h"
#include "runner/run/restart.h"
#include "runner/run/run_dir.h"
#include "runner/errors.h"
#include "slurm_template.h"  // generated from scripts/slurm.sbatch.in (CMakeLists.txt)

namespace fs = std::filesystem;

namespace runner {

namespace {

std::string env_str(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

int64_t env_int(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? std::atoll(v) : 0;
}

// A shell word: single-quoted unless it is plainly safe.
std::string shell_quote(const std::string& s) {
  if (!s.empty() && std::regex_match(s, std::regex("[A-Za-z0-9_@%+=:,./-]+"))) return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

// "1 rank", "4 ranks".
std::string ranks(int64_t n) { return fmt::format("{} rank{}", n, n == 1 ? "" : "s"); }

std::string absolute(const std::string& p) { return fs::absolute(fs::path(p)).lexically_normal().string(); }

std::string self_executable() {
  std::error_code ec;
  fs::path p = fs::read_symlink("/proc/self/exe", ec);
  return ec ? std::string("runner") : p.string();
}

std::string now_utc() {
  auto t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", std::gmtime(&t));
  return buf;
}

// --cpus-per-task and why: a rank's OpenMP threads are the cores Slurm binds its task to, so
// the default of 1 would train on one thread per rank.
std::pair<int64_t, std::string> cpus_per_task(const Recipe& r, const SlurmLaunchOptions& o, int64_t per_node) {
  if (o.cpus_per_task > 0) return {o.cpus_per_task, "--cpus-per-task"};
  if (r.train.threads > 0) return {r.train.threads, "train.threads"};
  const int64_t here = std::max<long>(1, ::sysconf(_SC_NPROCESSORS_ONLN));
  const int64_t node = o.node_cpus > 0 ? o.node_cpus : here;
  return {std::max<int64_t>(1, node / per_node),
          fmt::format("{} CPUs per node ({}) / {} rank{} per node", node,
                      o.node_cpus > 0 ? "--node-cpus" : "this machine's; --node-cpus N for other compute nodes", per_node,
                      per_node == 1 ? "" : "s")};
}

// --elastic: --nodes=MIN-MAX, MAX the recipe's nodes, MIN the fewest on which the layout plans
// and fits the memory ledger at the dp they give (runner/run/restart.h min_elastic_nodes).
struct ElasticNodes {
  int64_t min = 0;
  std::string why;  // comment lines for the script
};
ElasticNodes elastic_nodes(const Recipe& r, const SlurmLaunchOptions& o, int64_t per_node, int64_t nodes) {
  if (!o.elastic) return {nodes, ""};
  const int64_t min = min_elastic_nodes(r, per_node, nodes);
  if (min >= nodes)
    return {nodes, fmt::format("# --elastic: the layout needs all {} node(s) (the memory ledger, or tp x pp and the global "
                               "batch leave no smaller dp), so no node range.\n", nodes)};
  return {min, fmt::format("# --elastic: any {} to {} nodes. {} node(s) is the fewest on which the model fits (the memory "
                           "ledger,\n# dp free, global batch {} kept); a job requeued on fewer nodes continues at a smaller "
                           "dp and grows back.\n", min, nodes, min, make_plan(r, 0).global)};
}

// --elastic on fewer nodes than the recipe's: a background check for idle nodes; once there are
// enough to grow back, the ranks are told to checkpoint and exit 3, and the requeued job starts
// on more nodes (Slurm gives a MIN-MAX job as many as are free).
std::string grow_block(int64_t max_nodes) {
  return fmt::format(R"X(# Growing back (--elastic): while this job has fewer than {0} nodes, look for idle ones every
# RUNNER_GROW_POLL seconds (default 60) in this job's partition; once one is, SIGUSR1 to the
# ranks: a checkpoint, exit 3, the requeue below, and the job starts again on the nodes free.
grow_watcher=""
if [ "${{SLURM_JOB_NUM_NODES:-{0}}}" -lt {0} ]; then
  (
    while sleep "${{RUNNER_GROW_POLL:-60}}"; do
      idle=$(sinfo -h -t idle ${{SLURM_JOB_PARTITION:+-p "$SLURM_JOB_PARTITION"}} -o %D 2>/dev/null | awk '{{s += $1}} END {{print s + 0}}')
      if [ $(( SLURM_JOB_NUM_NODES + idle )) -gt "$SLURM_JOB_NUM_NODES" ]; then
        echo "slurm.sbatch: $idle idle node(s) beside this job's $SLURM_JOB_NUM_NODES: growing back (checkpoint, exit 3, requeue)"
        scancel --signal=USR1 "$SLURM_JOB_ID"
        break
      fi
    done
  ) &
  grow_watcher=$!
fi
)X", max_nodes);
}

// The task lines. A node range with --ntasks-per-node gets its minimum of nodes even when more
// are idle (sbatch derives the task count from MIN): the most ranks as --ntasks instead, and srun
// starts per_node on each node given (seen on the two-node test cluster; docs/slurm.md).
std::string ntasks_lines(bool range, int64_t nodes, int64_t per_node, int64_t world) {
  if (!range) return fmt::format("#SBATCH --ntasks={}\n#SBATCH --ntasks-per-node={}\n", world, per_node);
  return fmt::format("# --ntasks is the most ranks, {0} nodes x {1}, with no --ntasks-per-node: Slurm then gives as many\n"
                     "# nodes of the range as are free (with --ntasks-per-node it gives the fewest); srun below\n"
                     "# starts {1} per node given.\n#SBATCH --ntasks={2}\n", nodes, per_node, nodes * per_node);
}

}  // namespace

SlurmEnv slurm_env() {
  SlurmEnv e;
  e.job_id = env_str("SLURM_JOB_ID");
  e.in_job = !e.job_id.empty();
  if (!e.in_job) return e;
  e.job_name = env_str("SLURM_JOB_NAME");
  e.node_list = env_str("SLURM_JOB_NODELIST");
  if (e.node_list.empty()) e.node_list = env_str("SLURM_NODELIST");
  e.restart_count = env_int("SLURM_RESTART_COUNT");
  e.ntasks = env_int("SLURM_NTASKS");
  if (e.ntasks == 0) e.ntasks = env_int("SLURM_NPROCS");
  e.nnodes = env_int("SLURM_JOB_NUM_NODES");
  if (e.nnodes == 0) e.nnodes = env_int("SLURM_NNODES");
  return e;
}

Recipe fit_allocation(const Recipe& r, int64_t world, bool elastic, std::vector<std::string>* notes) {
  const SlurmEnv env = slurm_env();
  elastic = elastic || r.train.elastic;
  if (!env.in_job && !elastic) return r;
  const int64_t have = world > 0 ? world : env.in_job && env.ntasks > 0 ? env.ntasks : 1;
  const Plan want = make_plan(r, 0);  // the recipe's own layout
  if (have == want.world) return r;
  const std::string where = env.in_job ? fmt::format("Slurm job {} has {} task{}", env.job_id, have, have == 1 ? "" : "s")
                                       : fmt::format("{} rank{} {} running", have, have == 1 ? "" : "s",
                                                     have == 1 ? "is" : "are");
  if (!elastic)
    throw UserError(r.loc("parallel"),
                    fmt::format("this allocation {}: {}, but the recipe's layout needs {} (dp {} x tp {} x pp {})",
                                have < want.world ? "is too small for the recipe" : "does not match the recipe", where,
                                ranks(want.world), want.dp, want.tp, want.pp),
                    fmt::format("submit with --ntasks={} (`runner launch RECIPE --slurm` writes that), or continue at "
                                "this size with the same global batch: `runner train --elastic` or train.elastic: true",
                                want.world));
  // Elastic: dp from the world, the global batch kept, accum derived again (micro stays).
  Recipe e = r;
  e.parallel.dp = 0;
  e.batch.global = want.global;
  e.batch.micro = want.micro;
  e.batch.accum = 0;
  Plan got;
  try {
    got = make_plan(e, have);
  } catch (const UserError& err) {
    throw UserError(err.loc(), fmt::format("elastic continuation: {}, the recipe's layout {}: {}", where, ranks(want.world),
                                           err.problem()),
                    fmt::format("run on a number of ranks for which the global batch {} divides into micro {} x dp x "
                                "accum (and tp x pp divides the ranks); {}", want.global, want.micro, err.fix()));
  }
  e.parallel.dp = got.dp;  // explicit: a process started by hand (world 0) plans this layout too
  if (notes)
    notes->push_back(fmt::format("elastic: {}, the recipe's layout {}: dp {} -> {}, accum {} -> {}, global batch {} kept "
                                 "(micro {})", where, ranks(want.world), want.dp, got.dp, want.accum, got.accum, got.global,
                                 got.micro));
  return e;
}

std::string builtin_slurm_template() { return kSlurmTemplate; }

std::string slurm_script(const Plan& p, const SlurmLaunchOptions& o) {
  const Recipe& r = p.recipe;
  if (!std::regex_match(o.time, std::regex("([0-9]+-)?[0-9]+(:[0-9]{1,2}){0,2}")))
    throw UserError({"--time", 0, 0}, fmt::format("'{}' is not a Slurm time limit", o.time),
                    "give minutes, MM:SS, HH:MM:SS or D-HH:MM:SS, e.g. --time 04:00:00");
  if (o.warn_seconds < 1)
    throw UserError({"--warn", 0, 0}, fmt::format("--warn {} must be at least 1 second", o.warn_seconds),
                    "give the seconds before the time limit at which the ranks checkpoint, e.g. --warn 120");
  const int64_t per_node = std::max<int64_t>(1, std::min(r.hardware.devices_per_node, p.world));
  const int64_t nodes = (p.world + per_node - 1) / per_node;
  if (o.node_cpus < 0 || o.cpus_per_task < 0)
    throw UserError({o.node_cpus < 0 ? "--node-cpus" : "--cpus-per-task", 0, 0}, "a CPU count must be positive",
                    "give the CPUs of one compute node to --node-cpus, or the cores per rank to --cpus-per-task");
  const auto [cpus, cpus_why] = cpus_per_task(r, o, per_node);
  const std::string run_dir = absolute(run_paths(r, o.run_dir).run_dir);
  std::string sets;
  for (const std::string& s : o.sets) sets += " --set " + shell_quote(s);
  const std::string flags = sets + (o.elastic ? " --elastic" : "");
  const ElasticNodes en = elastic_nodes(r, o, per_node, nodes);
  const std::map<std::string, std::string> fields{
      {"JOB_NAME", o.job_name.empty() ? r.name : o.job_name},
      {"RECIPE_ARG", o.recipe_path},
      {"RECIPE", shell_quote(absolute(o.recipe_path))},
      {"RUN_DIR", run_dir},
      {"RUNNER", shell_quote(o.runner_binary.empty() ? self_executable() : o.runner_binary)},
      {"WORLD", std::to_string(p.world)},
      {"RANKS", ranks(p.world)},
      {"DP", std::to_string(p.dp)},
      {"TP", std::to_string(p.tp)},
      {"PP", std::to_string(p.pp)},
      {"GLOBAL", std::to_string(p.global)},
      {"MICRO", std::to_string(p.micro)},
      {"ACCUM", std::to_string(p.accum)},
      {"DEVICES_PER_NODE", std::to_string(r.hardware.devices_per_node)},
      {"TASKS_PER_NODE", std::to_string(per_node)},
      {"NODES", en.min < nodes ? fmt::format("{}-{}", en.min, nodes) : std::to_string(nodes)},
      {"NODES_MAX", std::to_string(nodes)},
      {"NODES_WHY", en.why},
      {"NTASKS_LINE", ntasks_lines(en.min < nodes, nodes, per_node, p.world)},
      {"SRUN_NTASKS", en.min < nodes ? fmt::format("--ntasks=\"$(( SLURM_JOB_NUM_NODES * {0} ))\" --ntasks-per-node={0}", per_node)
                                     : fmt::format("--ntasks=\"${{SLURM_NTASKS:-{}}}\"", p.world)},
      {"GROW_BLOCK", en.min < nodes ? grow_block(nodes) : std::string()},
      {"SET_FLAGS", sets},
      {"CPUS_PER_TASK", std::to_string(cpus)},
      {"CPUS_WHY", cpus_why},
      {"GPUS_LINE", device_kind(r.hardware).host ? std::string()
                                                 : fmt::format("# One {} per rank.\n#SBATCH --gpus-per-node={}\n",
                                                               r.hardware.device, per_node)},
      {"PARTITION_LINE", o.partition.empty() ? std::string() : fmt::format("#SBATCH --partition={}\n", o.partition)},
      {"TIME", o.time},
      {"WARN", std::to_string(o.warn_seconds)},
      {"TRAIN_FLAGS", flags},
  };
  std::string text = o.template_text.empty() ? builtin_slurm_template() : o.template_text;
  std::string out;
  size_t pos = 0;
  for (;;) {
    size_t a = text.find("{{", pos);
    if (a == std::string::npos) break;
    size_t b = text.find("}}", a);
    if (b == std::string::npos) break;
    const std::string key = text.substr(a + 2, b - a - 2);
    auto it = fields.find(key);
    if (it == fields.end())
      throw UserError({"--template", 0, 0}, fmt::format("the template names an unknown field {{{{{}}}}}", key),
                      fmt::format("use the fields of scripts/slurm.sbatch.in: {}", [&] {
                        std::vector<std::string> k;
                        for (auto& [n, v] : fields) k.push_back(n);
                        return fmt::format("{}", fmt::join(k, ", "));
                      }()));
    out += text.substr(pos, a - pos) + it->second;
    pos = b + 2;
  }
  return out + text.substr(pos);
}

int launch_slurm(SlurmLaunchOptions o, const std::string& template_path, const std::string& out, bool dry_run,
                 bool submit) {
  if (dry_run && submit)
    throw UserError({"--submit", 0, 0}, "--dry-run prints the script and submits nothing, --submit submits it",
                    "give one of them");
  if (!template_path.empty()) {
    std::ifstream in(template_path);
    if (!in) throw UserError({template_path, 0, 0}, "cannot read the template", "give a readable file to --template");
    std::ostringstream t;
    t << in.rdbuf();
    o.template_text = t.str();
  }
  const Recipe r = load_recipe(o.recipe_path, o.sets);
  const Plan p = make_plan(r, 0);
  const std::string script = slurm_script(p, o);
  if (dry_run) {
    std::cout << script;
    return 0;
  }
  const fs::path run_dir = absolute(run_paths(r, o.run_dir).run_dir);
  fs::create_directories(run_dir);  // the job's output file goes there
  const fs::path path = out.empty() ? run_dir / "slurm.sbatch" : fs::path(out);
  {
    std::ofstream f(path, std::ios::trunc);
    if (!(f << script)) throw UserError({path.string(), 0, 0}, "cannot write the script", "give a writable path to --output");
  }
  fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec | fs::perms::others_exec, fs::perm_options::add);
  if (!submit) {
    std::cout << fmt::format("wrote {} ({} on {} node(s)); submit it with `sbatch {}`\n", path.string(), ranks(p.world),
                             (p.world + std::max<int64_t>(1, std::min(r.hardware.devices_per_node, p.world)) - 1) /
                                 std::max<int64_t>(1, std::min(r.hardware.devices_per_node, p.world)),
                             path.string());
    return 0;
  }
  const std::string cmd = "sbatch " + shell_quote(path.string()) + " 2>&1";
  FILE* pipe = ::popen(cmd.c_str(), "r");
  std::string said;
  if (pipe) {
    char buf[512];
    while (std::fgets(buf, sizeof buf, pipe)) said += buf;
  }
  const int status = pipe ? ::pclose(pipe) : -1;
  if (status != 0)
    throw UserError({path.string(), 0, 0}, fmt::format("sbatch failed: {}", said.empty() ? "could not run it" : said),
                    "run it where Slurm's client commands work (a login node; SLURM_CONF set), or submit the "
                    "written script yourself");
  std::cout << "wrote " << path.string() << "\n" << said;
  return 0;
}

void append_run_event(const std::string& run_dir, nlohmann::json record) {
  if (!record.contains("time")) record["time"] = now_utc();
  std::ofstream f(fs::path(run_dir) / "events.jsonl", std::ios::app);
  f << record.dump() << "\n";
  f.flush();
}

nlohmann::json start_event(const Plan& p, int64_t world, int64_t resumed_from, const std::vector<std::string>& notes) {
  const SlurmEnv env = slurm_env();
  nlohmann::json j{{"event", "start"}, {"time", now_utc()},   {"world", world},   {"dp", p.dp},
                   {"tp", p.tp},       {"pp", p.pp},          {"global", p.global}, {"micro", p.micro},
                   {"accum", p.accum}, {"resumed_from", resumed_from}, {"notes", notes}};
  char host[256] = {0};
  if (gethostname(host, sizeof host - 1) == 0) j["host"] = host;
  if (env.in_job)
    j["slurm"] = {{"job_id", env.job_id},   {"job_name", env.job_name}, {"restart_count", env.restart_count},
                  {"node_list", env.node_list}, {"ntasks", env.ntasks}, {"nnodes", env.nnodes}};
  return j;
}

}  // namespace runner
