// The README's walkthrough, from a text corpus to a Hugging Face-layout directory, run as a user
// runs it (from a working directory, with the recipe shipped in recipes/): a SentencePiece
// tokenizer trained on the corpus, the corpus prepared with it, a small GPT trained on it
// (validation perplexity reported), text generated through the run's tokenizer, and the export
// that carries the tokenizer files Debian's python3-sentencepiece reads with the same ids.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "runner/tokenize/tokenizer.h"
#include "tests/support/process.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using test_support::Result;
using test_support::runner_cmd;
namespace tok = runner::tok;

namespace {

const char* kCorpus = "/usr/share/common-licenses";

Result step(const std::string& args, const fs::path& cwd) {
  Result r = runner_cmd(args, cwd.string());
  INFO("runner " << args << "\n" << r.out);
  REQUIRE(r.code == 0);
  return r;
}

}  // namespace

TEST_CASE("corpus -> tokenizer -> prepared data -> trained model -> generated text -> Hugging Face directory") {
  const fs::path dir = test_support::fresh_dir("text_pipeline", "walk");
  fs::create_directories(dir / "recipes");
  fs::copy_file(fs::path(RUNNER_TEST_DIR) / ".." / "recipes" / "text-small.yaml", dir / "recipes" / "text-small.yaml");

  step(std::string("data tokenizer train ") + kCorpus + " --vocab 2000 --out data/tok", dir);
  REQUIRE(fs::exists(dir / "data" / "tok" / "tokenizer.model"));
  const auto tk = tok::load_tokenizer((dir / "data" / "tok").string());
  CHECK(tk->info().vocab_size == 2000);

  step(std::string("data prepare ") + kCorpus + " data/licenses --tokenizer data/tok --val-fraction 0.2", dir);
  const auto manifest = nlohmann::json::parse(test_support::slurp(dir / "data" / "licenses" / "dataset.json"));
  CHECK(manifest["tokenizer"]["hash"] == tk->info().hash);
  CHECK(manifest["val"]["documents"].get<int64_t>() >= 1);

  step("train recipes/text-small.yaml --quiet", dir);
  const fs::path run = dir / "runs" / "text-small";
  const auto losses = test_support::step_losses(run, true);
  REQUIRE(losses.count(1) == 1);
  REQUIRE(losses.count(300) == 1);
  MESSAGE("text-small: step 1 loss " << losses.at(1) << ", step 300 " << losses.at(300));
  CHECK(losses.at(1) > 6.5);    // about ln(2000) = 7.6 at the start
  CHECK(losses.at(300) < 4.5);  // it learned the corpus' words
  double val_ppl = 0;
  for (const auto& rec : test_support::metrics_records(run))
    if (rec.contains("val_ppl") && rec["val_ppl"].is_number()) val_ppl = rec["val_ppl"].get<double>();
  CHECK(val_ppl > 1.0);
  CHECK(val_ppl < 2000.0);  // better than a uniform guess over the vocabulary
  CHECK(tok::load_tokenizer((run / "tokenizer").string())->info().hash == tk->info().hash);

  Result g = step("generate runs/text-small --prompt 'This program is free software' --max-new-tokens 24 --json", dir);
  const auto gen = nlohmann::json::parse(g.out.substr(0, g.out.find('\n')));
  const std::vector<int32_t> ids = gen["tokens"];
  CHECK(ids.size() == 24);
  CHECK(gen["completion"].get<std::string>() == tk->decode(ids));
  CHECK(!gen["completion"].get<std::string>().empty());

  step("export runs/text-small --out hf/text-small", dir);
  for (const char* f : {"model.safetensors", "config.json", "generation_config.json", "tokenizer.model", "tokenizer_config.json",
                        "tokenizer.json"})  // tokenizer.json: what Hugging Face's fast tokenizers and tokenizers.js read
    CHECK_MESSAGE(fs::exists(dir / "hf" / "text-small" / f), f);
  const auto gc = nlohmann::json::parse(test_support::slurp(dir / "hf" / "text-small" / "generation_config.json"));
  CHECK(gc["eos_token_id"] == *tk->eos_id());
  // The exported tokenizer, read by SentencePiece itself, gives our ids.
  const std::string text = "This program is free software: you can redistribute it";
  std::string want;
  for (int32_t id : tk->encode(text)) want += (want.empty() ? "" : " ") + std::to_string(id);
  Result py = test_support::sh("/usr/bin/python3 -c \"import sentencepiece as s; p = s.SentencePieceProcessor(model_file='" +
                               (dir / "hf" / "text-small" / "tokenizer.model").string() + "'); print(' '.join(map(str, p.encode('" +
                               text + "'))))\" 2>&1");
  INFO(py.out);
  REQUIRE(py.code == 0);
  CHECK(py.out.substr(0, py.out.find('\n')) == want);
  // The exported tokenizer.json, read by runner's tokenizer.json reader, gives the same ids.
  CHECK(tok::load_tokenizer((dir / "hf" / "text-small" / "tokenizer.json").string())->encode(text) == tk->encode(text));
  fs::remove_all(dir);
}
