// The plan: what a recipe resolves to before any compute is spent.
//
// make_plan() resolves the process grid and the batch equation (global = micro x dp x
// accum), checks every layout rule (resolve.cpp), derives the model's layout once (one
// graph per virtual pipeline stage and the logical parameter table, runner/model/layout.h),
// computes the per-rank memory ledger by dry-running the executor over those graphs along
// each stage's pipeline schedule (ledger.cpp; invariant 1: the ledger reads the graph),
// sizes inference, and for a recipe that does not fit searches for changes that do
// (suggest.cpp). Problems a user can fix are UserErrors at the recipe field's file:line:col.
// Everything downstream (the trainer, every checkpoint path) reads the plan's numbers, its
// layout and its schedule instead of deriving them again.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "parallel/pipeline.h"
#include "runner/model/gpt.h"
#include "runner/model/layout.h"
#include "runner/recipe/recipe.h"

namespace runner {

// Bytes per rank of one pipeline stage (all tensor-parallel ranks of a stage are alike).
struct StageLedger {
  int stage = 0;
  int64_t first_layer = 0, last_layer = 0;  // [first, last)
  int64_t params = 0;                       // parameter elements held by one rank
  double parameters = 0;                    // weights in the compute dtype
  double gradients = 0;                     // in the gradient-accumulation dtype
  double optimizer = 0;                     // Adam m, v (+ fp32 master weights), / dp under ZeRO-1
  double activations = 0;                   // peak: in-flight micro-batches x per-micro + recompute transient
  double activations_per_micro = 0;         // held for backward after one micro-batch's forward
  double recompute_transient = 0;           // rebuilt during backward for one recompute segment
  int64_t micro_in_flight = 1;              // 1F1B: p - stage; GPipe: all micro-batches
  double workspace = 0;                     // activation gradients and forward temporaries at peak
  double communication = 0;                 // gradient buckets, tp and pipeline buffers
  double total() const { return parameters + gradients + optimizer + activations + workspace + communication; }
};

struct InferencePlan {
  int64_t batch = 1, context = 0;
  std::string kv_dtype;
  double weights = 0;        // per rank, worst stage
  double kv_cache = 0;       // per rank, worst stage, at `batch`
  double kv_per_sequence = 0;
  int64_t max_batch = 0;     // largest batch whose KV cache fits beside the weights
};

// recompute.mode auto (recompute.cpp): what was chosen and why. A step recomputes one more
// piece of one layer: a module (norm, attention_core, attention, mlp) or the rest of the whole
// layer ("layer": everything, the residual adds included, as mode full does).
struct RecomputeStep {
  int stage = 0;
  int64_t layer = 0;
  std::string module;      // the step kind: a module's name (ops::module_name) or "layer"
  double bytes_saved = 0;  // activation bytes held per micro-batch that this step frees (dry run)
  double flops = 0;        // forward FLOPs it adds per micro-batch (this rank's shard)
};

// One step kind on one layer with nothing else recomputed, and the rule of thumb beside it.
struct RecomputeModuleCost {
  std::string module;                 // the step kind, as RecomputeStep::module
  double bytes_saved = 0, flops = 0;  // recomputing it alone in one layer
  double activation_bytes = 0;        // held for backward by the nodes of this module, nothing recomputed ("layer": all)
  double share = 0;                   // activation_bytes / the layer's total
  bool rule_of_thumb = false;         // share > 15%: the seed rule says recompute it
};

struct RecomputeStageChoice {
  int stage = 0;
  double before = 0, after = 0;  // the stage's total bytes per rank without recompute and with the choice
  int64_t candidates = 0;        // steps available on its candidate layers
};

struct RecomputeAuto {
  std::vector<RecomputeStep> chosen;            // in the order chosen (bytes saved per FLOP, best first)
  std::vector<RecomputeModuleCost> modules;     // per step kind, one layer
  double layer_activation_bytes = 0;            // one layer's activations held, nothing recomputed
  std::vector<RecomputeStageChoice> stages;
  std::vector<ops::ModuleSet> sets;             // the resolved per-layer sets the layout was built with
};

struct Plan {
  Recipe recipe;
  int64_t world = 1, dp = 1, tp = 1, pp = 1;
  int64_t global = 0, micro = 0, accum = 0;
  std::vector<std::string> derived;   // which of global/micro/accum were derived
  int64_t vocab_padded = 0;
  std::vector<int64_t> stage_layers;
  int64_t chunks = 1;                 // model chunks per pipeline stage (interleaved: virtual_stages)
  double bubble = 0;                  // (p-1)/(v*m + p-1)
  int64_t param_count = 0;            // logical model parameters (padded vocabulary included)
  int64_t tokens_per_step = 0;
  double flops_per_token = 0;         // training FLOPs per token (6N + attention)
  std::vector<StageLedger> stages;
  double device_memory = 0;           // bytes per device (the device table, runner/device/devices.h)
  // Peak FLOP/s per device for MFU: hardware.peak_tflops, else the device table's for
  // precision.compute; 0: unknown, the trainer measures the host's at start.
  double peak_flops = 0;
  bool fits = true;
  std::vector<std::string> notes, warnings, suggestions;
  std::optional<InferencePlan> inference;
  std::optional<RecomputeAuto> recompute_auto;  // recompute.mode auto: the choice (recompute.cpp)

  std::shared_ptr<const ModelLayout> layout;  // per virtual stage its graph; the logical parameter table

  const StageLedger& worst_stage() const;
  // The order of forward and backward passes on pipeline stage `stage` (1F1B on one stage
  // without pipelining): what the trainer runs and the ledger replays.
  std::vector<parallel::PipeAction> schedule(int stage) const;
  // "(p-1)/(m+p-1){sep}p=2 m=8", or with virtual stages "(p-1)/(v*m+p-1){sep}p=2 v=2 m=8".
  std::string bubble_formula(const char* sep) const;
  nlohmann::json to_json() const;
  std::string table() const;          // the human report
};

// world_size 0: take it from the recipe (dp x tp x pp when dp is given, else hardware
// nodes x devices_per_node). A nonzero world_size (the MPI world) must match the recipe.
Plan make_plan(const Recipe& r, int64_t world_size = 0);

// The pieces of make_plan the layout search (runner/perf/search.cpp) re-plans its candidates
// with, cheaper than the whole: the grid alone, the batch equation and layout rules on a plan
// whose grid is set, and a plan without the suggestions a misfit would get.
namespace plan_detail {
void resolve_grid(const Recipe& r, int64_t world_size, Plan& p);
void resolve_and_check(const Recipe& r, Plan& p);
Plan make_plan(const Recipe& r, int64_t world_size, bool with_suggestions);
size_t dtype_bytes(const std::string& name);      // fp32 4, int8 1, bf16/fp16 2
std::string join(const std::vector<int64_t>& v);  // "1, 2, 3"
}  // namespace plan_detail

std::string format_bytes(double bytes);  // "3.21 GiB"

}  // namespace runner
