// validate_recipe: the cross-field rules the schema cannot express (d_model divisible by
// n_heads, n_kv_heads dividing n_heads, rope head size, stage_layers against pp and n_layers, the interleaved schedule,
// recompute layers and modules, checkpoint cadence, data path, custom hardware memory,
// inference context). Each failure names the field's Recipe::loc and says how to fix it,
// with numbers.
//
// Every rule runs and every failure is collected (all mistakes in one pass, not one per run). A
// rule names the fields it reads; it stays quiet when one of them already has a problem
// (their values are defaults then, and the rule would only echo that problem), and a rule
// that follows from another one's failure is skipped by the check that holds both.

// GCC 12 reports a false -Wrestrict inside std::string's operator+ (GCC bug 105329); the
// pragma must precede <string> to cover it.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wrestrict"
#endif

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "runner/recipe/document.h"
#include "runner/recipe/recipe.h"

namespace runner {

using recipe_detail::format_number;
using recipe_detail::join;
using recipe_detail::Problem;

namespace {

template <class T>
std::string S(T v) { return std::to_string(v); }

// Collects the rules' failures; `reads` are the fields a rule's verdict depends on.
class Checks {
 public:
  Checks(const Recipe& r, const std::set<std::string>& tainted) : r_(r), tainted_(tainted) {}
  // Whether every field in `reads` is free of earlier problems (the rule may then run).
  bool clean(std::initializer_list<const char*> reads) const {
    for (const char* f : reads)
      for (const std::string& t : tainted_)
        if (recipe_detail::path_related(f, t)) return false;
    return true;
  }
  // Records a failure at `path` (once per path: a second rule failing on the same field
  // follows from the first).
  void fail(const std::string& path, const std::string& what, const std::string& fix) {
    for (const Problem& p : out_)
      if (p.path == path) return;
    const SourceLoc loc = r_.loc(path);
    out_.push_back(Problem{0, loc, loc.file == "--set", what, fix, path});
  }
  const Recipe& recipe() const { return r_; }
  std::vector<Problem> take() { return std::move(out_); }

 private:
  const Recipe& r_;
  const std::set<std::string>& tainted_;
  std::vector<Problem> out_;
};

// Suggestions search a small window only: absurd sizes still get an error, just no example.
constexpr int64_t kWindow = 4096;

// Model shape. The rope rule follows the divisibility rule: it is checked only when that holds.
void check_heads_divide(Checks& c) {
  const ModelConfig& m = c.recipe().model;
  std::vector<std::string> heads;
  for (int64_t nh = m.n_heads - 1; nh >= 1 && nh > m.n_heads - kWindow; --nh)
    if (m.d_model % nh == 0) { heads.push_back(S(nh)); break; }
  for (int64_t nh = m.n_heads + 1; nh <= m.d_model && nh < m.n_heads + kWindow; ++nh)
    if (m.d_model % nh == 0) { heads.push_back(S(nh)); break; }
  std::vector<std::string> widths;
  const int64_t d_lo = m.d_model / m.n_heads * m.n_heads;
  if (d_lo > 0) widths.push_back(S(d_lo));
  if (d_lo <= INT64_MAX - m.n_heads) widths.push_back(S(d_lo + m.n_heads));
  c.fail("model.n_heads", "model.d_model " + S(m.d_model) + " is not divisible by model.n_heads " + S(m.n_heads),
         (heads.empty() ? std::string() : "pick n_heads dividing " + S(m.d_model) + ", like " + join(heads, " or ") + ", or ") +
             "set d_model to a multiple of " + S(m.n_heads) + (widths.empty() ? std::string() : ", like " + join(widths, " or ")));
}

// Grouped-query attention: n_kv_heads key-value heads, each shared by n_heads / n_kv_heads
// query heads, so it must divide n_heads (0 means n_heads).
void check_kv_heads(Checks& c) {
  const ModelConfig& m = c.recipe().model;
  if (!c.clean({"model.n_kv_heads", "model.n_heads"}) || m.n_kv_heads <= 0 || m.n_heads <= 0) return;
  if (m.n_kv_heads <= m.n_heads && m.n_heads % m.n_kv_heads == 0) return;
  std::vector<std::string> near;  // the divisors of n_heads closest to n_kv_heads, below and above
  for (int64_t k = std::min(m.n_kv_heads - 1, m.n_heads); k >= 1 && k > m.n_kv_heads - kWindow; --k)
    if (m.n_heads % k == 0) { near.push_back(S(k)); break; }
  if (m.n_kv_heads < m.n_heads)  // (and no overflow for an absurd n_kv_heads)
    for (int64_t k = m.n_kv_heads + 1; k <= m.n_heads && k < m.n_kv_heads + kWindow; ++k)
      if (m.n_heads % k == 0) { near.push_back(S(k)); break; }
  const std::string what = m.n_kv_heads > m.n_heads
                               ? "model.n_kv_heads " + S(m.n_kv_heads) + " is more than model.n_heads " + S(m.n_heads) +
                                     " (each key-value head serves a group of query heads)"
                               : "model.n_kv_heads " + S(m.n_kv_heads) + " does not divide model.n_heads " + S(m.n_heads) +
                                     " (each key-value head serves an equal group of query heads)";
  c.fail("model.n_kv_heads", what,
         "use a divisor of " + S(m.n_heads) + (near.empty() ? std::string() : ", like " + join(near, " or ")) +
             " (1: multi-query; 0 or " + S(m.n_heads) + ": full multi-head attention)");
}

void check_model(Checks& c) {
  const Recipe& r = c.recipe();
  const ModelConfig& m = r.model;
  check_kv_heads(c);
  if (c.clean({"model.d_model", "model.n_heads"}) && m.n_heads > 0) {
    if (m.d_model % m.n_heads != 0) {
      check_heads_divide(c);
    } else if (c.clean({"model.position"}) && m.position == Position::rope && (m.d_model / m.n_heads) % 2 != 0) {
      std::string better;
      for (int64_t dist = 1; dist < kWindow && better.empty(); ++dist)
        for (int64_t nh : {m.n_heads - dist, m.n_heads + dist})
          if (better.empty() && nh >= 1 && nh <= m.d_model && m.d_model % nh == 0 && (m.d_model / nh) % 2 == 0)
            better = "n_heads " + S(nh) + " (head size " + S(m.d_model / nh) + ")";
      c.fail(r.locs.count("model.position") ? "model.position" : "model.n_heads",
             "position rope needs an even head size, but d_model " + S(m.d_model) + " / n_heads " + S(m.n_heads) + " = " +
                 S(m.d_model / m.n_heads),
             "rope rotates pairs of channels: " + (better.empty() ? std::string("change d_model") : "use " + better) +
                 ", or use position: learned");
    }
  }
  if (c.clean({"model.mlp_ratio", "model.d_model"}) && m.mlp_hidden() < 1)
    c.fail("model.mlp_ratio", "model.mlp_ratio " + format_number(m.mlp_ratio) + " x d_model " + S(m.d_model) + " rounds to an empty MLP",
           "use a larger mlp_ratio, like 4.0");
}

// The explicit stage split: one entry per stage (checked first: a wrong count makes the sum's
// example meaningless), then the sum.
void check_stage_layers(Checks& c) {
  const Recipe& r = c.recipe();
  const ModelConfig& m = r.model;
  const ParallelConfig& q = r.parallel;
  std::string even;  // an even split, as an example
  if (q.pp <= m.n_layers && q.pp <= 64) {
    std::vector<std::string> parts;
    for (int64_t s = 0; s < q.pp; ++s) parts.push_back(S(m.n_layers / q.pp + (s < m.n_layers % q.pp ? 1 : 0)));
    even = "[" + join(parts, ", ") + "]";
  }
  int64_t sum = 0;
  for (int64_t x : q.stage_layers) sum = x > INT64_MAX - sum ? INT64_MAX : sum + x;  // entries are >= 1
  if (c.clean({"parallel.pp"}) && static_cast<int64_t>(q.stage_layers.size()) != q.pp)
    c.fail("parallel.stage_layers",
           "parallel.stage_layers has " + S(q.stage_layers.size()) + (q.stage_layers.size() == 1 ? " entry" : " entries") +
               " but parallel.pp is " + S(q.pp),
           "give one layer count per pipeline stage" + (even.empty() ? std::string() : ", e.g. " + even) +
               ", or remove stage_layers for an even split");
  else if (c.clean({"model.n_layers"}) && sum != m.n_layers)
    c.fail("parallel.stage_layers",
           "parallel.stage_layers adds up to " + S(sum) + " layers but model.n_layers is " + S(m.n_layers),
           "make the entries add up to " + S(m.n_layers) + (even.empty() ? std::string() : ", e.g. " + even));
}

// Parallel layout (only what needs no world size; the plan checks the rest).
void check_parallel(Checks& c) {
  const Recipe& r = c.recipe();
  const ParallelConfig& q = r.parallel;
  if (!q.stage_layers.empty() && c.clean({"parallel.stage_layers"})) check_stage_layers(c);
  if (!q.reshard_after_forward && c.clean({"parallel.zero", "parallel.reshard_after_forward"}) && q.zero != 3)
    c.fail("parallel.reshard_after_forward",
           "parallel.reshard_after_forward: false only applies to zero 3 (parallel.zero is " + S(q.zero) +
               "): only zero 3 gathers parameters",
           "set zero: 3, or remove reshard_after_forward");
  if (!c.clean({"parallel.schedule", "parallel.virtual_stages"})) return;
  if (q.schedule == PipelineSchedule::interleaved) {
    if (c.clean({"parallel.pp"}) && q.pp < 2)
      c.fail("parallel.schedule", "schedule interleaved needs pipeline stages, but parallel.pp is " + S(q.pp),
             "set pp >= 2, or use schedule: 1f1b");
    if (q.virtual_stages < 2)
      c.fail(r.locs.count("parallel.virtual_stages") ? "parallel.virtual_stages" : "parallel.schedule",
             "schedule interleaved needs parallel.virtual_stages >= 2, got " + S(q.virtual_stages),
             "set virtual_stages: 2 (model chunks per stage)");
  } else if (q.virtual_stages != 1) {
    c.fail("parallel.virtual_stages", "parallel.virtual_stages " + S(q.virtual_stages) + " only applies to schedule interleaved",
           "set schedule: interleaved, or remove virtual_stages");
  }
}

// Recompute: the mode against the lists first; the layer range only when the list applies.
void check_recompute(Checks& c) {
  const Recipe& r = c.recipe();
  const ModelConfig& m = r.model;
  const RecomputeConfig& rc = r.recompute;
  if (!c.clean({"recompute.mode"})) return;
  if (c.clean({"recompute.modules"})) {
    if (rc.mode == RecomputeMode::selective && rc.modules.empty())
      c.fail("recompute.mode", "recompute mode selective needs recompute.modules",
             "add modules: [attention_core] under recompute, or use mode: full");
    // auto chooses its layers and modules itself: a list beside it would be ignored or contradict it.
    if (rc.mode == RecomputeMode::automatic && !rc.modules.empty())
      c.fail("recompute.modules",
             "recompute mode auto chooses the modules itself (norm, attention_core, attention, mlp or whole layers, by "
             "activation bytes saved per recomputed FLOP)",
             "remove modules, or set mode: selective to choose them yourself");
    else if (rc.mode != RecomputeMode::selective && !rc.modules.empty())
      c.fail("recompute.modules", "recompute.modules only applies to mode selective (mode is " + to_string(rc.mode) + ")",
             "set recompute.mode: selective, or remove modules");
  }
  if (!c.clean({"recompute.layers"})) return;
  if (rc.mode == RecomputeMode::automatic && !rc.layers.empty()) {
    c.fail("recompute.layers",
           "recompute mode auto chooses the layers itself (by activation bytes saved per recomputed FLOP, until the "
           "plan fits the device)",
           "remove layers, or set mode: full or selective to choose the layers yourself");
  } else if (rc.mode == RecomputeMode::none && !rc.layers.empty()) {
    c.fail("recompute.layers", "recompute.layers has no effect with mode none",
           "set recompute.mode: full or selective, or remove layers");
  } else if (c.clean({"model.n_layers"})) {
    for (size_t i = 0; i < rc.layers.size(); ++i)
      if (rc.layers[i] < 0 || rc.layers[i] >= m.n_layers)
        c.fail("recompute.layers[" + S(i) + "]",
               "recompute.layers lists layer " + S(rc.layers[i]) + ", but the model has " + S(m.n_layers) +
                   " layers (0 to " + S(m.n_layers - 1) + ")",
               "list layers from 0 to " + S(m.n_layers - 1) + ", or leave layers empty for all of them");
  }
}

// Checkpoints: a cadence without its interval is one problem; the other interval's "no
// effect" is then part of it (the user may have meant the other cadence), so not repeated.
void check_checkpoint(Checks& c) {
  const Recipe& r = c.recipe();
  const CheckpointConfig& k = r.checkpoint;
  if (c.clean({"checkpoint.spike_threshold"}) && k.spike_threshold > 0 && k.spike_threshold <= 1)
    c.fail("checkpoint.spike_threshold",
           "checkpoint.spike_threshold must be 0 (off) or above 1, got " + format_number(k.spike_threshold),
           "it is a multiple of the running mean loss: use e.g. 3, or 0 to turn spike rollback off");
  if (!c.clean({"checkpoint.cadence", "checkpoint.every_steps", "checkpoint.every_minutes"})) return;
  if (k.cadence == CheckpointCadence::steps && k.every_steps <= 0) {
    const int64_t n = std::max<int64_t>(1, r.train.steps / 4);
    c.fail(r.locs.count("checkpoint.cadence") ? "checkpoint.cadence" : "checkpoint.every_steps",
           "checkpoint cadence steps needs checkpoint.every_steps > 0",
           "add every_steps under checkpoint, e.g. every_steps: " + S(n) + " (4 checkpoints in " + S(r.train.steps) +
               " steps), or use cadence: never");
    return;
  }
  if (k.cadence == CheckpointCadence::minutes && !(k.every_minutes > 0)) {
    c.fail(r.locs.count("checkpoint.cadence") ? "checkpoint.cadence" : "checkpoint.every_minutes",
           "checkpoint cadence minutes needs checkpoint.every_minutes > 0",
           "add every_minutes under checkpoint, e.g. every_minutes: 30, or use cadence: never");
    return;
  }
  if (k.cadence != CheckpointCadence::steps && k.every_steps > 0)
    c.fail("checkpoint.every_steps", "checkpoint.every_steps has no effect with cadence " + to_string(k.cadence),
           "set cadence: steps, or remove every_steps");
  if (k.cadence != CheckpointCadence::minutes && k.every_minutes > 0)
    c.fail("checkpoint.every_minutes", "checkpoint.every_minutes has no effect with cadence " + to_string(k.cadence),
           "set cadence: minutes, or remove every_minutes");
}

// data.mix: prepared token datasets (kind hdf5 or bin) instead of data.path. The weights'
// sign is the schema's; that the directories exist and share one tokenizer, the data room's
// (open_source), which reports them at each entry's loc.
void check_data_mix(Checks& c) {
  const DataConfig& d = c.recipe().data;
  if (d.mix.empty() || !c.clean({"data.mix", "data.kind", "data.path", "data.val_path"})) return;
  if (!d.path.empty())
    c.fail("data.path", "data.path and data.mix are both given",
           "give one dataset in data.path, or several in data.mix (move data.path into it as '- path: ...')");
  if (!d.val_path.empty())
    c.fail("data.val_path", "data.val_path does not apply to data.mix (each prepared dataset has its own val shards)",
           "remove data.val_path");
  if (d.kind != DataKind::hdf5 && d.kind != DataKind::bin)
    c.fail("data.kind", "data.mix mixes prepared token datasets, but data.kind is " + to_string(d.kind),
           "set data.kind: hdf5 (or bin, for datasets prepared with --format bin)");
  for (size_t i = 0; i < d.mix.size(); ++i)
    if (d.mix[i].path.empty())
      c.fail("data.mix[" + S(i) + "].path", "data.mix entry " + S(i) + " has an empty path",
             "name a directory written by runner data prepare");
}

DataVocabulary g_data_vocabulary = nullptr;

// A model vocabulary below the data's tokenizer's: the token ids past it could not be embedded.
void check_data_vocabulary(Checks& c) {
  const Recipe& r = c.recipe();
  if (!g_data_vocabulary || r.model.vocab_size <= 0) return;
  if (!c.clean({"data.kind", "data.path", "data.mix", "model.vocab_size"})) return;
  std::optional<int64_t> v;
  try {
    v = g_data_vocabulary(r.data);
  } catch (const std::exception&) {
    return;  // unreadable data: the data source names it when it opens the data
  }
  if (v && *v > r.model.vocab_size)
    c.fail("model.vocab_size",
           "model.vocab_size = " + std::to_string(r.model.vocab_size) +
               " is smaller than the vocabulary of the tokenizer the data was prepared with (" + std::to_string(*v) +
               "): its larger token ids would have no embedding",
           "set model.vocab_size >= " + std::to_string(*v) + " (a multiple of 64 runs faster)");
}

// Data and hardware.
void check_data_and_hardware(Checks& c) {
  const Recipe& r = c.recipe();
  const ModelConfig& m = r.model;
  const DataConfig& d = r.data;
  check_data_mix(c);
  check_data_vocabulary(c);
  if (c.clean({"data.kind", "data.path", "data.mix"}) && d.mix.empty()) {
    if (d.kind != DataKind::addition && d.path.empty())
      c.fail("data.kind", "data kind " + to_string(d.kind) + " needs data.path",
             "add path: <file> under data, e.g. path: data/tinyshakespeare.txt");
    if (d.kind == DataKind::addition && !d.path.empty())
      c.fail("data.path", "data.path is not used by data kind addition (the task is generated)",
             "remove path, or set kind: text, hdf5 or bin");
  }
  // The same bound the addition source enforces when training, so `plan` refuses what `train` would.
  if (c.clean({"data.kind", "data.digits", "model.seq_len"}) && d.kind == DataKind::addition && d.digits > 0 &&
      m.seq_len > 0 && m.seq_len < 3 * d.digits + 4)
    c.fail("model.seq_len",
           "model.seq_len = " + std::to_string(m.seq_len) + " is shorter than one " + std::to_string(d.digits) +
               "-digit addition problem (3*digits+4 = " + std::to_string(3 * d.digits + 4) + " tokens)",
           "use model.seq_len >= " + std::to_string(3 * d.digits + 4) + " (several problems per sample train better)");
  if (c.clean({"hardware.device", "hardware.memory_gb"}) && r.hardware.device == "custom" && !(r.hardware.memory_gb > 0))
    c.fail("hardware.device", "hardware device custom needs hardware.memory_gb",
           "add memory_gb: <GB per device> under hardware, e.g. memory_gb: 80");
  if (c.clean({"inference.context", "model.seq_len", "model.position"}) && r.inference &&
      m.position == Position::learned && r.inference->context > m.seq_len)
    c.fail("inference.context",
           "inference.context " + S(r.inference->context) + " exceeds model.seq_len " + S(m.seq_len) +
               ", and learned positions stop at seq_len",
           "use context <= " + S(m.seq_len) + " (0 means seq_len), or position: rope");
}

}  // namespace

std::vector<Problem> recipe_detail::cross_field_problems(const Recipe& r, const std::set<std::string>& tainted) {
  Checks c(r, tainted);
  check_model(c);
  check_parallel(c);
  check_recompute(c);
  check_checkpoint(c);
  check_data_and_hardware(c);
  return c.take();
}

void set_data_vocabulary(DataVocabulary probe) { g_data_vocabulary = probe; }

void validate_recipe(const Recipe& r) {
  std::vector<Problem> problems = recipe_detail::cross_field_problems(r, {});
  if (!problems.empty()) recipe_detail::throw_problems(std::move(problems));
}

}  // namespace runner
