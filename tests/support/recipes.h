// The recipes the tests share and the runs made from them: the layout-test recipe (trained
// under mpirun by the parallel, trace, report and generate tests), the tiny quickstart run, the
// full quickstart run with its learning curve, and what a run's metrics.jsonl says (the small
// ModelConfig of the graph-level tests is models.h). Design: a test names what differs from
// the shared recipe (a --set, its sizes) rather than copying it; scripts/behaviour_snapshot.py
// reads kLayoutRecipe out of this file, so its text stays one raw string here.
#pragma once
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/support/temp_dir.h"

namespace test_support {

namespace fs = std::filesystem;

// A 2-layer GPT with dropout 0.1 and a vocabulary of 63 that tensor parallelism must pad,
// learning 2-digit addition; global batch 8 of micro-batches of 2, 10 steps, checkpoints at 5.
inline const char* kLayoutRecipe = R"(name: layout
model:
  family: gpt
  vocab_size: 63
  seq_len: 32
  d_model: 64
  n_layers: 2
  n_heads: 4
  norm: layernorm
  activation: gelu
  position: learned
  tie_embeddings: true
  dropout: 0.1
data:
  kind: addition
  digits: 2
batch:
  global: 8
  micro: 2
optimizer:
  lr: 3.0e-3
  weight_decay: 0.1
  grad_clip: 1.0
  schedule:
    kind: cosine
    warmup_steps: 2
train:
  steps: 10
  log_every: 5
  eval_every: 5
  eval_batches: 2
  threads: 1
checkpoint:
  cadence: steps
  every_steps: 5
  keep_last: 5
hardware:
  device: cpu
)";

// kLayoutRecipe written to `dir`/`file` (`dir` made if missing); returns that file.
fs::path write_layout_recipe(const fs::path& dir, const std::string& file = "layout.yaml");

// A test binary's scratch directory <tmp>/runner_<name>_XXXXXX (removed with the object) with
// kLayoutRecipe written into it as layout.yaml at the first call of recipe(): the multi-rank
// tests train their runs in its subdirectories.
class LayoutScratch {
 public:
  explicit LayoutScratch(const std::string& name) : dir_(name) {}
  const fs::path& path() const { return dir_.path; }
  std::string recipe() const;

 private:
  TempDir dir_;
  mutable fs::path recipe_;
};

// One layout of the layout recipe, as the multi-rank tests list them: a name for its run
// directory, the ranks it takes and its --set overrides.
struct Layout {
  const char* name;
  int np;
  const char* sets;
};

// recipes/quickstart.yaml in the source tree.
std::string quickstart_recipe();
// recipes/quickstart-llama.yaml in the source tree: the Llama-style quickstart.
std::string quickstart_llama_recipe();

// The records of a run's metrics.jsonl, one JSON object a line.
std::vector<nlohmann::json> metrics_records(const fs::path& run_dir);

// A run's training loss per step: the records with a loss and a step that are neither an
// evaluation nor a rollback (nor, with `skip_summary`, the end-of-run summary).
std::map<int64_t, double> step_losses(const fs::path& run_dir, bool skip_summary = false);

// The --set overrides that turn the quickstart's GPT-2 style model into the Llama style.
inline const char* kLlamaSets = "model.norm=rmsnorm model.activation=swiglu model.position=rope model.bias=false";

// Invariant 4 on a finished run (docs/invariants.md): rank 0's measured peak of each memory
// account within 5% of the plan's prediction for its stage (the summary record's ledger).
void check_ledger(const fs::path& run_dir);

// `train` of the quickstart recipe at a tiny size (2 layers, d_model 32, 2 heads, context
// `seq_len`) for `steps` steps into `run`, no evaluation, one checkpoint at the last step.
std::string tiny_quickstart_args(const fs::path& run, int steps, int seq_len);

// The tiny quickstart trained for `steps` steps at learning rate `lr`, with `extra` --set
// overrides, context 32, in <tmp>/runner_<name>_run_<pid> (removed at the end); the run
// directory is `run`.
struct TinyQuickstartRun {
  fs::path dir, run;
  TinyQuickstartRun(const std::string& name, int steps, const std::string& lr, const std::string& extra);
  ~TinyQuickstartRun();
};

// The TinyQuickstartRun called `name`, trained at its first use and kept for the whole test
// binary (the generate tests share one trained model per style).
const TinyQuickstartRun& tiny_quickstart(const std::string& name, int steps, const std::string& lr,
                                         const std::string& extra = "");

// The full quickstart recipe (or another one, `recipe`) trained through the binary, and what
// its metrics say: the held-out loss and accuracy, and the mean training loss per 250-step
// window (test_quickstart.cpp, the 16-bit soak test_quickstart16.cpp, test_quickstart_llama.cpp).
namespace quickstart {

struct Run {
  double first_val = -1, last_val = -1, accuracy = -1;
  std::vector<double> window_means;  // mean training loss per 250 steps
};

Run train(const std::string& precision, const std::string& recipe = quickstart_recipe());
// The same, one process per precision at once, one thread each: on a small machine several
// single-thread runs finish sooner than the same runs in turn on every core (the quickstart's
// steps barely scale with threads), and a step's numbers do not depend on the thread count.
std::vector<Run> train_at_once(const std::vector<std::string>& precisions,
                               const std::string& recipe = quickstart_recipe());
const Run& fp32();  // trained once per test binary
void check_learns(const Run& r);

}  // namespace quickstart

}  // namespace test_support
