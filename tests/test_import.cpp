// `runner import`, model.init_from, and the text side of export and generate: Hugging Face model
// directories written by tests/python/hf_reference.py (random weights, safetensors by hand) are
// imported; the runner's logits of the imported model equal the Hugging Face conventions run in
// PyTorch (1e-5), export gives the imported tensors back byte for byte, a run started from the
// import (model.init_from) has PyTorch's loss at its first step, and every user error exits 2
// with the file and the tensor before anything is written.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iomanip>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/generate/generate.h"
#include "runner/tokenize/tokenizer.h"
#include "runner/trained/trained_model.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;
using test_support::Result;
using test_support::runner_cmd;

namespace {

const std::string kPy = "/usr/bin/python3 " + std::string(RUNNER_TEST_DIR) + "/python/hf_reference.py ";

fs::path temp_dir(const std::string& name) { return test_support::fresh_dir("import", name); }

// A Hugging Face model directory with random weights (hf_reference.py make; opts "key=value ...").
fs::path make_hf(const fs::path& dir, const std::string& arch, const std::string& opts = "") {
  Result r = test_support::sh(kPy + "make " + dir.string() + " " + arch + " " + opts);
  INFO(r.out);
  REQUIRE(r.code == 0);
  return dir;
}

Result import_cmd(const fs::path& src, const fs::path& out, const std::string& extra = "") {
  return runner_cmd("import " + src.string() + " --out " + out.string() + " " + extra);
}

// name -> (dtype, raw bytes) of every tensor of a model directory (one file or an index's shards)
// or of one safetensors file.
std::map<std::string, std::pair<std::string, std::string>> tensors_of(const fs::path& p) {
  std::vector<fs::path> files;
  if (fs::is_regular_file(p)) {
    files.push_back(p);
  } else if (fs::exists(p / "model.safetensors.index.json")) {
    auto idx = nlohmann::json::parse(test_support::slurp(p / "model.safetensors.index.json"));
    std::set<std::string> names;
    for (auto& [k, v] : idx["weight_map"].items()) names.insert(v.get<std::string>());
    for (const std::string& n : names) files.push_back(p / n);
  } else {
    files.push_back(p / "model.safetensors");
  }
  std::map<std::string, std::pair<std::string, std::string>> out;
  for (const fs::path& f : files) {
    const std::string blob = test_support::slurp(f);
    REQUIRE(blob.size() >= 8);
    uint64_t n = 0;
    std::memcpy(&n, blob.data(), 8);
    auto h = nlohmann::json::parse(blob.substr(8, n));
    for (auto& [k, v] : h.items()) {
      if (k == "__metadata__") continue;
      const uint64_t b = v["data_offsets"][0], e = v["data_offsets"][1];
      out[k] = {v["dtype"].get<std::string>(), blob.substr(8 + n + b, e - b)};
    }
  }
  return out;
}

// The runner's logits of the imported model `out` on two sequences over the whole context,
// against the Hugging Face files in `hf` run in PyTorch: hf_reference.py's verdict (1e-5).
Result logits_vs_torch(const fs::path& hf, const fs::path& out, const fs::path& dir) {
  TrainedModel m = load_trained_model(out.string());
  CHECK(m.step == 0);
  const int64_t B = 2, T = m.model().seq_len, V = m.model().vocab_size;
  std::vector<int32_t> tokens(static_cast<size_t>(B * T));
  for (int64_t i = 0; i < B * T; ++i) tokens[static_cast<size_t>(i)] = static_cast<int32_t>((i * 37 + 11) % V);
  const std::vector<float> logits = full_forward_logits(m, tokens, B, T);
  std::ofstream(dir / "tokens.i32", std::ios::binary)
      .write(reinterpret_cast<const char*>(tokens.data()), static_cast<std::streamsize>(tokens.size() * 4));
  std::ofstream(dir / "logits.f32", std::ios::binary)
      .write(reinterpret_cast<const char*>(logits.data()), static_cast<std::streamsize>(logits.size() * 4));
  Result py = test_support::sh(kPy + "logits " + hf.string() + " " + (dir / "tokens.i32").string() + " " +
                               (dir / "logits.f32").string() + " " + std::to_string(B) + " " + std::to_string(T));
  MESSAGE(py.out);
  return py;
}

// Import `hf`, compare the logits with PyTorch, export with `dtype` and compare every tensor's
// bytes with the input's.
void import_check_export(const fs::path& dir, const fs::path& hf, const std::string& dtype, const std::string& style) {
  Result im = import_cmd(hf, dir / "imp");
  INFO(im.out);
  REQUIRE(im.code == 0);
  CHECK(fs::exists(dir / "imp" / "checkpoints" / "step_00000000.h5"));
  CHECK(fs::exists(dir / "imp" / "finetune.yaml"));
  CHECK(logits_vs_torch(hf, dir / "imp", dir).code == 0);
  Result ex = runner_cmd("export " + (dir / "imp").string() + " --dtype " + dtype + " --out " + (dir / "exp").string());
  INFO(ex.out);
  REQUIRE(ex.code == 0);
  CHECK(ex.out.find(style + " layout") != std::string::npos);
  const auto a = tensors_of(hf), b = tensors_of(dir / "exp" / "model.safetensors");
  CHECK(a.size() == b.size());
  for (const auto& [name, t] : a) {
    INFO(name);
    REQUIRE(b.count(name) == 1);
    CHECK(b.at(name).first == t.first);
    CHECK(b.at(name).second == t.second);  // byte for byte
  }
}

// A Hugging Face Llama with `opts` made in DIR/hf and put through import_check_export in
// `dtype`: the imported model.
TrainedModel llama_imported(const fs::path& dir, const std::string& opts, const std::string& dtype) {
  import_check_export(dir, make_hf(dir / "hf", "llama", opts), dtype, "llama");
  return load_trained_model((dir / "imp").string());
}

}  // namespace

TEST_CASE("import gpt2: PyTorch's logits, export bit-exact (fp32 and fp16)") {
  fs::path dir = temp_dir("gpt2");
  import_check_export(dir, make_hf(dir / "hf", "gpt2"), "fp32", "gpt2");
  fs::path d16 = dir / "f16";
  import_check_export(d16, make_hf(d16 / "hf", "gpt2", "dtype=F16 tie=0 seed=3"), "fp16", "gpt2");
  // One .safetensors file named on the command line, with GPT2Model's names (no "transformer.",
  // as the hub's gpt2 has them).
  fs::path bare = make_hf(dir / "bare", "gpt2", "bare=1 seed=4");
  Result im = import_cmd(bare / "model.safetensors", dir / "bare_imp");
  INFO(im.out);
  REQUIRE(im.code == 0);
  CHECK(logits_vs_torch(bare, dir / "bare_imp", dir).code == 0);
  fs::remove_all(dir);
}

TEST_CASE("import llama: sharded bf16 with biases and an untied head; PyTorch's logits, export --dtype bf16 bit-exact") {
  fs::path dir = temp_dir("llama");
  // The stored recipe has the config's model: rms_norm_eps, rope_theta, intermediate_size.
  TrainedModel m = llama_imported(dir, "dtype=BF16 shards=3 bias=1 inner=80 seed=5", "bf16");
  CHECK(m.model().norm_eps == 1e-6);
  CHECK(m.model().rope_theta == 500000.0);
  CHECK(m.model().mlp_hidden() == 80);
  CHECK(m.model().bias);
  CHECK(!m.model().tie_embeddings);
  fs::remove_all(dir);
}

// Grouped-query attention (num_key_value_heads < num_attention_heads): the fused qkv rows are
// q | k | v with k and v of kv_heads * head_size rows (hf_tensors).
TEST_CASE("import llama gqa") {
  fs::path dir = temp_dir("gqa");
  TrainedModel m = llama_imported(dir, "kv_heads=2 heads=4 seed=7", "fp32");
  CHECK(m.model().kv_heads() == 2);
  fs::remove_all(dir);
}

TEST_CASE("import: errors exit 2 naming the file and the tensor, and write nothing") {
  fs::path dir = temp_dir("errors");
  auto refused = [&](const fs::path& src, const std::vector<std::string>& says) {
    Result r = import_cmd(src, dir / "out");
    INFO(r.out);
    CHECK(r.code == 2);
    for (const std::string& s : says) CHECK_MESSAGE(r.out.find(s) != std::string::npos, s);
    CHECK(!fs::exists(dir / "out"));
  };
  fs::path bert = make_hf(dir / "bert", "gpt2");
  auto cfg = nlohmann::json::parse(test_support::slurp(bert / "config.json"));
  cfg["architectures"] = {"BertForMaskedLM"};
  cfg["model_type"] = "bert";
  std::ofstream(bert / "config.json") << cfg.dump();
  refused(bert, {"config.json", "architecture \"BertForMaskedLM\" is not one the runner imports", "GPT2LMHeadModel"});

  refused(make_hf(dir / "missing", "llama", "drop=model.layers.1.mlp.up_proj.weight"),
          {"model.safetensors", "tensor model.layers.1.mlp.up_proj.weight is missing"});

  fs::path wide = make_hf(dir / "shape", "gpt2");
  cfg = nlohmann::json::parse(test_support::slurp(wide / "config.json"));
  cfg["n_inner"] = 64;
  std::ofstream(wide / "config.json") << cfg.dump();
  refused(wide, {"tensor transformer.h.0.mlp.c_fc.weight has shape [32, 128], the config gives [32, 64]"});

  refused(make_hf(dir / "f64", "gpt2", "dtype=F64"), {"is F64, not a floating-point type the runner reads", "F32, F16 or BF16"});

  fs::path cut = make_hf(dir / "cut", "gpt2");
  fs::resize_file(cut / "model.safetensors", fs::file_size(cut / "model.safetensors") - 100);
  refused(cut, {"model.safetensors", "runs past the end of the data", "truncated"});

  fs::path hdr = make_hf(dir / "header", "gpt2");
  {
    std::fstream f(hdr / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    const uint64_t huge = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&huge), 8);
  }
  refused(hdr, {"model.safetensors", "the header length 1099511627776 runs past the end of the file"});
  fs::path tiny = dir / "tiny";
  fs::create_directories(tiny);
  std::ofstream(tiny / "model.safetensors") << "abc";
  fs::copy_file(cut / "config.json", tiny / "config.json");
  refused(tiny / "model.safetensors", {"the file has 3 bytes, fewer than the 8-byte header length"});

  fs::path junk = make_hf(dir / "junk", "gpt2");
  {
    std::fstream f(junk / "model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(8);
    f.write("!!", 2);
  }
  refused(junk, {"the header is not a JSON object"});

  // An existing import is not overwritten.
  fs::path ok = make_hf(dir / "ok", "gpt2");
  REQUIRE(import_cmd(ok, dir / "done").code == 0);
  Result again = import_cmd(ok, dir / "done");
  CHECK(again.code == 2);
  CHECK(again.out.find("already holds a checkpoint") != std::string::npos);
  fs::remove_all(dir);
}

// model.init_from: the run's first step is computed with the imported weights (its loss is the
// PyTorch model's on the same batch: the data is one token repeated, so every window is the
// same sequence), at step 1 from a fresh start; the tokenizer files beside the weights reach
// RUN_DIR/tokenizer/; a relative init_from is read beside the recipe (finetune.yaml's ".").
void init_from_loss(const std::string& arch, const std::string& opts, const std::string& layout, const std::string& tag) {
  fs::path dir = temp_dir("init_" + tag);
  fs::path hf = make_hf(dir / "hf", arch, opts + " tok=1 vocab=260");
  Result im = import_cmd(hf, dir / "imp");
  INFO(im.out);
  REQUIRE(im.code == 0);
  CHECK(im.out.find("tokenizer: vocab.json, merges.txt, tokenizer_config.json copied") != std::string::npos);
  std::vector<uint16_t> data(4096, 7);
  std::ofstream(dir / "seven.bin", std::ios::binary).write(reinterpret_cast<const char*>(data.data()), 8192);
  const std::string sets = " --set data.kind=bin data.path=" + (dir / "seven.bin").string() +
                           " train.steps=2 batch.global=2 batch.micro=1 train.eval_every=0 train.eval_batches=1" + layout + " --run-dir " +
                           (dir / "run").string();
  Result t = test_support::sh((layout.empty() ? test_support::binary() : test_support::mpirun(2) + test_support::binary()) +
                              " train " + (dir / "imp" / "finetune.yaml").string() + sets + " 2>&1");
  INFO(t.out);
  REQUIRE(t.code == 0);
  CHECK(t.out.find("started from the weights of") != std::string::npos);
  const auto losses = test_support::step_losses(dir / "run", true);
  REQUIRE(losses.count(1) == 1);
  Result py = test_support::sh(kPy + "loss " + hf.string() + " 7 16");
  INFO(py.out);
  REQUIRE(py.code == 0);
  const double ref = std::stod(py.out);
  MESSAGE(arch << layout << ": step 1 loss " << std::setprecision(10) << losses.at(1) << ", PyTorch " << ref);
  CHECK(std::abs(losses.at(1) - ref) <= 1e-5 * std::abs(ref));
  CHECK(losses.at(2) < losses.at(1));  // it trains from there
  for (const char* f : {"vocab.json", "merges.txt", "tokenizer_config.json"})
    CHECK(test_support::slurp(dir / "run" / "tokenizer" / f) == test_support::slurp(hf / f));
  fs::remove_all(dir);
}

TEST_CASE("init_from: a run starts from the imported GPT-2 at step 1 with PyTorch's loss") { init_from_loss("gpt2", "", "", "gpt2"); }

TEST_CASE("init_from: the imported Llama under tp 2 (each rank its shard) with PyTorch's loss") {
  init_from_loss("llama", "bias=1", " parallel.tp=2", "llama_tp");
}

// Two pipeline stages: the tied embedding is held by the first and the last stage.
TEST_CASE("init_from: the imported GPT-2 under pp 2 (the tied embedding on both stages) with PyTorch's loss") {
  init_from_loss("gpt2", "seed=9", " parallel.pp=2", "gpt2_pp");
}

TEST_CASE("init_from: a model section that differs from the checkpoint's exits 2 listing each difference") {
  fs::path dir = temp_dir("mismatch");
  REQUIRE(import_cmd(make_hf(dir / "hf", "llama"), dir / "imp").code == 0);
  std::ofstream(dir / "imp" / "train.txt") << std::string(400, '7');  // finetune.yaml's data.path: bytes below the vocabulary
  Result r = runner_cmd("train " + (dir / "imp" / "finetune.yaml").string() + " --set model.n_layers=3 model.rope_theta=10000 "
                        "model.tie_embeddings=true --run-dir " + (dir / "run").string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("model.n_layers is 3, the checkpoint model.init_from names") != std::string::npos);
  CHECK(r.out.find("has 2; set model.n_layers: 2") != std::string::npos);
  CHECK(r.out.find("model.rope_theta is 10000") != std::string::npos);
  CHECK(r.out.find("model.tie_embeddings is true") != std::string::npos);
  CHECK(r.out.find("3 problems") != std::string::npos);
  CHECK(!fs::exists(dir / "run"));
  Result none = runner_cmd("train " + (dir / "imp" / "finetune.yaml").string() + " --set model.init_from=nothing-here --run-dir " +
                           (dir / "run").string());
  CHECK(none.code == 2);
  CHECK(none.out.find("model.init_from: no checkpoint or directory at") != std::string::npos);
  CHECK(!fs::exists(dir / "run"));
  fs::remove_all(dir);
}

// The data's tokenizer and the weights' are both known and differ (byte-level text against the
// import's GPT-2 style vocabulary): the ids would mean other text than the weights learned.
TEST_CASE("init_from: data tokenized otherwise than the imported weights exits 2 naming both tokenizers") {
  fs::path dir = temp_dir("tokmismatch");
  REQUIRE(import_cmd(make_hf(dir / "hf", "gpt2", "tok=1 vocab=260"), dir / "imp").code == 0);
  std::ofstream(dir / "text.txt") << std::string(4000, 'a');
  Result r = runner_cmd("train " + (dir / "imp" / "finetune.yaml").string() + " --set data.kind=text data.path=" +
                        (dir / "text.txt").string() + " --run-dir " + (dir / "run").string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("the data's tokenizer (byte, 256 tokens") != std::string::npos);
  CHECK(r.out.find("is not the one the weights of model.init_from came with") != std::string::npos);
  CHECK(r.out.find("runner data prepare ... --tokenizer") != std::string::npos);
  CHECK(!fs::exists(dir / "run"));
  fs::remove_all(dir);
}

TEST_CASE("export: generation_config.json beside the weights; a byte-level run ships no tokenizer and says so") {
  fs::path dir = temp_dir("genconfig");
  REQUIRE(import_cmd(make_hf(dir / "hf", "gpt2"), dir / "imp", "--recipe-out " + (dir / "recipes" / "ft.yaml").string()).code == 0);
  // The recipe elsewhere names the import relative to itself (model.init_from is read beside it).
  CHECK(!fs::exists(dir / "imp" / "finetune.yaml"));
  CHECK(test_support::slurp(dir / "recipes" / "ft.yaml").find("init_from: \"../imp\"") != std::string::npos);
  Result e = runner_cmd("export " + (dir / "imp").string() + " --out " + (dir / "exp").string());
  INFO(e.out);
  REQUIRE(e.code == 0);
  auto g = nlohmann::json::parse(test_support::slurp(dir / "exp" / "generation_config.json"));
  CHECK(g["max_length"] == 16);
  CHECK(g["bos_token_id"].is_null());  // bytes: no special ids
  CHECK(g["eos_token_id"].is_null());
  CHECK(e.out.find("tokenizer: none, the model reads raw bytes") != std::string::npos);
  CHECK(!fs::exists(dir / "exp" / "vocab.json"));
  fs::remove_all(dir);
}

// A tokenizer with multi-byte pieces: id 1 is the first two bytes of "€" (E2 82), id 2 its last
// (AC), id 3.. the letters a, b, ...; a partial character decodes to U+FFFD, as byte-level BPE
// decoders do.
class PieceTokenizer final : public tok::Tokenizer {
 public:
  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < text.size(); ++i) {
      if (text.compare(i, 3, "\xE2\x82\xAC") == 0) {
        ids.insert(ids.end(), {1, 2});
        i += 2;
      } else {
        ids.push_back(3 + (text[i] - 'a'));
      }
    }
    return ids;
  }
  std::string decode(std::span<const int32_t> ids) const override {
    std::string s;
    for (size_t i = 0; i < ids.size(); ++i) {
      if (ids[i] == 1 && i + 1 < ids.size() && ids[i + 1] == 2) {
        s += "\xE2\x82\xAC";
        ++i;
      } else if (ids[i] == 1 || ids[i] == 2) {
        s += "\xEF\xBF\xBD";
      } else {
        s += static_cast<char>('a' + ids[i] - 3);
      }
    }
    return s;
  }
  tok::TokenizerInfo info() const override { return {"test", "pieces", 29, "0"}; }
  std::optional<int32_t> eos_id() const override { return std::nullopt; }
  void save(const std::string&) const override {}
};

TEST_CASE("generate: the text streams whole characters, with a tokenizer and with bytes") {
  PieceTokenizer tk;
  TextStream s(&tk);
  CHECK(s.push(3) == "a");
  CHECK(s.push(1).empty());  // "a\uFFFD": held
  CHECK(s.push(2) == "\xE2\x82\xAC");
  CHECK(s.push(1).empty());
  CHECK(s.finish() == "\xEF\xBF\xBD");  // the end: what there is
  TextStream b(nullptr);  // bytes: an unfinished UTF-8 sequence waits for its last byte
  CHECK(b.push('x') == "x");
  CHECK(b.push(0xE2).empty());
  CHECK(b.push(0x82).empty());
  CHECK(b.push(0xAC) == "\xE2\x82\xAC");
  CHECK(b.push(0x80) == "\x80");  // a stray continuation byte is not held
  CHECK(b.text() == "x\xE2\x82\xAC\x80");
}

// The prompt is encoded with the request's tokenizer (the same tokens as the raw ids of its
// encoding) and the completion is the tokenizer's decoding of the new tokens.
TEST_CASE("generate: prompts encoded and completions decoded with the tokenizer; --tokens keeps ids") {
  fs::path dir = temp_dir("gen");
  REQUIRE(import_cmd(make_hf(dir / "hf", "llama", "vocab=29 seed=11"), dir / "imp").code == 0);
  TrainedModel m = load_trained_model((dir / "imp").string());
  PieceTokenizer tk;
  GenerateRequest text;
  text.prompts = {"ab\xE2\x82\xAC" "c"};
  text.tokenizer = &tk;
  text.max_new_tokens = 8;
  GenerateRequest raw;
  raw.prompt_ids = {tk.encode(text.prompts[0])};
  raw.max_new_tokens = 8;
  REQUIRE(raw.prompt_ids[0] == std::vector<int32_t>{3, 4, 1, 2, 5});
  const auto a = generate(m, text), b = generate(m, raw);
  REQUIRE(a.size() == 1);
  CHECK(a[0].tokens == b[0].tokens);
  CHECK(a[0].completion == tk.decode(a[0].tokens));
  // The command line: --tokens takes the ids and prints the new ones.
  std::string ids;
  for (int32_t t : b[0].tokens) ids += (ids.empty() ? "" : " ") + std::to_string(t);
  Result r = runner_cmd("generate " + (dir / "imp").string() + " --tokens --prompt '3 4 1 2 5' --max-new-tokens 8");
  INFO(r.out);
  CHECK(r.code == 0);
  CHECK(r.out == ids + "\n");
  Result bad = runner_cmd("generate " + (dir / "imp").string() + " --tokens --prompt '3 x'");
  CHECK(bad.code == 2);
  CHECK(bad.out.find("prompt 1: \"x\" is not a token id") != std::string::npos);
  Result big = runner_cmd("generate " + (dir / "imp").string() + " --tokens --prompt '3 29'");
  CHECK(big.code == 2);
  CHECK(big.out.find("prompt 1 has token 29 outside the model's vocabulary of 29") != std::string::npos);
  fs::remove_all(dir);
}

// A GPT-2 style vocab.json/merges.txt beside the weights
// travels import -> generate (prompt encoded, output decoded) -> export (tokenizer files,
// special ids in generation_config.json).
TEST_CASE("import: the tokenizer beside the weights serves generate and export") {
  fs::path dir = temp_dir("tok");
  fs::path hf = make_hf(dir / "hf", "gpt2", "tok=1 vocab=260");
  REQUIRE(import_cmd(hf, dir / "imp").code == 0);
  const auto tk = tok::load_tokenizer((dir / "imp" / "tokenizer").string());
  CHECK(tk->info().vocab_size == 259);
  Result g = runner_cmd("generate " + (dir / "imp").string() + " --prompt 'the tea' --max-new-tokens 4 --json");
  INFO(g.out);
  REQUIRE(g.code == 0);
  auto j = nlohmann::json::parse(g.out.substr(0, g.out.find('\n')));
  std::vector<int32_t> toks = j["tokens"];
  // A random model's byte-level tokens need not form UTF-8: JSON carries U+FFFD for those bytes
  // (as Hugging Face's decode with errors="replace"), the streamed text the bytes themselves.
  const std::string raw = tk->decode(toks);
  const auto replaced = nlohmann::json::parse(nlohmann::json(raw).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
  CHECK(j["completion"] == replaced);
  Result st = runner_cmd("generate " + (dir / "imp").string() + " --prompt 'the tea' --max-new-tokens 4");
  CHECK(st.code == 0);  // streamed (one prompt): the prompt, then the decoded completion
  CHECK(st.out.rfind("the tea" + raw, 0) == 0);
  Result e = runner_cmd("export " + (dir / "imp").string() + " --out " + (dir / "exp").string());
  INFO(e.out);
  REQUIRE(e.code == 0);
  CHECK(tok::load_tokenizer((dir / "exp").string())->info().hash == tk->info().hash);
  auto gc = nlohmann::json::parse(test_support::slurp(dir / "exp" / "generation_config.json"));
  CHECK(gc["eos_token_id"] == 258);
  CHECK(e.out.find("AutoTokenizer.from_pretrained") != std::string::npos);
  fs::remove_all(dir);
}

namespace {

// Rewrites a safetensors file through `edit` (its header and its data area), the header padded
// to 8 bytes as the format asks.
void rewrite_safetensors(const fs::path& f, const std::function<void(nlohmann::json&, std::string&)>& edit) {
  const std::string blob = test_support::slurp(f);
  uint64_t n = 0;
  std::memcpy(&n, blob.data(), 8);
  nlohmann::json h = nlohmann::json::parse(blob.substr(8, n));
  std::string data = blob.substr(8 + n);
  edit(h, data);
  std::string text = h.dump();
  while (text.size() % 8) text += ' ';
  const uint64_t len = text.size();
  std::ofstream o(f, std::ios::binary | std::ios::trunc);
  o.write(reinterpret_cast<const char*>(&len), 8);
  o << text << data;
}

fs::path copy_of(const fs::path& src, const fs::path& dst) {
  fs::copy(src, dst, fs::copy_options::recursive);
  return dst;
}

void edit_config(const fs::path& dir, const std::function<void(nlohmann::json&)>& edit) {
  auto cfg = nlohmann::json::parse(test_support::slurp(dir / "config.json"));
  edit(cfg);
  std::ofstream(dir / "config.json", std::ios::trunc) << cfg.dump();
}

}  // namespace

TEST_CASE("import: impossible config values, overlapping or uncovered tensor data, non-finite weights and an "
          "unreadable tokenizer are refused, naming the file and the value") {
  fs::path dir = temp_dir("edges");
  const fs::path gpt = make_hf(dir / "gpt", "gpt2", "tok=1"), llama = make_hf(dir / "llama", "llama");
  int n = 0;
  auto refused = [&](const fs::path& src, const std::vector<std::string>& says) {
    const fs::path out = dir / ("out" + std::to_string(n++));
    Result r = import_cmd(src, out);
    INFO(r.out);
    CHECK(r.code == 2);
    for (const std::string& s : says) CHECK_MESSAGE(r.out.find(s) != std::string::npos, s);
    CHECK(!fs::exists(out));
  };
  auto config_case = [&](const fs::path& base, const char* key, nlohmann::json v, const std::string& shown) {
    const fs::path c = copy_of(base, dir / (std::string("cfg_") + key));
    edit_config(c, [&](nlohmann::json& j) { j[key] = v; });
    refused(c, {"config.json", std::string("\"") + key + "\" is " + shown});
  };
  config_case(llama, "num_key_value_heads", 0, "0");
  config_case(llama, "rope_theta", -1.0, "-1");
  config_case(llama, "max_position_embeddings", -5, "-5");
  config_case(llama, "rms_norm_eps", 0.0, "0");
  config_case(gpt, "layer_norm_epsilon", -1e-5, "-1e-05");
  config_case(gpt, "n_head", 0, "0");
  config_case(gpt, "resid_pdrop", 1.5, "1.5");

  // Two tensors of one size made to share their bytes: one would silently read the other's.
  const fs::path overlap = copy_of(gpt, dir / "overlap");
  rewrite_safetensors(overlap / "model.safetensors", [](nlohmann::json& h, std::string&) {
    h["transformer.h.0.ln_1.bias"]["data_offsets"] = h["transformer.h.0.ln_1.weight"]["data_offsets"];
  });
  refused(overlap, {"model.safetensors", "overlaps tensor"});
  // Bytes after the last tensor belong to none.
  const fs::path tail = copy_of(gpt, dir / "tail");
  rewrite_safetensors(tail / "model.safetensors", [](nlohmann::json&, std::string& data) { data += std::string(16, '\0'); });
  refused(tail, {"model.safetensors", "but the data area holds"});
  // A NaN weight.
  const fs::path nan = copy_of(gpt, dir / "nan");
  rewrite_safetensors(nan / "model.safetensors", [](nlohmann::json& h, std::string& data) {
    const uint64_t at = h["transformer.h.1.mlp.c_proj.weight"]["data_offsets"][0];
    const float v = std::nanf("");
    std::memcpy(data.data() + at + 4, &v, 4);
  });
  refused(nan, {"model.safetensors", "tensor transformer.h.1.mlp.c_proj.weight holds a non-finite value (nan) at element 1"});
  // A tokenizer the runner cannot load is refused, not copied.
  const fs::path badtok = copy_of(gpt, dir / "badtok");
  fs::remove(badtok / "vocab.json");
  fs::remove(badtok / "merges.txt");
  std::ofstream(badtok / "tokenizer.json") << "{\"model\": {\"type\": \"BPE\", \"vocab\": ";  // cut short
  refused(badtok, {"tokenizer.json", "the tokenizer beside the weights does not load"});
  fs::remove_all(dir);
}

TEST_CASE("import: --recipe-out and OUT replaced only with --force; an interrupted import leaves nothing, a killed "
          "one's temporary is swept by the next") {
  fs::path dir = temp_dir("publish");
  const fs::path hf = make_hf(dir / "hf", "gpt2");
  const fs::path recipe = dir / "ft.yaml";
  std::ofstream(recipe) << "my own recipe\n";
  Result r = import_cmd(hf, dir / "imp", "--recipe-out " + recipe.string());
  INFO(r.out);
  CHECK(r.code == 2);
  CHECK(r.out.find("ft.yaml") != std::string::npos);
  CHECK(r.out.find("--force") != std::string::npos);
  CHECK(test_support::slurp(recipe) == "my own recipe\n");
  CHECK(!fs::exists(dir / "imp"));
  REQUIRE(import_cmd(hf, dir / "imp", "--recipe-out " + recipe.string() + " --force").code == 0);
  CHECK(test_support::slurp(recipe).find("init_from") != std::string::npos);
  // Replacing the import itself: --force, once the new one is complete.
  REQUIRE(import_cmd(hf, dir / "imp", "--recipe-out " + recipe.string() + " --force").code == 0);

  auto temporaries = [&] {
    int k = 0;
    for (const auto& e : fs::directory_iterator(dir)) k += e.path().filename().string().find(".tmp.") != std::string::npos;
    return k;
  };
  // Killed while writing the checkpoint (a crash mid-write): nothing at OUT, the temporary left...
  Result killed = test_support::sh("RUNNER_CKPT_FAULT_AFTER_BYTES=64 RUNNER_CKPT_FAULT_EXIT=1 " + test_support::binary() +
                            " import " + hf.string() + " --out " + (dir / "imp3").string());
  INFO(killed.out);
  CHECK(killed.code == 137);
  CHECK(!fs::exists(dir / "imp3"));
  CHECK(temporaries() == 1);
  // ... and removed by the next import of that output.
  CHECK(import_cmd(hf, dir / "imp3").code == 0);
  CHECK(temporaries() == 0);
  // SIGTERM while the checkpoint is being written: exit 3, nothing at OUT, no temporary.
  const pid_t pid = test_support::spawn_runner({"import", hf.string(), "--out", (dir / "imp4").string()},
                                               {"RUNNER_CKPT_FAULT_SLOW_MS=3000"}, dir / "log.txt");
  bool seen = false;
  for (int i = 0; i < 60000 && !seen; ++i) {
    for (const auto& e : fs::directory_iterator(dir)) seen = seen || e.path().filename().string().rfind(".imp4.tmp.", 0) == 0;
    if (!seen) ::usleep(1000);
  }
  REQUIRE(seen);
  ::kill(pid, SIGTERM);
  int status = 0;
  ::waitpid(pid, &status, 0);
  INFO(test_support::slurp(dir / "log.txt"));
  CHECK(WIFEXITED(status));
  CHECK(WEXITSTATUS(status) == 3);
  CHECK(!fs::exists(dir / "imp4"));
  CHECK(temporaries() == 0);
  fs::remove_all(dir);
}
