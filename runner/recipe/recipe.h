// The typed recipe.
//
// The structs below hold every field with its default (the initialisers are the only
// defaults in C++). runner/recipe/fields.h names each field's recipe key once; reading,
// writing back and the schema consistency test all walk that list. load_recipe()
// validates the YAML against schemas/recipe.schema.json (editors complete from it; a test
// checks that it and fields.h declare the same keys, types, words and defaults), then
// fills these plain structs. Nothing after loading reads raw YAML. Closed sets of words
// are enums (runner/recipe/enums.h). Every field remembers where it came from
// (Recipe::loc) so that later checks (the plan's batch equation, divisibility rules) can
// still say file:line:col.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "runner/errors.h"
#include "runner/recipe/enums.h"

namespace runner {

struct ModelConfig {
  ModelFamily family = ModelFamily::gpt;
  int64_t vocab_size = 256;
  int64_t seq_len = 256;
  int64_t d_model = 384;
  int64_t n_layers = 6;
  int64_t n_heads = 6;
  int64_t n_kv_heads = 0;          // key-value heads (grouped-query attention); 0: n_heads
  double mlp_ratio = 4.0;          // hidden width = round(mlp_ratio * d_model)
  Norm norm = Norm::layernorm;
  Activation activation = Activation::gelu;
  Position position = Position::learned;
  bool tie_embeddings = true;
  bool bias = true;                // biases in linear layers and layernorm
  double dropout = 0.0;
  double norm_eps = 1e-5;
  double rope_theta = 10000.0;
  double init_std = 0.02;
  std::string init_from;           // a checkpoint (runner import's output) the run starts from; empty: random init
  // Fuse the MLP's fc Linear with its GELU (ops/op_fused.cpp) where the graph allows it (fp32
  // activations, no sequence parallelism). Not the model: results are bit-identical either way.
  bool fuse = true;
  int64_t mlp_hidden() const;      // the MLP width H
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
};

// One dataset of a weighted mix (data.mix): a directory `runner data prepare` wrote, drawn
// from in proportion to `weight` (weights need not sum to 1).
struct DataMixEntry {
  std::string path;
  double weight = 1.0;
  SourceLoc loc;                   // where the entry's path was written (not a recipe key)
};

struct DataConfig {
  DataKind kind = DataKind::addition;
  std::string path;                // text file, HDF5 token file, or .bin token file
  std::string val_path;            // optional held-out file (else the last val_fraction of path)
  double val_fraction = 0.05;
  std::string dataset = "tokens";  // dataset name inside an HDF5 token file
  std::string tokenizer;           // optional: the tokenizer the data must have been prepared with
  int64_t digits = 3;              // addition: operand digits
  int64_t workers = 1;             // background loader threads
  int64_t prefetch = 4;            // batches prepared ahead
  std::vector<DataMixEntry> mix;   // several prepared datasets with weights (instead of path)
};

struct ParallelConfig {
  int64_t dp = 0;                  // 0: derived from world size / (tp*pp)
  int64_t tp = 1;
  int64_t pp = 1;
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  int64_t virtual_stages = 1;      // interleaved 1F1B: model chunks per stage
  int64_t zero = 0;                // 0..3: what is sharded over dp (optimizer, +gradients, +parameters)
  // zero 3: free each layer's gathered parameters after its forward and gather them again for
  // its backward; false keeps every layer's gathered weights from forward to backward.
  bool reshard_after_forward = true;
  bool sequence_parallel = false;
  std::vector<int64_t> stage_layers;  // explicit split of n_layers over pp stages (empty: even)
  double bucket_mb = 25.0;
  // `parallel: auto` (or auto: true beside fixed fields): the layout is searched at plan and
  // train start (runner/perf/search.h); the fields written beside it are constraints.
  bool search = false;
};

struct BatchConfig {
  int64_t global = 0;  // 0: derive (sequences per optimizer step)
  int64_t micro = 0;   // 0: derive (sequences per micro-batch per dp rank)
  int64_t accum = 0;   // 0: derive (micro-batches per step per dp rank)
};

struct LossScaleConfig {
  LossScaleMode mode = LossScaleMode::dynamic;  // fp16 only
  double init = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  double min_scale = 1.0;          // dynamic: the scale never backs off below this
  int64_t max_consecutive_skips = 20;  // dynamic: this many overflowed steps in a row stop the run (exit 4)
};

struct PrecisionConfig {
  FloatFormat compute = FloatFormat::fp32;
  MasterWeights master_weights = MasterWeights::fp32;  // same: keep no fp32 master copy
  FloatFormat grad_accum = FloatFormat::fp32;
  // compute: the output layer's backward reads the logits' fp32 gradient rounded to the compute
  // format, so its two GEMMs take the 16-bit path (docs/precision.md, "The logits' gradient").
  LogitsGrad logits_grad = LogitsGrad::fp32;
  LossScaleConfig loss_scale;
  bool diagnostics = false;        // per-tensor gradient range per logged step (--diagnose-precision)
};

struct RecomputeConfig {
  RecomputeMode mode = RecomputeMode::none;
  std::vector<int64_t> layers;        // layers that recompute (empty: all layers)
  std::vector<RecomputeModule> modules;  // selective only
};

struct ScheduleConfig {
  LrSchedule kind = LrSchedule::cosine;
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;    // final lr = min_lr_ratio * lr
};

struct OptimizerConfig {
  OptimizerName name = OptimizerName::adamw;
  double lr = 3e-4;
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;
  double grad_clip = 1.0;  // 0 disables clipping
  ScheduleConfig schedule;
};

struct CheckpointConfig {
  std::string dir;                 // default: RUN_DIR/checkpoints
  CheckpointCadence cadence = CheckpointCadence::steps;
  int64_t every_steps = 0;         // cadence steps
  double every_minutes = 0.0;      // cadence minutes
  int64_t keep_last = 3;
  int64_t keep_every = 0;          // also keep every N-th step for the long term (0: none)
  bool async = false;
  MomentFormat optimizer_dtype = MomentFormat::fp32;  // bf16 halves the file, breaks bit-exactness
  int64_t snapshot_every = 0;      // in-memory snapshot cadence (0: off)
  double spike_threshold = 0.0;    // roll back when loss > threshold x running mean (0: off)
};

struct HardwareConfig {
  std::string device = "cpu";      // a kind of the device table (runner/device/devices.cpp)
  double memory_gb = 0.0;          // per device (0: from device kind; cpu: host memory)
  int64_t devices_per_node = 1;
  int64_t nodes = 1;
  double peak_tflops = 0.0;        // for MFU (0: from device kind; cpu: measured)
  // The topology the layout search prices communication with (runner/perf/hardware_profile.h);
  // 0: the device kind's (or the calibrated profile's) figure.
  double intra_node_gbps = 0.0;    // GB/s per direction between devices of one node
  double inter_node_gbps = 0.0;    // GB/s per direction between nodes (per device)
  double intra_node_latency_us = 0.0;
  double inter_node_latency_us = 0.0;
  std::string profile;             // a hardware profile written by `runner calibrate`; empty: built in
};

struct TrainConfig {
  int64_t steps = 100;
  int64_t seed = 1234;
  int64_t log_every = 10;
  int64_t monitor_every = 0;       // monitor record and line; 0: log_every's multiple of at least 100 steps
  int64_t eval_every = 0;          // 0: only at the end
  int64_t eval_batches = 8;
  int64_t threads = 0;             // 0: OMP_NUM_THREADS or all cores
  std::string run_dir;             // default runs/<name>
  bool elastic = false;            // continue at another world size, same global batch (runner/run/slurm.h)
  // Failures (docs/slurm.md): restarts after a node or rank failure, and the watchdog.
  int64_t max_restarts = 3;        // automatic restarts after a failure (not a preemption); 0: none
  double restart_backoff = 30.0;   // seconds before the first restart; doubled for each further one
  double collective_timeout = 0.0; // seconds a collective/send/recv or a step may take; 0: from the model
};

// Medium-depth profiling (runner/observe/op_profile.h); `runner train --profile` overrides it.
struct ProfileConfig {
  std::string steps;               // "FROM:TO" or one step; empty: off
};

struct InferenceConfig {
  int64_t batch = 1;
  int64_t context = 0;             // 0: model.seq_len
  KvFormat kv_dtype = KvFormat::bf16;
};

struct Recipe {
  std::string name;
  ModelConfig model;
  DataConfig data;
  ParallelConfig parallel;
  BatchConfig batch;
  PrecisionConfig precision;
  RecomputeConfig recompute;
  OptimizerConfig optimizer;
  CheckpointConfig checkpoint;
  HardwareConfig hardware;
  TrainConfig train;
  std::optional<InferenceConfig> inference;
  ProfileConfig profile;

  std::string source_file;                 // path the recipe was read from
  std::string source_text;                 // the YAML text as read; each --set override is appended
                                           // as a "# --set a.b=v" comment line, so file line numbers hold
  std::map<std::string, SourceLoc> locs;   // dotted path ("batch.micro", list items "recompute.layers[1]")
                                           // -> where its key was written ("--set" for overrides)

  // Where a field was written; falls back to its nearest written parent, then to the file.
  SourceLoc loc(const std::string& dotted_path) const;
};

// Reads, schema-validates and types a recipe. `overrides` are "a.b.c=value" strings
// (--set), applied to the YAML tree before validation (values parsed as YAML scalars).
// Throws UserError (file:line:col) on any problem.
Recipe load_recipe(const std::string& path, const std::vector<std::string>& overrides = {});
Recipe load_recipe_text(const std::string& text, const std::string& display_name,
                        const std::vector<std::string>& overrides = {});

// Cross-field checks that need no world size (d_model divisible by n_heads, rope head size,
// stage_layers against pp and n_layers, recompute layers and modules, checkpoint cadence,
// data path, custom hardware memory, inference context). load_recipe calls it; call it
// again after editing a Recipe in code. Throws UserError at the field's Recipe::loc.
void validate_recipe(const Recipe& r);

// The vocabulary of the tokenizer the recipe's data was made with, as the data room reads it
// (a prepared dataset's manifest: runner/data, set by main), so that validation reports a
// model.vocab_size below it at that key's line with the recipe's other problems, not only when
// the data is opened after them. Null (tests that load recipes in-process) or a nullopt answer
// (not a prepared dataset, not here): nothing is checked here; the data source still checks.
using DataVocabulary = std::optional<int64_t> (*)(const DataConfig&);
void set_data_vocabulary(DataVocabulary probe);

// The recipe as resolved, every default filled in, as YAML text (saved in the run directory).
std::string recipe_to_yaml(const Recipe& r);

}  // namespace runner
