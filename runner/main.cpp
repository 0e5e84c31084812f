// The `runner` command line: plan, train, resume, inspect, data prepare.
//
// Every user error ends here as `file:line:col: what; how to fix` on stderr with exit
// code 2, before anything is allocated or written.
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <filesystem>
#include <iostream>
#include <optional>

#include <unistd.h>

#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "ops/backend.h"
#include "ops/gemm_path.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/isolated.h"
#include "runner/run/run_dir.h"
#include "runner/data/data.h"
#include "runner/errors.h"
#include "runner/export/export.h"
#include "runner/generate/generate.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/report/report.h"
#include "runner/signals.h"
#include "runner/device/device.h"
#include "runner/train/launch.h"
#include "runner/run/slurm.h"

using namespace runner;

int main(int argc, char** argv) {
  disable_hdf5_exit_cleanup();  // a failed write's half-closed file must not crash the exit
  CLI::App app{"runner: a declarative training job runner for transformer language models"};
  app.set_version_flag("--version", std::string("runner ") + RUNNER_VERSION);
  app.require_subcommand(1);

  std::string recipe_path;
  std::vector<std::string> sets;
  bool json = false;
  int64_t world = 0;
  auto* plan_cmd = app.add_subcommand("plan", "check a recipe and print its plan and per-rank memory ledger");
  plan_cmd->add_option("recipe", recipe_path, "recipe YAML")->required();
  plan_cmd->add_option("--set", sets, "override a recipe field, e.g. --set batch.micro=8")->take_all();
  plan_cmd->add_flag("--json", json, "print the plan as JSON (the same as the run directory's plan.json)");
  plan_cmd->add_option("--world", world, "plan for this many ranks (default: from the recipe)");

  TrainOptions topts;
  auto* train_cmd = app.add_subcommand("train", "train a recipe (under mpirun or srun for several ranks)");
  train_cmd->add_option("recipe", recipe_path, "recipe YAML")->required();
  train_cmd->add_option("--set", sets, "override a recipe field, e.g. --set train.steps=100")->take_all();
  train_cmd->add_option("--run-dir", topts.run_dir, "run directory (default: train.run_dir or runs/<name>)");
  train_cmd->add_flag("--quiet", topts.quiet, "no progress lines on stdout (the log file keeps them)");
  train_cmd->add_option("--profile", topts.profile,
                        "per-operator profile of steps FROM:TO (e.g. 20:30): forward, backward, recompute; RUN_DIR/profile.json");

  std::string resume_dir;
  auto* resume_cmd = app.add_subcommand("resume", "continue a run from its last checkpoint");
  resume_cmd->add_option("run_dir", resume_dir, "run directory")->required();
  resume_cmd->add_option("--step", topts.resume_step, "resume from this step's checkpoint instead of LATEST")
      ->check(CLI::Validator(
          [](std::string& v) { return v.rfind('-', 0) == 0 ? std::string("a step is >= 0 (omit --step for LATEST)") : ""; },
          "STEP>=0"));
  resume_cmd->add_flag("--strict", topts.strict, "fail on a corrupt checkpoint instead of falling back");
  resume_cmd->add_flag("--quiet", topts.quiet, "no progress lines on stdout (the log file keeps them)");
  for (CLI::App* c : {train_cmd, resume_cmd})
    c->add_flag("--diagnose-precision", topts.diagnose_precision,
                "per parameter tensor and logged step: largest gradient, fraction that would underflow in fp16 at the "
                "loss scale, headroom to overflow; warns when no single scale suits every tensor (precision.diagnostics)");
  resume_cmd->add_option("--set", sets,
                         "override a field of the stored recipe, e.g. --set parallel.tp=2 to resume on another layout")
      ->take_all();
  train_cmd->add_flag("--strict", topts.strict, "when resuming, fail on a corrupt checkpoint instead of falling back");

  std::string ckpt_path;
  auto* inspect_cmd = app.add_subcommand("inspect", "print what a checkpoint holds and verify its checksums");
  inspect_cmd->add_option("checkpoint", ckpt_path, "checkpoint .h5 file")->required();

  // Hidden: resume verification under MPI runs here, in a fresh process (runner/checkpoint/isolated.h).
  std::string verify_path;
  auto* verify_cmd = app.add_subcommand("__verify-checkpoint", "")->group("");
  verify_cmd->add_option("checkpoint", verify_path)->required();

  std::string text_path, out_path;
  auto* data_cmd = app.add_subcommand("data", "data utilities");
  data_cmd->require_subcommand(1);
  auto* prep_cmd = data_cmd->add_subcommand("prepare", "turn a text file into an HDF5 token dataset (byte-level)");
  prep_cmd->add_option("text", text_path, "UTF-8 text file")->required();
  prep_cmd->add_option("out", out_path, "output .h5 file")->required();

  std::string report_dir;  // runner report RUN_DIR
  auto* report_cmd = app.add_subcommand("report", "write RUN_DIR/report.html: curves, breakdown, memory, operators, alerts (one self-contained file)");
  report_cmd->add_option("run_dir", report_dir, "run directory (runs/NAME)")->required();

  // runner export (runner/export/): a trained model as safetensors (Hugging Face layouts) or npz.
  std::string export_src, export_out, export_format = "safetensors", export_dtype = "fp32";
  auto* export_cmd = app.add_subcommand("export", "write a trained model as safetensors + config.json (Hugging Face "
                                                  "GPT-2 / Llama layouts) or npz");
  export_cmd->add_option("source", export_src, "run directory (its latest checkpoint) or checkpoint .h5 file")->required();
  export_cmd->add_option("--out", export_out, "output directory")->required();
  export_cmd->add_option("--format", export_format, "safetensors (default) or npz")
      ->check(CLI::IsMember({"safetensors", "npz"}));
  export_cmd->add_option("--dtype", export_dtype, "tensor type: fp32 (default), bf16 or fp16 (safetensors only)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));

  // runner generate (runner/generate/): completions of byte-level prompts.
  std::string gen_src, gen_prompt, gen_prompts_file;
  GenerateRequest gen;
  bool gen_json = false;
  auto* gen_cmd = app.add_subcommand("generate", "complete prompts with a trained model (byte-level tokens)");
  gen_cmd->add_option("source", gen_src, "run directory (its latest checkpoint) or checkpoint .h5 file")->required();
  auto* gp = gen_cmd->add_option("--prompt", gen_prompt, "the prompt text");
  auto* gpf = gen_cmd->add_option("--prompts", gen_prompts_file, "a file of prompts, one per line, completed as one batch");
  gp->excludes(gpf);
  gen_cmd->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate per prompt (default 32)");
  gen_cmd->add_option("--temperature", gen.sampling.temperature, "0 (default): greedy; > 0: sample");
  gen_cmd->add_option("--top-k", gen.sampling.top_k, "sample among the k most likely tokens (0: all)");
  gen_cmd->add_option("--top-p", gen.sampling.top_p, "sample within the smallest set of probability >= p (1: all)");
  gen_cmd->add_option("--seed", gen.sampling.seed, "sampling seed (default 0)");
  gen_cmd->add_option("--stop", gen.stop, "end a completion once it ends with this text, e.g. --stop $'\\n'");
  std::vector<std::string> gen_sets;
  gen_cmd->add_option("--set", gen_sets, "override a field of the stored recipe, e.g. --set inference.batch=8")->take_all();
  gen_cmd->add_flag("--json", gen_json, "one JSON record per prompt instead of the text");
  bool gen_no_cache = false, gen_stats = false;
  gen_cmd->add_flag("--stats", gen_stats, "print one JSON line to stderr: prefill and decode tokens and seconds, KV-cache bytes, "
                    "peak bytes per memory account beside the plan's inference figures");
  gen_cmd->add_flag("--no-kv-cache", gen_no_cache, "no KV cache: every step a full forward pass over the prefix (the reference)");
  std::string gen_logits_out;
  gen_cmd->add_option("--logits-out", gen_logits_out, "write the logits each token was chosen from (fp32, the real vocabulary, "
                      "in the order the tokens are chosen) to this file (rank 0)");

  // Slurm: `runner launch --slurm`, `runner status`, `runner train --elastic` (runner/run/slurm.h).
  bool elastic = false, slurm = false, submit = false, dry_run = false, status_json = false;
  train_cmd->add_flag("--elastic", elastic,
                      "on a world size other than the recipe's layout (a job requeued on fewer or more ranks), continue "
                      "at the dp it gives with the same global batch, accum derived again (train.elastic)");
  SlurmLaunchOptions lopts;
  std::string script_out, template_path, status_dir;
  auto* launch_cmd = app.add_subcommand("launch", "write, print or submit the batch script that trains a recipe under Slurm");
  launch_cmd->add_option("recipe", lopts.recipe_path, "recipe YAML")->required();
  launch_cmd->add_flag("--slurm", slurm, "an sbatch script (Slurm is the one scheduler so far)")->required();
  launch_cmd->add_option("--set", lopts.sets, "override a recipe field (passed on to `runner train`)")->take_all();
  launch_cmd->add_option("--run-dir", lopts.run_dir, "run directory (default: train.run_dir or runs/<name>)");
  launch_cmd->add_option("--time", lopts.time, "wall-clock limit (sbatch --time), e.g. 04:00:00")->capture_default_str();
  launch_cmd->add_option("--warn", lopts.warn_seconds, "seconds before the limit at which the ranks are told to checkpoint "
                                                       "and exit (--signal=USR1@N)")->capture_default_str();
  launch_cmd->add_option("--cpus-per-task", lopts.cpus_per_task, "cores per rank (default: train.threads, else 1)");
  launch_cmd->add_option("--partition", lopts.partition, "Slurm partition");
  launch_cmd->add_option("--job-name", lopts.job_name, "job name (default: the recipe's name)");
  launch_cmd->add_flag("--elastic", lopts.elastic, "a requeued or resubmitted job may continue on another number of ranks");
  launch_cmd->add_option("--template", template_path, "your own template (default: the built-in scripts/slurm.sbatch.in)");
  launch_cmd->add_option("-o,--output", script_out, "where to write the script (default: RUN_DIR/slurm.sbatch)");
  launch_cmd->add_flag("--dry-run", dry_run, "print the script and write nothing");
  launch_cmd->add_flag("--submit", submit, "write the script and submit it with sbatch");
  auto* status_cmd = app.add_subcommand("status", "where a run stands: step, checkpoint, restarts, Slurm job, ETA");
  status_cmd->add_option("run_dir", status_dir, "run directory")->required();
  status_cmd->add_flag("--json", status_json, "print it as JSON");

  // An unknown command is named (CLI11 would only say an argument was not expected).
  if (argc > 1 && argv[1][0] != '-') {
    bool known = false;
    std::string names;  // listed from the parser, so a new command is never left out
    for (const CLI::App* c : app.get_subcommands({})) {
      known = known || c->check_name(argv[1]);
      if (!c->get_group().empty()) names += (names.empty() ? "" : ", ") + c->get_name();
    }
    if (!known) {
      std::fprintf(stderr, "unknown command '%s'; the commands are %s (see runner --help)\n", argv[1], names.c_str());
      return kExitUserError;
    }
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : kExitUserError;
  }

  if (*verify_cmd) {  // no MPI, no logging: one record on stdout (isolated.cpp reads it)
    const std::string rec = verify_record(verify_path);
    return std::fwrite(rec.data(), 1, rec.size(), stdout) == rec.size() && std::fflush(stdout) == 0 ? 0 : 1;
  }
  {
    char exe[4096];
    if (const ssize_t n = ::readlink("/proc/self/exe", exe, sizeof exe - 1); n > 0) set_checkpoint_verifier(std::string(exe, n));
  }
  std::optional<Launch> launch;
  if (*train_cmd || *resume_cmd) {
    install_signal_handlers();  // Slurm's warning may come during start-up: it must not kill the process
    launch.emplace(&argc, &argv);
  }
  if (*gen_cmd && parallel::mpi_launched()) launch.emplace(&argc, &argv);  // generation over the recipe's tp layout
  const bool quiet_rank = launch && launch->rank() != 0;  // identical errors print once
  try {
    if (*train_cmd || *resume_cmd) ops::cpu_backend();  // selects OpenBLAS's kernels before any GEMM runs
    if (*plan_cmd) {
      try {
        ops::gemm_mode_from_env();
      } catch (const std::invalid_argument& e) {
        throw UserError({}, e.what(), "set RUNNER_GEMM_PATH to auto, onednn or sgemm, or unset it");
      }
      Plan p = make_plan(load_recipe(recipe_path, sets), world);
      if (json) std::cout << p.to_json().dump(2) << "\n";
      else std::cout << p.table();
      return 0;
    }
    if (*train_cmd) {
      Recipe recipe = fit_allocation(load_recipe(recipe_path, sets), launch->world_size(), elastic, &topts.resume_notes);
      select_backend(recipe);  // a GPU device without a usable GPU: exit 2 before anything is written
      if (recipe.precision.compute != FloatFormat::fp32) launch->agree_gemm_paths(run_paths(recipe, topts.run_dir).run_dir);
      return launch->train(make_plan(recipe, launch->world_size()), topts);
    }
    if (*resume_cmd) {
      ResumeRequest req = prepare_resume(resume_dir, sets, topts.resume_step, topts.strict);
      select_backend(req.recipe);
      topts.run_dir = resume_dir;
      topts.resume = true;
      topts.resume_point = req.point;
      topts.resume_notes = req.notes;
      if (req.recipe.precision.compute != FloatFormat::fp32) launch->agree_gemm_paths(resume_dir);
      return launch->train(make_plan(req.recipe, launch->world_size()), topts);
    }
    if (*launch_cmd) return launch_slurm(lopts, template_path, script_out, dry_run, submit);
    if (*status_cmd) {
      if (status_json) std::cout << run_status_json(status_dir).dump(2) << "\n";
      else std::cout << run_status(status_dir);
      return 0;
    }
    if (*report_cmd) {
      ReportInfo r = write_report(report_dir);
      std::cout << "wrote " << r.path.string() << " (" << r.steps << " steps" << (r.finished ? "" : ", run in progress")
                << (r.profiled ? ", profiled" : "") << ")\n";
      return 0;
    }
    if (*inspect_cmd) {
      bool ok = false;
      std::cout << inspect_checkpoint_isolated(ckpt_path, &ok);  // a crash in HDF5 is a corrupt file
      return ok ? 0 : kExitUserError;
    }
    if (*gen_cmd) {
      if (!gen_prompts_file.empty()) {
        std::ifstream pf(gen_prompts_file);
        if (!pf) throw UserError({gen_prompts_file, 0, 0}, "cannot read the prompts file", "pass a text file, one prompt per line");
        for (std::string line; std::getline(pf, line);)
          if (!line.empty()) gen.prompts.push_back(line);
      } else if (!gp->empty()) {
        gen.prompts.push_back(gen_prompt);
      }
      ops::cpu_backend();
      gen.kv_cache = !gen_no_cache;
      // One process: any layout's checkpoint (tp, pp included) loads into one rank. Under mpirun:
      // the recipe's tensor-parallel layout (dp = ranks / tp replicas, every rank the same
      // tokens, rank 0 prints); a pp recipe is refused there (docs/generate.md).
      TrainedModel m = load_trained_model(gen_src, gen_sets, launch ? launch->take_world() : nullptr);
      const bool printer = !quiet_rank;
      std::ofstream logits_out;
      if (printer && !gen_logits_out.empty()) {
        logits_out.open(gen_logits_out, std::ios::binary);
        if (!logits_out) throw UserError({gen_logits_out, 0, 0}, "cannot write the logits file", "pass a writable path");
        gen.on_logits = [&](size_t, const float* L, int64_t V) {
          logits_out.write(reinterpret_cast<const char*>(L), static_cast<std::streamsize>(V * sizeof(float)));
        };
      }
      const bool stream = printer && !gen_json && gen.prompts.size() == 1;
      bool started = false;  // the prompt is echoed with the first token: an error prints nothing on stdout
      GenerateStats gstats;
      ops::MemoryTracker::instance().reset_peaks();
      auto done = generate(m, gen, [&](size_t, int32_t t) {
        if (!stream) return;
        if (!started) std::cout << gen.prompts[0];
        started = true;
        std::cout << static_cast<char>(t) << std::flush;
      }, &gstats);
      if (!printer) return 0;
      if (gen_stats) {
        auto& mt = ops::MemoryTracker::instance();
        nlohmann::json peak;
        for (int a = 0; a < ops::kAccounts; ++a)
          peak[ops::account_name(static_cast<ops::Account>(a))] = mt.peak(static_cast<ops::Account>(a));
        nlohmann::json j{{"batch", gen.prompts.size()}, {"kv_cache", gen.kv_cache},
                         {"prefill_tokens", gstats.prefill_tokens}, {"prefill_s", gstats.prefill_s},
                         {"decode_tokens", gstats.decode_tokens}, {"decode_s", gstats.decode_s},
                         {"kv_cache_bytes", gstats.kv_cache_bytes}, {"peak_bytes", peak}};
        if (m.plan.inference)
          j["plan"] = {{"batch", m.plan.inference->batch}, {"context", m.plan.inference->context},
                       {"kv_dtype", m.plan.inference->kv_dtype}, {"kv_cache_bytes", m.plan.inference->kv_cache},
                       {"weights_bytes", m.plan.inference->weights}, {"max_batch", m.plan.inference->max_batch}};
        std::cerr << j.dump() << std::endl;
      }
      for (size_t i = 0; i < done.size(); ++i) {
        const Completion& c = done[i];
        if (gen_json) {
          nlohmann::json j{{"index", i}, {"prompt", c.prompt}, {"completion", c.completion},
                           {"new_tokens", c.tokens.size()}, {"tokens", c.tokens}, {"finish", c.finish}};
          std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
        } else {
          if (!stream) std::cout << c.prompt << c.completion;
          if (c.completion.empty() || c.completion.back() != '\n') std::cout << "\n";
        }
      }
      return 0;
    }
    if (*export_cmd) {
      ops::DType dt = ops::DType::F32;
      ops::parse_dtype(export_dtype, &dt);
      TrainedModel m = load_trained_model(export_src);
      ExportResult r = export_model(m, export_format == "npz" ? ExportFormat::npz : ExportFormat::safetensors, export_out, dt);
      std::cout << "exported step " << m.step << " of " << m.checkpoint << " (" << r.style << " layout, " << r.tensors
                << " tensors, " << r.bytes << " bytes) to " << r.weights_path << " and " << r.config_path << "\n";
      return 0;
    }
    if (*prep_cmd) {
      install_signal_handlers();
      int64_t n = prepare_text_to_hdf5(text_path, out_path, &stop_flag());
      std::cout << "wrote " << n << " tokens to " << out_path << "\n";
      return 0;
    }
  } catch (const UserError& e) {
    std::cout.flush();
    if (!quiet_rank) std::fprintf(stderr, "%s\n", e.what());
    return kExitUserError;
  } catch (const std::filesystem::filesystem_error& e) {  // issue 13: no exception reaches terminate
    std::cout.flush();
    std::fprintf(stderr, "%s: %s (%s)\n", e.path1().c_str(), e.code().message().c_str(), e.what());
    return kExitUserError;
  } catch (const std::exception& e) {
    std::cout.flush();
    std::fprintf(stderr, "error: %s\n", e.what());
    return kExitUserError;
  }
  return 0;
}
