// `runner export`: the safetensors files, read by a reader of the test's own and run as the
// Hugging Face GPT-2 / Llama models written out in PyTorch (tests/python/hf_reference.py),
// give the runner's logits to 1e-5 in fp32; the npz holds the runner's logical tensors; bad
// requests exit 2 with the reason.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "ops/ops.h"
#include "runner/export/export.h"
#include "runner/export/import.h"
#include "runner/model/gpt.h"
#include "runner/trained/trained_model.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;

namespace {

using test_support::Result;
using test_support::runner_cmd;
using test_support::runner_ok;

fs::path temp_dir(const std::string& name) { return test_support::fresh_dir("export", name); }

// A tiny quickstart model trained 20 steps (so no tensor is still at its initial value).
fs::path train_tiny(const fs::path& dir, const std::string& extra) {
  fs::path run = dir / "run";
  Result r = runner_cmd(test_support::tiny_quickstart_args(run, 20, 24) + " " + extra);
  INFO(r.out);
  REQUIRE(r.code == 0);
  return run;
}

template <class T>
void write_raw(const fs::path& p, const std::vector<T>& v) {
  std::ofstream f(p, std::ios::binary);
  f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}

void check_against_torch(const std::string& name, const std::string& extra, const std::string& style) {
  fs::path dir = temp_dir(name);
  fs::path run = train_tiny(dir, extra);
  TrainedModel m = load_trained_model(run.string());
  CHECK(m.step == 20);
  // Two sequences over the whole context (every learned position, every rope angle).
  const int64_t B = 2, T = m.model().seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % 256);
  std::vector<float> logits = full_forward_logits(m, tokens, B, T);
  REQUIRE(logits.size() == static_cast<size_t>(B * T * 256));
  write_raw(dir / "tokens.i32", tokens);
  write_raw(dir / "logits.f32", logits);

  Result e = runner_cmd("export " + run.string() + " --out " + (dir / "st").string());
  INFO(e.out);
  REQUIRE(e.code == 0);
  CHECK(e.out.find(style + " layout") != std::string::npos);
  Result z = runner_cmd("export " + run.string() + " --format npz --out " + (dir / "npz").string());
  INFO(z.out);
  REQUIRE(z.code == 0);
  std::ifstream cf(dir / "st" / "config.json");
  nlohmann::json cfg = nlohmann::json::parse(cf);
  CHECK(cfg["model_type"] == style);
  CHECK(cfg["vocab_size"] == 256);

  Result py = test_support::sh("/usr/bin/python3 " + std::string(RUNNER_TEST_DIR) + "/python/hf_reference.py " +
                               (dir / "st").string() + " " + (dir / "npz").string() + " " + (dir / "tokens.i32").string() +
                               " " + (dir / "logits.f32").string() + " " + std::to_string(B) + " " + std::to_string(T));
  MESSAGE(py.out);
  CHECK(py.code == 0);
  fs::remove_all(dir);
}

}  // namespace

TEST_CASE("export: GPT-2 safetensors run in PyTorch give the runner's logits") {
  check_against_torch("gpt", "", "gpt2");
}

TEST_CASE("export: Llama safetensors (split q/k/v, gate/up, rotate-half rope, untied head) give the runner's logits") {
  check_against_torch("llama", std::string(test_support::kLlamaSets) + " model.tie_embeddings=false", "llama");
}

TEST_CASE("export: Llama with grouped-query attention (2 key-value heads for 4 query heads) gives the runner's logits") {
  check_against_torch("llama_gqa", std::string(test_support::kLlamaSets) + " model.tie_embeddings=false model.n_heads=4 model.n_kv_heads=2",
                      "llama");
}

TEST_CASE("export: the safetensors header and a bf16 export") {
  fs::path dir = temp_dir("header");
  fs::path run = train_tiny(dir, "");
  Result e = runner_cmd("export " + run.string() + " --dtype bf16 --out " + (dir / "bf").string());
  INFO(e.out);
  REQUIRE(e.code == 0);
  std::ifstream f(dir / "bf" / "model.safetensors", std::ios::binary);
  std::string blob((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  uint64_t n = 0;
  std::memcpy(&n, blob.data(), 8);
  CHECK(n % 8 == 0);
  nlohmann::json h = nlohmann::json::parse(blob.substr(8, n));
  TrainedModel m = load_trained_model(run.string());
  const auto& c = h["transformer.h.1.attn.c_attn.weight"];
  CHECK(c["dtype"] == "BF16");
  CHECK(c["shape"] == nlohmann::json({32, 96}));  // Conv1D: (in, out) = the transpose of our (3C, C)
  CHECK(!h.contains("lm_head.weight"));            // tied: the head reads transformer.wte
  // The data: every tensor's bytes lie end to end after the header, the last one ending the file.
  uint64_t end = 0;
  for (auto& [k, v] : h.items())
    if (k != "__metadata__") end = std::max<uint64_t>(end, v["data_offsets"][1].get<uint64_t>());
  CHECK(8 + n + end == blob.size());
  // One element: the bf16 rounding of the logical tensor's (row 1, column 0) = HF's (0, 1).
  const auto off = c["data_offsets"][0].get<uint64_t>();
  uint16_t hf01 = 0;
  std::memcpy(&hf01, blob.data() + 8 + n + off + 2, 2);
  const float ours10 = m.logical_tensor("h.1.attn.qkv.weight").host_data<float>()[32];
  uint32_t bits = static_cast<uint32_t>(hf01) << 16;
  float back;
  std::memcpy(&back, &bits, 4);
  CHECK(std::abs(back - ours10) <= std::abs(ours10) / 128);
  fs::remove_all(dir);
}

TEST_CASE("export: bad requests exit 2 and say why") {
  fs::path dir = temp_dir("bad");
  Result nodir = runner_cmd("export " + (dir / "nothing").string() + " --out " + (dir / "o").string());
  CHECK(nodir.code == 2);
  CHECK(nodir.out.find("no such run directory or checkpoint file") != std::string::npos);
  // layernorm + rope is neither GPT-2 nor Llama: safetensors refused, npz written.
  fs::path run = train_tiny(dir, "model.position=rope");
  Result mixed = runner_cmd("export " + run.string() + " --out " + (dir / "o").string());
  CHECK(mixed.code == 2);
  CHECK(mixed.out.find("no Hugging Face layout") != std::string::npos);
  CHECK(mixed.out.find("--format npz") != std::string::npos);
  CHECK(!fs::exists(dir / "o" / "model.safetensors"));
  Result npz = runner_cmd("export " + run.string() + " --format npz --out " + (dir / "o").string());
  CHECK(npz.code == 0);
  CHECK(fs::exists(dir / "o" / "model.npz"));
  Result bf = runner_cmd("export " + run.string() + " --format npz --dtype bf16 --out " + (dir / "o").string());
  CHECK(bf.code == 2);
  CHECK(bf.out.find("fp32 only") != std::string::npos);
  fs::remove_all(dir);
}

// config.json carries what training used, not the format's defaults: the dropout (GPT-2: its
// three places, where the runner drops out; Llama: attention only, and a note for the rest), the
// initializer range, and no begin/end token ids outside a byte vocabulary.
TEST_CASE("export: config.json carries the training's dropout and initializer range") {
  fs::path dir = temp_dir("config");
  fs::path gpt = dir / "gpt";
  runner_ok(test_support::tiny_quickstart_args(gpt, 2, 24) + " model.dropout=0.1 model.init_std=0.03");
  Result e = runner_ok("export " + gpt.string() + " --out " + (dir / "st").string());
  INFO(e.out);
  CHECK(e.out.find(" KiB) to ") != std::string::npos);  // the size in units, not a byte count
  CHECK(e.out.find("note:") == std::string::npos);
  CHECK(e.out.find("load: transformers.AutoModelForCausalLM.from_pretrained(\"" + (dir / "st").string() + "\")") != std::string::npos);
  CHECK(e.out.find("input_ids = list(text.encode(\"utf-8\"))") != std::string::npos);
  auto cfg = nlohmann::json::parse(test_support::slurp(dir / "st" / "config.json"));
  for (const char* k : {"resid_pdrop", "embd_pdrop", "attn_pdrop"}) CHECK_MESSAGE(cfg[k] == 0.1, k);
  CHECK(cfg["initializer_range"] == 0.03);
  CHECK(cfg["bos_token_id"].is_null());
  CHECK(cfg["eos_token_id"].is_null());
  Result z = runner_cmd("export " + gpt.string() + " --format npz --out " + (dir / "npz").string());
  REQUIRE(z.code == 0);
  auto ncfg = nlohmann::json::parse(test_support::slurp(dir / "npz" / "config.json"));
  CHECK(ncfg["model"]["dropout"] == 0.1);
  CHECK(ncfg["model"]["init_std"] == 0.03);

  fs::path llama = dir / "llama";
  runner_ok(test_support::tiny_quickstart_args(llama, 2, 24) + " model.dropout=0.1 model.init_std=0.04 " + test_support::kLlamaSets);
  e = runner_ok("export " + llama.string() + " --out " + (dir / "ll").string());
  CHECK(e.out.find("note: training dropped out at 0.1 on the embeddings and residual branches too") != std::string::npos);
  cfg = nlohmann::json::parse(test_support::slurp(dir / "ll" / "config.json"));
  CHECK(cfg["attention_dropout"] == 0.1);
  CHECK(cfg["initializer_range"] == 0.04);
  CHECK(cfg["bos_token_id"].is_null());
  fs::remove_all(dir);
}

// model.activation: relu2 end to end: the tiny quickstart learns with it; export writes the
// GPT-2 layout with Hugging Face's "relu2" activation_function, and import reads that back into
// the same model (same logits); a plain "relu" is still refused.
TEST_CASE("relu2: the quickstart with model.activation=relu2 learns, exports as GPT-2 relu2 and imports back") {
  fs::path dir = temp_dir("relu2");
  fs::path run = dir / "run";
  Result r = runner_ok(test_support::tiny_quickstart_args(run, 60, 24) + " optimizer.lr=1e-2 model.activation=relu2");
  const std::map<int64_t, double> losses = test_support::step_losses(run, true);
  REQUIRE(losses.size() >= 20);
  double first = 0, last = 0;
  auto it = losses.begin();
  auto rit = losses.rbegin();
  for (int i = 0; i < 5; ++i, ++it, ++rit) first += it->second / 5, last += rit->second / 5;
  MESSAGE("relu2 training loss, mean of the first 5 steps " << first << ", of the last 5 " << last);
  CHECK(last < 0.9 * first);

  TrainedModel m = load_trained_model(run.string());
  CHECK(m.model().activation == Activation::relu2);
  Result e = runner_ok("export " + run.string() + " --out " + (dir / "st").string());
  CHECK(e.out.find("gpt2 layout") != std::string::npos);
  auto cfg = nlohmann::json::parse(test_support::slurp(dir / "st" / "config.json"));
  CHECK(cfg["model_type"] == "gpt2");
  CHECK(cfg["activation_function"] == "relu2");

  Result im = runner_ok("import " + (dir / "st").string() + " --out " + (dir / "imp").string());
  TrainedModel back = load_trained_model((dir / "imp").string());
  CHECK(back.model().activation == Activation::relu2);
  const int64_t B = 1, T = m.model().seq_len;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % 256);
  const std::vector<float> a = full_forward_logits(m, tokens, B, T), b = full_forward_logits(back, tokens, B, T);
  REQUIRE(a.size() == b.size());
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(a[i] - b[i])));
  CHECK(worst <= 1e-5);

  cfg["activation_function"] = "relu";  // plain ReLU: not what the runner computes
  fs::copy(dir / "st", dir / "relu", fs::copy_options::recursive);
  std::ofstream(dir / "relu" / "config.json") << cfg.dump(2);
  Result bad = runner_cmd("import " + (dir / "relu").string() + " --out " + (dir / "imp_relu").string());
  INFO(bad.out);
  CHECK(bad.code == 2);
  CHECK(bad.out.find("activation_function \"relu\"") != std::string::npos);
  fs::remove_all(dir);
}

// An activation is one row of kActivationFacts (runner/recipe/enums.h) and one line of
// OPS_ACTIVATIONS (ops/kernels.h): each recipe word names the operator the model builder uses,
// each kernel stem is a recipe word, and each Hugging Face name of an ungated one imports as it.
TEST_CASE("activations: every word names an operator, every kernel stem a word, every HF name imports") {
  for (const runner::ActivationFacts& f : runner::kActivationFacts) {
    CAPTURE(f.word);
    CHECK(ops::op_kind_named(f.word).has_value());
    if (f.gated) continue;
    for (std::string_view name : {f.hf, f.hf_same[0], f.hf_same[1]}) {
      if (name.empty()) continue;
      CAPTURE(name);
      const nlohmann::json j = {{"model_type", "gpt2"}, {"vocab_size", 64}, {"n_embd", 32}, {"n_layer", 1},
                                {"n_head", 2}, {"n_positions", 16}, {"activation_function", std::string(name)}};
      runner::HfStyle style{};
      const runner::ModelConfig m = runner::model_from_hf_config(j.dump(), "config.json", style);
      CHECK(style == runner::HfStyle::gpt2);
      CHECK(m.activation == f.value);
      CHECK(runner::hf_style(m) == runner::HfStyle::gpt2);
    }
  }
#define OPS_STEM_IS_A_WORD(A, a) CHECK(runner::parse_enum<runner::Activation>(#a).has_value());
  OPS_ACTIVATIONS(OPS_STEM_IS_A_WORD)
#undef OPS_STEM_IS_A_WORD
}

// `runner inspect` takes a run directory as export and generate do: its latest checkpoint,
// saying which; a directory with none exits 2 and says what to pass.
TEST_CASE("inspect: a run directory means its latest checkpoint") {
  fs::path dir = temp_dir("inspect");
  fs::path run = dir / "run";
  Result t = runner_cmd(test_support::tiny_quickstart_args(run, 4, 24) + " checkpoint.every_steps=2");
  INFO(t.out);
  REQUIRE(t.code == 0);
  for (const fs::path& arg : {run, run / "checkpoints"}) {
    Result i = runner_cmd("inspect " + arg.string());
    INFO(i.out);
    CHECK(i.code == 0);
    CHECK(i.out.find("checkpoints at steps 2, 4; inspecting the latest, step_00000004.h5") != std::string::npos);
    CHECK(i.out.find("step 4, tokens") != std::string::npos);
    CHECK(i.out.find("no loss scaling (precision.compute fp32)") != std::string::npos);  // not "loss scale 1"
    CHECK(i.out.find("loss scale 1") == std::string::npos);
    CHECK(i.out.find(" ok") != std::string::npos);
  }
  fs::create_directories(dir / "empty");
  Result none = runner_cmd("inspect " + (dir / "empty").string());
  CHECK(none.code == 2);
  CHECK(none.out.find("no checkpoint in") != std::string::npos);
  CHECK(none.out.find("or a checkpoint .h5 file") != std::string::npos);
  fs::remove_all(dir);
}
