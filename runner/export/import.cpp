// runner import: Hugging Face safetensors + config.json -> a runner checkpoint (see import.h).
//
// The safetensors headers are read and checked first (safetensors.h): a truncated, corrupt or
// overlapping file is a UserError naming it before any tensor byte is read.
#include "runner/export/import.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "ops/convert.h"
#include "runner/atomic_output.h"
#include "runner/checkpoint/checkpoint.h"
#include "runner/checkpoint/state_shards.h"
#include "runner/errors.h"
#include "runner/export/safetensors.h"
#include "runner/model/layout.h"
#include "runner/signals.h"
#include "runner/tokenize/tokenizer.h"
#include "runner/trained/trained_model.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace runner {

namespace {

// The weight files of SOURCE and its config.json.
std::vector<std::string> weight_files(const fs::path& src, fs::path& config) {
  fs::path dir = fs::is_directory(src) ? src : src.parent_path();
  config = dir / "config.json";
  fs::path index;
  std::vector<std::string> files;
  if (fs::is_directory(src)) {
    if (fs::exists(dir / "model.safetensors.index.json")) index = dir / "model.safetensors.index.json";
    else if (fs::exists(dir / "model.safetensors")) files.push_back((dir / "model.safetensors").string());
    else
      throw UserError({src.string(), 0, 0}, "holds neither model.safetensors nor model.safetensors.index.json",
                      "pass the directory of a Hugging Face model saved with safetensors (or one .safetensors file)");
  } else if (src.string().ends_with(".index.json")) {
    index = src;
  } else {
    files.push_back(src.string());
  }
  if (!index.empty()) {
    std::ifstream f(index);
    json j = json::parse(f, nullptr, false);
    if (j.is_discarded() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw UserError({index.string(), 0, 0}, "not a safetensors index (no \"weight_map\" object)", "pass the model's directory");
    std::set<std::string> seen;
    for (auto& [name, file] : j["weight_map"].items())
      if (file.is_string() && seen.insert(file.get<std::string>()).second) files.push_back((dir / file.get<std::string>()).string());
  }
  if (!fs::exists(config))
    throw UserError({config.string(), 0, 0}, "config.json is missing beside the weights", "copy the model's config.json there");
  return files;
}

// ---- config.json ----
template <class T>
T get_or(const json& j, const char* key, T dflt) {
  return j.contains(key) && !j[key].is_null() ? j[key].get<T>() : dflt;
}

[[noreturn]] void bad_config(const std::string& path, const std::string& what, const std::string& fix) {
  throw UserError({path, 0, 0}, what, fix);
}

// A size of the config: a positive integer below 2^31 (the runner's shapes are int64, but no
// model dimension comes near it, and a larger one would only ask for an impossible allocation).
int64_t size_value(const json& j, const char* key, const std::string& path) {
  const json& v = j[key];
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > INT32_MAX)
    bad_config(path, fmt::format("\"{}\" is {}: it must be a positive integer (below 2^31)", key, v.dump()),
               "use the model's own config.json");
  return v.get<int64_t>();
}

int64_t need_int(const json& j, const char* key, const std::string& path) {
  if (!j.contains(key)) bad_config(path, std::string("\"") + key + "\" is missing", "use the model's own config.json");
  return size_value(j, key, path);
}

int64_t int_or(const json& j, const char* key, int64_t fallback, const std::string& path) {
  return j.contains(key) && !j[key].is_null() ? size_value(j, key, path) : fallback;
}

// A positive, finite real of the config (an epsilon, rope's base); absent: `fallback`.
double positive_or(const json& j, const char* key, double fallback, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (!v.is_number() || !(v.get<double>() > 0) || !std::isfinite(v.get<double>()))
    bad_config(path, fmt::format("\"{}\" is {}: it must be a positive finite number", key, v.dump()),
               "use the model's own config.json");
  return v.get<double>();
}

// A probability or a standard deviation: finite, in [0, hi); absent: `fallback`.
double fraction_or(const json& j, const char* key, double fallback, double hi, const std::string& path) {
  if (!j.contains(key) || j[key].is_null()) return fallback;
  const json& v = j[key];
  if (!v.is_number() || !(v.get<double>() >= 0 && v.get<double>() < hi))
    bad_config(path, fmt::format("\"{}\" is {}: it must be a number in [0, {:g})", key, v.dump(), hi),
               "use the model's own config.json");
  return v.get<double>();
}

// The runner's MLP width is round(mlp_ratio * d_model): the ratio that gives `inner` back.
void set_mlp_width(ModelConfig& m, int64_t inner, const std::string& path) {
  m.mlp_ratio = static_cast<double>(inner) / static_cast<double>(m.d_model);
  if (m.mlp_hidden() != inner)
    bad_config(path, fmt::format("the MLP width {} is not representable as mlp_ratio x d_model {}", inner, m.d_model),
               "report this model: its width does not round-trip");
}

ModelConfig gpt2_config(const json& j, const std::string& path) {
  ModelConfig m;
  m.norm = Norm::layernorm;
  m.activation = Activation::gelu;
  m.position = Position::learned;
  m.bias = true;
  m.vocab_size = need_int(j, "vocab_size", path);
  m.d_model = need_int(j, "n_embd", path);
  m.n_layers = need_int(j, "n_layer", path);
  m.n_heads = need_int(j, "n_head", path);
  m.seq_len = need_int(j, "n_positions", path);
  set_mlp_width(m, int_or(j, "n_inner", 4 * m.d_model, path), path);
  const std::string act = get_or<std::string>(j, "activation_function", "gelu_new");
  std::string known;
  bool found = false;
  for (const ActivationFacts& f : kActivationFacts) {
    if (f.gated) continue;  // GPT-2's MLP is ungated
    for (std::string_view name : {f.hf, f.hf_same[0], f.hf_same[1]}) {
      if (name.empty()) continue;
      known += (known.empty() ? "" : ", ") + std::string(name);
      if (name == act && !found) m.activation = f.value, found = true;
    }
  }
  if (!found)
    bad_config(path, "activation_function \"" + act + "\" is not an activation the runner's gpt2 style computes",
               "these import: " + known);
  if (get_or<bool>(j, "scale_attn_by_inverse_layer_idx", false) || !get_or<bool>(j, "scale_attn_weights", true))
    bad_config(path, "the attention scaling differs from 1/sqrt(head size)", "only GPT-2's standard attention imports");
  m.norm_eps = positive_or(j, "layer_norm_epsilon", 1e-5, path);
  m.dropout = fraction_or(j, "resid_pdrop", 0.0, 1.0, path);
  m.init_std = fraction_or(j, "initializer_range", 0.02, 1e6, path);
  m.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", true);
  return m;
}

ModelConfig llama_config(const json& j, const std::string& path) {
  ModelConfig m;
  m.norm = Norm::rmsnorm;
  m.activation = Activation::swiglu;
  m.position = Position::rope;
  m.vocab_size = need_int(j, "vocab_size", path);
  m.d_model = need_int(j, "hidden_size", path);
  m.n_layers = need_int(j, "num_hidden_layers", path);
  m.n_heads = need_int(j, "num_attention_heads", path);
  const int64_t kv = int_or(j, "num_key_value_heads", m.n_heads, path);
  m.n_kv_heads = kv == m.n_heads ? 0 : kv;
  m.seq_len = int_or(j, "max_position_embeddings", 2048, path);
  set_mlp_width(m, need_int(j, "intermediate_size", path), path);
  if (get_or<std::string>(j, "hidden_act", "silu") != "silu")
    bad_config(path, "hidden_act \"" + j["hidden_act"].get<std::string>() + "\" is not silu", "only Llama's SwiGLU imports");
  if (m.d_model % m.n_heads != 0 || int_or(j, "head_dim", m.d_model / m.n_heads, path) != m.d_model / m.n_heads)
    bad_config(path, "head_dim differs from hidden_size / num_attention_heads", "the runner's heads are d_model / n_heads wide");
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null())
    bad_config(path, "rope_scaling is set (" + j["rope_scaling"].dump() + "); the runner's rope has no scaling",
               "import a model without rope scaling");
  const bool ab = get_or<bool>(j, "attention_bias", false), mb = get_or<bool>(j, "mlp_bias", false);
  if (ab != mb)
    bad_config(path, fmt::format("attention_bias {} and mlp_bias {} differ; the runner has one bias switch", ab, mb),
               "import a model whose attention and MLP both have biases or neither");
  m.bias = ab;
  m.norm_eps = positive_or(j, "rms_norm_eps", 1e-6, path);
  m.rope_theta = positive_or(j, "rope_theta", 10000.0, path);
  m.dropout = fraction_or(j, "attention_dropout", 0.0, 1.0, path);
  m.init_std = fraction_or(j, "initializer_range", 0.02, 1e6, path);
  m.tie_embeddings = get_or<bool>(j, "tie_word_embeddings", false);
  return m;
}

}  // namespace

ModelConfig model_from_hf_config(const std::string& text, const std::string& path, HfStyle& style) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) bad_config(path, "not a JSON object", "pass the model's config.json");
  std::string arch = j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
                             j["architectures"][0].is_string()
                         ? j["architectures"][0].get<std::string>()
                         : "";
  const std::string type = get_or<std::string>(j, "model_type", "");
  if (arch.empty()) arch = type == "gpt2" ? "GPT2LMHeadModel" : type == "llama" ? "LlamaForCausalLM" : "";
  ModelConfig m;
  if (arch == "GPT2LMHeadModel") {
    style = HfStyle::gpt2;
    m = gpt2_config(j, path);
  } else if (arch == "LlamaForCausalLM") {
    style = HfStyle::llama;
    m = llama_config(j, path);
  } else {
    bad_config(path, "architecture \"" + (arch.empty() ? type : arch) + "\" is not one the runner imports",
               "import a GPT2LMHeadModel or a LlamaForCausalLM (model_type gpt2 or llama)");
  }
  if (m.d_model % m.n_heads != 0)
    bad_config(path, fmt::format("the hidden size {} is not divisible by the {} heads", m.d_model, m.n_heads),
               "the runner's heads are d_model / n_heads wide");
  if (m.n_heads % m.kv_heads() != 0)
    bad_config(path, fmt::format("num_key_value_heads {} does not divide num_attention_heads {}", m.kv_heads(), m.n_heads),
               "use the model's own config.json");
  return m;
}

namespace {

// ---- tensors ----
const char* const kIgnorable[] = {".attn.bias", ".attn.masked_bias", "rotary_emb.inv_freq"};  // buffers, not weights

// The file's tensor for table name `name`: GPT2Model files (the hub's "gpt2") drop "transformer.".
const StTensor* find_tensor(const StIndex& idx, const std::string& name, std::string* found) {
  for (const std::string& n : {name, name.starts_with("transformer.") ? name.substr(12) : std::string()}) {
    if (n.empty()) continue;
    if (auto it = idx.find(n); it != idx.end()) {
      *found = n;
      return &it->second;
    }
  }
  return nullptr;
}

std::vector<float> read_f32(const StTensor& t, int64_t numel) {
  std::ifstream f(t.file, std::ios::binary);
  std::string raw(t.end - t.begin, '\0');
  f.seekg(static_cast<std::streamoff>(t.begin));
  f.read(raw.data(), static_cast<std::streamsize>(raw.size()));
  if (!f) safetensors_corrupt(t.file, "its data could not be read to the end");
  std::vector<float> out(static_cast<size_t>(numel));
  const ops::DType dt = t.dtype == "F32" ? ops::DType::F32 : t.dtype == "BF16" ? ops::DType::BF16 : ops::DType::F16;
  if (dt == ops::DType::F32) std::memcpy(out.data(), raw.data(), raw.size());  // little-endian host, as the format
  else ops::to_f32(out.data(), raw.data(), dt, numel);
  return out;
}

// One Hugging Face tensor checked and placed into rows [row_begin, +rows) of its logical tensor.
void place(const HfTensor& h, const StTensor& t, const std::string& name, ops::Tensor& dst) {
  const auto& s = dst.shape();
  const int64_t rows = s[0], cols = s.size() > 1 ? dst.numel() / rows : 1, n = h.rows < 0 ? rows : h.rows;
  const std::vector<int64_t> want = s.size() == 1 ? std::vector<int64_t>{n}
                                    : h.transpose ? std::vector<int64_t>{cols, n}
                                                  : std::vector<int64_t>{n, cols};
  if (t.shape != want)
    throw UserError({t.file, 0, 0}, fmt::format("tensor {} has shape [{}], the config gives [{}]", name,
                                                fmt::join(t.shape, ", "), fmt::join(want, ", ")),
                    "the weights and config.json disagree: use the config.json saved with these weights");
  if (t.dtype != "F32" && t.dtype != "F16" && t.dtype != "BF16")
    throw UserError({t.file, 0, 0}, "tensor " + name + " is " + t.dtype + ", not a floating-point type the runner reads",
                    "save the model as F32, F16 or BF16");
  const std::vector<float> v = read_f32(t, n * cols);
  // A NaN or infinity would train as a run whose every step is skipped: refused here, where the
  // file and the element can still be named.
  for (size_t k = 0; k < v.size(); ++k)
    if (!std::isfinite(v[k]))
      throw UserError({t.file, 0, 0}, fmt::format("tensor {} holds a non-finite value ({}) at element {} of {}", name,
                                                  v[k], k, v.size()),
                      "the weights are damaged or diverged: use a good copy of the model");
  float* out = dst.host_data<float>() + h.row_begin * cols;
  if (h.transpose && s.size() > 1) {
    for (int64_t r = 0; r < n; ++r)
      for (int64_t c = 0; c < cols; ++c) out[r * cols + c] = v[static_cast<size_t>(c * n + r)];
  } else {
    std::copy(v.begin(), v.end(), out);
  }
}

// Every tensor of the table read into the logical state; the file's other tensors are refused
// unless they are known buffers (or a tied head's copy).
void read_weights(const ModelConfig& m, HfStyle style, const StIndex& idx, TrainState& st, ImportResult& res,
                  const std::function<void(const std::string&)>& say) {
  std::set<std::string> used;
  const std::vector<HfTensor> table = hf_tensors(m, style);
  size_t done = 0, said = 0;
  for (const HfTensor& h : table) {
    if (++done * 10 / table.size() > said && table.size() >= 50) {  // a large model: every tenth of it
      said = done * 10 / table.size();
      say(fmt::format("  {}/{} tensors", done, table.size()));
    }
    throw_if_stopped("the import's output");
    std::string name;
    const StTensor* t = find_tensor(idx, h.name, &name);
    if (!t)
      throw UserError({idx.empty() ? "" : idx.begin()->second.file, 0, 0},
                      "tensor " + h.name + " is missing from the weights", "the weights and config.json disagree");
    const int i = st.params.index(h.source);
    RUNNER_CHECK(i >= 0, "hf_tensors names " + h.source + ", which the layout lacks");
    place(h, *t, name, st.params.values[static_cast<size_t>(i)]);
    used.insert(name);
    ++res.tensors;
  }
  std::vector<std::string> extra;
  for (const auto& [name, t] : idx) {
    if (used.count(name)) continue;
    bool buffer = false;
    for (const char* suf : kIgnorable) buffer = buffer || name.ends_with(suf);
    if (m.tie_embeddings && name == "lm_head.weight") {
      res.notes.push_back("lm_head.weight is in the file but the config ties it to the embedding: the embedding is used");
    } else if (!buffer) {
      extra.push_back(name);
    }
  }
  if (!extra.empty())
    throw UserError({idx.begin()->second.file, 0, 0},
                    fmt::format("{} tensor(s) have no place in the model config.json describes: {}{}", extra.size(),
                                fmt::join(extra.begin(), extra.begin() + std::min<size_t>(extra.size(), 5), ", "),
                                extra.size() > 5 ? ", ..." : ""),
                    "the weights and config.json disagree: use the config.json saved with these weights");
}

// ---- tokenizer ----
const char* const kTokenizerFiles[] = {"tokenizer.json", "vocab.json", "merges.txt", "encoder.json", "vocab.bpe",
                                       "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json",
                                       "added_tokens.json"};

std::vector<std::string> tokenizer_files(const fs::path& dir) {
  std::vector<std::string> found;
  for (const char* f : kTokenizerFiles)
    if (fs::is_regular_file(dir / f)) found.push_back(f);
  auto has = [&](const char* f) { return std::find(found.begin(), found.end(), f) != found.end(); };
  const bool vocab = has("tokenizer.json") || has("tokenizer.model") || (has("vocab.json") && has("merges.txt")) ||
                     (has("encoder.json") && has("vocab.bpe"));
  return vocab ? found : std::vector<std::string>{};
}

// The tokenizer found beside the weights, loaded as `generate` and a run will load it: one the
// runner cannot read is refused here (naming its file) rather than copied into OUT.
void check_tokenizer(const fs::path& dir, const std::vector<std::string>& found) {
  if (found.empty()) return;
  try {
    tok::load_tokenizer(dir.string());
  } catch (const UserError& e) {
    throw UserError(e.loc(), "the tokenizer beside the weights does not load: " + e.problem(),
                    "fix or remove the tokenizer files (an import without them reads prompts as bytes)");
  }
}

// ---- the recipes ----
Recipe stored_recipe(const ModelConfig& m, const std::string& name) {
  Recipe r;
  r.name = name;
  r.model = m;
  // No data came with the weights; a run starting from them brings its own (model.init_from).
  r.data.kind = DataKind::text;
  r.data.path = "(imported: no data)";
  r.train.steps = 1000;
  r.train.eval_every = 100;
  r.checkpoint.every_steps = 250;
  return r;
}

std::string finetune_recipe(const ModelConfig& m, const std::string& name, const fs::path& recipe, const fs::path& out,
                            const std::string& source) {
  Recipe r = stored_recipe(m, name + "-finetune");
  std::error_code ec;
  const fs::path rel = fs::relative(fs::absolute(out), fs::absolute(recipe).parent_path(), ec);
  r.model.init_from = ec || rel.empty() ? fs::absolute(out).string() : rel.string();
  r.data.path = "train.txt";
  r.optimizer.lr = 3e-5;  // fine-tuning: well below pre-training rates
  r.batch.global = 8;
  r.batch.micro = 1;
  // Validated as `runner train` will read it: an error here is ours, not the user's.
  validate_recipe(r);
  return fmt::format("# Fine-tuning {} (imported by `runner import {}`).\n"
                     "# The model section is its config.json's: change dropout or seq_len (rope models) if you like,\n"
                     "# the shapes must stay (the run checks them against the checkpoint and exits 2 on a mismatch).\n"
                     "# data.path is a placeholder: point it at your data (relative: from this file's directory).\n",
                     name, source) + recipe_to_yaml(r);
}

// The model's name for its recipes: its directory's, as a recipe name ([A-Za-z0-9._-]+).
std::string model_name(const std::string& source) {
  fs::path p = fs::absolute(fs::path(source)).lexically_normal();
  if (p.filename().empty()) p = p.parent_path();  // "dir/"
  if (!fs::is_directory(p)) p = p.parent_path();  // a file: its directory
  std::string name = p.filename().string();
  for (char& c : name)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '_' && c != '-') c = '-';
  return name.empty() ? "imported" : name;
}

}  // namespace

ImportResult import_model(const std::string& source, const std::string& out_dir, const std::string& recipe_out,
                          const std::function<void(const std::string&)>& progress, bool force) {
  const auto say = [&](const std::string& s) { if (progress) progress(s); };
  if (!fs::exists(source)) throw UserError({source, 0, 0}, "no such file or directory", "pass a Hugging Face model directory");
  const fs::path out = out_dir, ckpt_dir = out / "checkpoints";
  if (!force && !list_checkpoint_steps(ckpt_dir.string()).empty())
    throw UserError({out_dir, 0, 0}, "already holds a checkpoint", "pass another --out, or --force to replace it");
  // The recipe goes into OUT (built with it) unless --recipe-out names a place outside it.
  const fs::path recipe = recipe_out.empty() ? out / "finetune.yaml" : fs::path(recipe_out);
  const fs::path recipe_in_out = fs::absolute(recipe).lexically_normal().lexically_relative(fs::absolute(out).lexically_normal());
  const bool recipe_inside = !recipe_in_out.empty() && *recipe_in_out.begin() != "..";
  // OUT is built beside and swapped in (runner/atomic_output.h): an interrupted import leaves
  // no half-written checkpoint, and the next import removes a killed one's temporary.
  StagedDir staged(out_dir, force, "import", "--force", {source});
  std::optional<StagedFile> recipe_file;
  if (!recipe_inside) recipe_file.emplace(recipe.string(), force, "import --recipe-out");
  fs::path config;
  const std::vector<std::string> files = weight_files(source, config);
  std::ifstream cf(config);
  const std::string config_text((std::istreambuf_iterator<char>(cf)), std::istreambuf_iterator<char>());
  ImportResult res;
  HfStyle style;
  res.model = model_from_hf_config(config_text, config.string(), style);
  res.architecture = style == HfStyle::gpt2 ? "GPT2LMHeadModel" : "LlamaForCausalLM";
  StIndex idx;
  for (const std::string& f : files) read_safetensors_header(f, idx);
  const std::string name = model_name(source);
  GptSpec whole;
  whole.model = res.model;
  whole.T = std::min<int64_t>(res.model.seq_len, 8);  // the graph only names the parameters: a short one will do
  const ModelLayout layout(whole, {res.model.n_layers}, 1);
  TrainState st = logical_template(layout, 0, 0, 1);  // host memory: a file-to-file conversion, no device
  st.world_rank = 0;
  st.world_size = 1;
  say(fmt::format("reading {} file(s) of {} ({} tensors)", files.size(), res.architecture, idx.size()));
  read_weights(res.model, style, idx, st, res, say);
  for (const ops::Tensor& t : st.params.values) res.parameters += t.numel();
  const fs::path tok_src = fs::is_directory(source) ? fs::path(source) : fs::path(source).parent_path();
  res.tokenizer_files = tokenizer_files(tok_src);
  check_tokenizer(tok_src, res.tokenizer_files);
  const std::string recipe_text = finetune_recipe(res.model, name, recipe, out, source);
  // Everything checked: now the files, into the staged directory.
  const fs::path tmp = staged.path();
  st.recipe_yaml = recipe_to_yaml(stored_recipe(res.model, name));
  throw_if_stopped(out_dir);
  write_checkpoint_atomic((tmp / "checkpoints").string(), st, WriteOptions{});
  res.checkpoint = (ckpt_dir / checkpoint_file_name(0)).string();
  if (!res.tokenizer_files.empty()) fs::create_directories(tmp / "tokenizer");
  for (const std::string& f : res.tokenizer_files) fs::copy_file(tok_src / f, tmp / "tokenizer" / f);
  if (res.tokenizer_files.empty())
    res.notes.push_back(fmt::format("no tokenizer files beside the weights (tokenizer.json, vocab.json + merges.txt, "
                                    "tokenizer.model): generate will read prompts as bytes; copy the model's tokenizer "
                                    "into {}", (out / "tokenizer").string()));
  if (recipe_inside) {
    fs::create_directories((tmp / recipe_in_out).parent_path());
    write_file_atomic((tmp / recipe_in_out).string(), recipe_text);
  }
  throw_if_stopped(out_dir);
  staged.commit();
  if (recipe_file) recipe_file->commit(recipe_text);
  res.recipe_path = recipe.string();
  return res;
}

}  // namespace runner
