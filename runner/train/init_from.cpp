// model.init_from (see init_from.h).
#include "runner/train/init_from.h"

#include <filesystem>

#include <fmt/format.h>

#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/state_shards.h"
#include "runner/errors.h"
#include "runner/data/data.h"
#include "runner/run/run_dir.h"
#include "runner/tokenize/tokenizer.h"

namespace fs = std::filesystem;

namespace runner {

std::vector<UserError::Entry> model_mismatches(const Recipe& want, const ModelConfig& have, const std::string& source) {
  const ModelConfig& m = want.model;
  std::vector<UserError::Entry> out;
  auto differ = [&](const char* field, const std::string& ours, const std::string& theirs) {
    if (ours == theirs) return;
    out.push_back({want.loc(std::string("model.") + field),
                   fmt::format("model.{} is {}, the checkpoint model.init_from names ({}) has {}", field, ours, source, theirs),
                   fmt::format("set model.{}: {} (the weights' shape and function come with them)", field, theirs)});
  };
  auto num = [](auto v) { return fmt::format("{}", v); };
  differ("family", to_string(m.family), to_string(have.family));
  differ("vocab_size", num(m.vocab_size), num(have.vocab_size));
  differ("d_model", num(m.d_model), num(have.d_model));
  differ("n_layers", num(m.n_layers), num(have.n_layers));
  differ("n_heads", num(m.n_heads), num(have.n_heads));
  differ("n_kv_heads", num(m.kv_heads()), num(have.kv_heads()));
  if (m.d_model == have.d_model && m.mlp_hidden() != have.mlp_hidden())  // else d_model's entry says it
    differ("mlp_ratio", fmt::format("{} (MLP width {})", m.mlp_ratio, m.mlp_hidden()),
           fmt::format("{} (MLP width {})", have.mlp_ratio, have.mlp_hidden()));
  differ("norm", to_string(m.norm), to_string(have.norm));
  differ("activation", to_string(m.activation), to_string(have.activation));
  differ("position", to_string(m.position), to_string(have.position));
  differ("tie_embeddings", num(m.tie_embeddings), num(have.tie_embeddings));
  differ("bias", num(m.bias), num(have.bias));
  differ("norm_eps", num(m.norm_eps), num(have.norm_eps));
  // Learned positions are a (seq_len, d_model) table; rope has no table, any context works.
  if (m.position == Position::learned) differ("seq_len", num(m.seq_len), num(have.seq_len));
  if (m.position == Position::rope) differ("rope_theta", num(m.rope_theta), num(have.rope_theta));
  return out;
}

std::optional<InitFrom> check_init_from(const Recipe& r, const std::string& checkpoint_dir) {
  if (r.model.init_from.empty() || !list_checkpoint_steps(checkpoint_dir).empty()) return std::nullopt;
  InitFrom init;
  init.source = r.model.init_from;
  Recipe stored;
  if (fs::is_directory(init.source)) {
    ResumeRequest req = prepare_resume(init.source, {}, -1, /*strict=*/true);
    init.checkpoint = req.point.path;
    stored = std::move(req.recipe);
  } else if (fs::is_regular_file(init.source)) {
    verify_checkpoint_file(init.source);
    init.checkpoint = init.source;
    stored = load_recipe_text(read_recipe_text(init.source), init.source);
  } else {
    throw UserError(r.loc("model.init_from"), "model.init_from: no checkpoint or directory at " + init.source,
                    "write one with `runner import HF_MODEL_DIR --out DIR`, or name a run directory or a checkpoint .h5 "
                    "file (a relative path is read from the recipe's directory)");
  }
  init.step = read_checkpoint_step(init.checkpoint);
  const std::vector<UserError::Entry> bad = model_mismatches(r, stored.model, init.source);
  if (!bad.empty()) throw UserError(bad);
  const std::string tok = run_tokenizer_dir(source_run_dir(init.source));
  if (fs::is_directory(tok)) init.tokenizer_dir = tok;
  return init;
}

void load_init_weights(const InitFrom& init, const Plan& plan, parallel::Grid& grid, TrainState& st) {
  const parallel::Coords c = grid.coords();
  TrainState t = logical_template(*plan.layout, c.pp, grid.rank(), grid.world_size());
  load_checkpoint_file(init.checkpoint, t, /*subset=*/true);
  t.adam_m.clear();  // a fresh optimizer: the moments st was built with (zeros) stay
  t.adam_v.clear();
  TrainState keep;
  keep.copy_scalars_from(st);
  const std::string recipe = st.recipe_yaml;
  load_local_from_logical(*plan.layout, c.pp, c.tp, t, st);
  st.copy_scalars_from(keep);
  st.recipe_yaml = recipe;
}

std::string choose_run_tokenizer(const Recipe& r, const std::string& init_dir) {
  const std::optional<DataTokenizer> dt = data_tokenizer(r.data);
  if (!dt) return init_dir;
  const std::string data_dir = dt->info.kind == "byte" ? "" : dt->files;
  if (init_dir.empty()) return data_dir;
  const tok::TokenizerInfo& d = dt->info;
  const tok::TokenizerInfo i = tok::load_tokenizer(init_dir)->info();
  if (d.hash != i.hash)
    throw UserError(r.loc("model.init_from"),
                    fmt::format("the data's tokenizer ({}, {} tokens, hash {}) is not the one the weights of "
                                "model.init_from came with ({}, {} tokens, hash {})",
                                d.name, d.vocab_size, d.hash, i.name, i.vocab_size, i.hash),
                    fmt::format("prepare the data with the model's tokenizer: runner data prepare ... --tokenizer {}", init_dir));
  return data_dir;
}

}  // namespace runner
