// Tests for runner/tokenize's SentencePiece side: `runner data tokenizer train` (BPE and
// Unigram, small vocabularies, on part of the sample), the trained .model's ids against
// Debian's python3-sentencepiece on the whole multi-megabyte sample
// (tests/tokenizer/corpus.h), the same model written as a Hugging Face tokenizer.json the way
// transformers' converter does (tests/tokenizer/sp_reference.py) giving SentencePiece's ids
// through our own BPE/Unigram pipeline, decoding, save/load and the trainer's errors.
#include <doctest/doctest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "runner/data/data.h"
#include "runner/errors.h"
#include "runner/tokenize/tokenizer.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "tests/support/token_streams.h"
#include "tests/tokenizer/corpus.h"
#include "tests/tokenizer/reference.h"

using namespace runner;
namespace fs = std::filesystem;

namespace {

const std::string kScript = std::string("/usr/bin/python3 ") + RUNNER_TEST_DIR + "/tokenizer/sp_reference.py";

// The sample (~2.2 MB files, ~0.8 MB generated) and a directory holding it as JSON and the
// two trained models; built once per test binary.
struct Fixture {
  test_support::TempDir dir{"test_tokenizer_sp"};
  std::vector<std::string> docs = corpus::documents(2200000, 800000);
  std::string train_log[2];
  Fixture() {
    reference::write_docs(dir / "docs.json", docs);
    // Training text: every fourth document (~0.75 MB).
    std::ofstream train(dir / "train.txt", std::ios::binary);
    for (size_t d = 0; d < docs.size(); d += 4) train << docs[d] << "\n";
    train.close();
    const char* kinds[2] = {"bpe", "unigram"};
    for (int k = 0; k < 2; ++k) {
      const auto r = test_support::runner_cmd("data tokenizer train " + dir.file("train.txt") + " --vocab 2000 --threads 2 --character-coverage 0.98 --model " +
                                              kinds[k] + " --out " + dir.file(kinds[k]));
      REQUIRE_MESSAGE(r.code == 0, r.out);
      train_log[k] = r.out;
    }
  }
};

const Fixture& fixture() {
  static Fixture f;
  return f;
}

std::vector<std::vector<int32_t>> reference_ids(const fs::path& model, const std::string& out_name) {
  const Fixture& f = fixture();
  REQUIRE(reference::run(kScript + " encode " + model.string() + " " + f.dir.file("docs.json") + " " + f.dir.file(out_name)) == 0);
  return reference::read_ids(f.dir / out_name);
}

std::vector<std::vector<int32_t>> encode_all(const tok::Tokenizer& t, double* mb_s) {
  const Fixture& f = fixture();
  std::vector<std::vector<int32_t>> out;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& d : f.docs) out.push_back(t.encode(d));
  *mb_s = corpus::total_bytes(f.docs) / 1e6 / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

// The Unigram pieces' scores (and which are <0xXX> byte pieces) of a tokenizer.json.
struct Scores {
  std::vector<double> score;
  std::vector<bool> byte;
};
Scores unigram_scores(const fs::path& tokenizer_json) {
  Scores s;
  const nlohmann::json j = nlohmann::json::parse(corpus::read(tokenizer_json));
  for (const auto& e : j["model"]["vocab"]) {
    s.score.push_back(e[1].get<double>());
    const std::string p = e[0].get<std::string>();
    s.byte.push_back(p.size() == 6 && p.rfind("<0x", 0) == 0);
  }
  return s;
}

// The total score of a segmentation's pieces (byte pieces stand for characters no piece
// covers, the same ones in every segmentation, and are left out).
double total_score(const std::vector<int32_t>& ids, const Scores& s) {
  double t = 0;
  for (int32_t id : ids)
    if (!s.byte.at(static_cast<size_t>(id))) t += s.score.at(static_cast<size_t>(id));
  return t;
}

// Our ids against SentencePiece's on every document, and decoding back to the text (exact:
// the trainer's settings normalize nothing and fall back to bytes). With `ties`, a document
// may differ only by a segmentation of SentencePiece's score (Unigram: our Viterbi, like
// Hugging Face's, adds in double, SentencePiece in float32, so between paths of equal score,
// e.g. a run of spaces as 1 + 12 + 12 + 1 or 1 + 1 + 12 + 12 spaces, they choose differently).
void check_against_sentencepiece(const tok::Tokenizer& t, const std::vector<std::vector<int32_t>>& ref, const std::string& what,
                                 const Scores* ties = nullptr) {
  const Fixture& f = fixture();
  double mb_s = 0;
  const auto ours = encode_all(t, &mb_s);
  std::string first;
  const size_t same = reference::compare(f.docs, ours, ref, t, first);
  size_t round_trips = 0, tokens = 0, equal_score = 0;
  for (size_t d = 0; d < f.docs.size(); ++d) {
    round_trips += t.decode(ours[d]) == f.docs[d];
    tokens += ours[d].size();
    if (ties && ours[d] != ref[d]) {
      const double a = total_score(ours[d], *ties), b = total_score(ref[d], *ties);
      CAPTURE(d);
      CAPTURE(a);
      CAPTURE(b);
      // SentencePiece sums a whole document's path in float32 (its resolution at a total of
      // -5e5 is 0.03), so it cannot tell apart paths closer than a few float32 ulps of the
      // total: equal within 1e-6 relative (~16 ulps) is a tie to it.
      const bool tie = std::abs(a - b) <= 1e-6 * std::abs(b);
      CHECK(tie);
      equal_score += tie;
    }
  }
  MESSAGE(what << ": " << f.docs.size() << " documents, " << corpus::total_bytes(f.docs) / 1e6 << " MB, " << tokens << " tokens: "
          << same << " identical to python3-sentencepiece" << (ties ? ", the others " + std::to_string(equal_score) + " an equal-score segmentation" : "")
          << ", " << round_trips << " decode to their text; ours " << mb_s << " MB/s");
  if (!ties) CHECK_MESSAGE(same == f.docs.size(), first);
  else CHECK(same + equal_score == f.docs.size());
  CHECK(round_trips == f.docs.size());
}

}  // namespace

TEST_CASE("runner data tokenizer train writes a tokenizer.model and config that load_tokenizer reads") {
  const Fixture& f = fixture();
  for (const char* kind : {"bpe", "unigram"}) {
    CAPTURE(kind);
    const int k = std::string(kind) == "bpe" ? 0 : 1;
    CHECK(f.train_log[k].find("training a SentencePiece " + std::string(kind) + " tokenizer, vocabulary 2000") != std::string::npos);
    CHECK(f.train_log[k].find("trained in ") != std::string::npos);
    const auto t = tok::load_tokenizer(f.dir.file(kind));
    CHECK(t->info().kind == "sentencepiece");
    CHECK(t->info().vocab_size == 2000);
    CHECK(t->eos_id() == 2);
    CHECK(t->bos_id() == 1);
    const auto cfg = nlohmann::json::parse(corpus::read(f.dir / kind / "tokenizer_config.json"));
    CHECK(cfg["eos_token"] == "</s>");
    CHECK(f.train_log[k].find(t->info().hash) != std::string::npos);
  }
}

TEST_CASE("a SentencePiece BPE .model gives python3-sentencepiece's ids on the sample, and decodes back") {
  const Fixture& f = fixture();
  const auto t = tok::load_tokenizer(f.dir.file("bpe/tokenizer.model"));
  check_against_sentencepiece(*t, reference_ids(f.dir / "bpe" / "tokenizer.model", "bpe_ref.txt"), "SentencePiece BPE .model");
}

TEST_CASE("a SentencePiece Unigram .model gives python3-sentencepiece's ids on the sample, and decodes back") {
  const Fixture& f = fixture();
  const auto t = tok::load_tokenizer(f.dir.file("unigram"));
  check_against_sentencepiece(*t, reference_ids(f.dir / "unigram" / "tokenizer.model", "unigram_ref.txt"), "SentencePiece Unigram .model");
}

TEST_CASE("the models as Hugging Face tokenizer.json (BPE with byte fallback, Unigram) give SentencePiece's ids") {
  const Fixture& f = fixture();
  for (const char* kind : {"bpe", "unigram"}) {
    CAPTURE(kind);
    const fs::path model = f.dir / kind / "tokenizer.model", hf = f.dir / (std::string(kind) + "_hf");
    fs::create_directories(hf);
    REQUIRE(reference::run(kScript + " hf-json " + model.string() + " " + kind + " " + (hf / "tokenizer.json").string()) == 0);
    const auto t = tok::load_tokenizer(hf.string());
    CHECK(t->info().kind == (std::string(kind) == "bpe" ? "bpe" : "unigram"));
    CHECK(t->info().vocab_size == 2000);
    CHECK(t->eos_id() == 2);
    CHECK(t->bos_id() == 1);
    const Scores scores = std::string(kind) == "unigram" ? unigram_scores(hf / "tokenizer.json") : Scores{};
    check_against_sentencepiece(*t, reference_ids(model, std::string(kind) + "_ref.txt"), std::string("tokenizer.json ") + kind,
                                std::string(kind) == "unigram" ? &scores : nullptr);
    // Saved and loaded back elsewhere: the same file, hash and ids.
    t->save((f.dir / (std::string(kind) + "_saved")).string());
    const auto back = tok::load_tokenizer((f.dir / (std::string(kind) + "_saved")).string());
    CHECK(back->info().hash == t->info().hash);
    CHECK(back->encode(f.docs[5]) == t->encode(f.docs[5]));
    // The special-token strings are the special tokens, as in Hugging Face.
    const auto ids = t->encode("</s>");
    CHECK(ids == std::vector<int32_t>{2});
  }
}

TEST_CASE("a .model saves and loads back with the same hash; encode and info on the command line") {
  const Fixture& f = fixture();
  const auto t = tok::load_tokenizer(f.dir.file("bpe"));
  t->save(f.dir.file("bpe_copy"));
  const auto back = tok::load_tokenizer(f.dir.file("bpe_copy"));
  CHECK(back->info().hash == t->info().hash);
  std::ofstream(f.dir / "small.txt", std::ios::binary) << f.docs[1];
  const auto r = test_support::runner_split("data tokenizer encode " + f.dir.file("small.txt") + " --tokenizer " + f.dir.file("bpe"), f.dir.path);
  REQUIRE(r.code == 0);
  std::string want;
  for (int32_t id : t->encode(f.docs[1])) want += (want.empty() ? "" : " ") + std::to_string(id);
  CHECK(r.out == want + "\n");
  CHECK(r.err.find("MB/s") != std::string::npos);
  const auto info = test_support::runner_cmd("data tokenizer info " + f.dir.file("bpe"));
  CHECK(info.code == 0);
  CHECK(info.out.find("hash " + t->info().hash) != std::string::npos);
  CHECK(info.out.find("eos 2\n") != std::string::npos);
}

TEST_CASE("encode is thread-safe for .model and tokenizer.json SentencePiece tokenizers") {
  const Fixture& f = fixture();
  const fs::path hf = f.dir / "unigram_thread_hf";
  fs::create_directories(hf);
  REQUIRE(reference::run(kScript + " hf-json " + f.dir.file("unigram/tokenizer.model") + " unigram " + (hf / "tokenizer.json").string()) == 0);
  for (const std::string path : {f.dir.file("bpe"), hf.string()}) {
    CAPTURE(path);
    const auto t = tok::load_tokenizer(path);
    const size_t n = 48;
    std::vector<std::vector<int32_t>> want(n), got(n);
    for (size_t d = 0; d < n; ++d) want[d] = t->encode(f.docs[d]);
    std::vector<std::thread> threads;
    for (size_t k = 0; k < 4; ++k)
      threads.emplace_back([&, k] {
        for (size_t d = k; d < n; d += 4) got[d] = t->encode(f.docs[d]);
      });
    for (auto& th : threads) th.join();
    CHECK(got == want);
  }
}

TEST_CASE("the trainer's user errors exit 2 naming what is wrong, before writing anything") {
  test_support::TempDir dir("test_tokenizer_sp");
  auto r = test_support::runner_cmd("data tokenizer train " + dir.file("missing.txt") + " --vocab 500 --out " + dir.file("out"));
  CHECK(r.code == 2);
  CHECK(r.out.find(dir.file("missing.txt")) != std::string::npos);
  CHECK(!fs::exists(dir / "out"));
  std::ofstream(dir / "tiny.txt") << "a b c\n";
  r = test_support::runner_cmd("data tokenizer train " + dir.file("tiny.txt") + " --vocab 100 --out " + dir.file("out"));
  CHECK(r.code == 2);
  CHECK(r.out.find("--vocab 100 is too small") != std::string::npos);
  r = test_support::runner_cmd("data tokenizer train " + dir.file("tiny.txt") + " --vocab 500 --model wordpiece --out " + dir.file("out"));
  CHECK(r.code == 2);
  CHECK(r.out.find("use --model bpe or --model unigram") != std::string::npos);
  CHECK(!fs::exists(dir / "out"));
}

namespace {

// Hugging Face's tokenizers.js (npm @huggingface/tokenizers; scripts/setup.sh unpacks it).
fs::path hf_tokenizers_js() {
  const fs::path d = reference::cache_dir() / "hf-tokenizers";
  if (!fs::exists(d / "dist" / "tokenizers.cjs")) FAIL("tokenizers.js (" << d.string() << ") is missing: run scripts/setup.sh");
  return d;
}

}  // namespace

TEST_CASE("the trainer writes a tokenizer.json that Hugging Face's tokenizers.js encodes to SentencePiece's ids") {
  const Fixture& f = fixture();
  const fs::path lib = hf_tokenizers_js();
  std::vector<std::string> docs;  // every third document, about 1 MB (tokenizers.js is plain JavaScript)
  for (size_t d = 0; d < f.docs.size(); d += 3) docs.push_back(f.docs[d]);
  reference::write_docs(f.dir / "hf_docs.json", docs);
  // BPE (the trainer's default) through Hugging Face's implementation. tokenizers.js's Unigram
  // has no byte fallback (an unknown character becomes <unk> there, <0xXX> in SentencePiece and
  // in Hugging Face's Rust tokenizers), so the Unigram file is checked through runner's reader.
  const fs::path dir = f.dir / "bpe";
  REQUIRE(fs::exists(dir / "tokenizer.json"));
  const std::string out = f.dir.file("bpe_hfjs.txt"), ref_out = f.dir.file("bpe_hfref.txt");
  REQUIRE(reference::run("node " + std::string(RUNNER_TEST_DIR) + "/tokenizer/hf_reference.cjs " + lib.string() + " " +
                         dir.string() + " " + f.dir.file("hf_docs.json") + " " + out) == 0);
  REQUIRE(reference::run(kScript + " encode " + (dir / "tokenizer.model").string() + " " + f.dir.file("hf_docs.json") + " " + ref_out) == 0);
  const auto hf = reference::read_ids(out), ref = reference::read_ids(ref_out);
  const auto t = tok::load_tokenizer(dir.string());  // the folder still loads as the .model
  CHECK(t->info().kind == "sentencepiece");
  std::string first;
  const size_t same = reference::compare(docs, hf, ref, *t, first);
  MESSAGE("tokenizers.js gives SentencePiece's ids on " << same << " of " << docs.size() << " documents");
  CHECK_MESSAGE(same == docs.size(), first);
  // Both written files through runner's own reader: SentencePiece's ids on the whole sample.
  for (const char* kind : {"bpe", "unigram"}) {
    CAPTURE(kind);
    const fs::path json = f.dir / kind / "tokenizer.json";
    const auto ours = tok::load_tokenizer(json.string());
    const Scores scores = std::string(kind) == "unigram" ? unigram_scores(json) : Scores{};
    check_against_sentencepiece(*ours, reference_ids(f.dir / kind / "tokenizer.model", std::string(kind) + "_ref.txt"),
                                std::string("written tokenizer.json ") + kind, std::string(kind) == "unigram" ? &scores : nullptr);
  }
}

TEST_CASE("the same corpus trained into two folders gives the same tokenizer and hash; the model holds no path") {
  const Fixture& f = fixture();
  test_support::TempDir dir("test_tokenizer_sp");
  std::ofstream(dir / "small.txt", std::ios::binary) << f.docs[0] << "\n" << f.docs[1] << "\n" << f.docs[2];
  std::string hash[2];
  const std::string outs[2] = {dir.file("one/tok"), dir.file("two/deeper/tok")};
  for (int k = 0; k < 2; ++k) {
    const auto r = test_support::runner_cmd("data tokenizer train " + dir.file("small.txt") + " --vocab 400 --threads " +
                                            std::to_string(k + 1) + " --out " + outs[k]);
    REQUIRE_MESSAGE(r.code == 0, r.out);
    hash[k] = tok::load_tokenizer(outs[k])->info().hash;
    const std::string bytes = corpus::read(fs::path(outs[k]) / "tokenizer.model");
    CHECK(bytes.find(dir.path.string()) == std::string::npos);
  }
  CHECK(hash[0] == hash[1]);
}

TEST_CASE("tokenizer train on JSONL learns the text field; long lines are reported in one line and SentencePiece's log stays quiet") {
  const Fixture& f = fixture();
  test_support::TempDir dir("test_tokenizer_sp");
  {
    std::ofstream j(dir / "c.jsonl", std::ios::binary);
    for (size_t d = 0; d < 12; ++d) j << nlohmann::json{{"id", d}, {"text", f.docs[d]}}.dump() << "\n";
    j << nlohmann::json{{"text", std::string(20000, 'x')}}.dump() << "\n";  // line 13: past the trainer's bound
    j << "{\"body\": \"no text field\"}\n";                                 // line 14
  }
  const auto r = test_support::runner_cmd("data tokenizer train " + dir.file("c.jsonl") + " --vocab 600 --out " + dir.file("tok"));
  REQUIRE_MESSAGE(r.code == 0, r.out);
  CHECK(r.out.find("leaves out 1 line(s) longer than 16384 bytes from training (the first at " + dir.file("c.jsonl") + ":13)") != std::string::npos);
  CHECK(r.out.find("skipped 1 JSONL record(s) without a string field 'text' (the first at " + dir.file("c.jsonl") + ":14)") != std::string::npos);
  CHECK(std::count(r.out.begin(), r.out.end(), '\n') < 8);  // SentencePiece's own log printed a line per step
  const auto t = tok::load_tokenizer(dir.file("tok"));
  for (int32_t id = 0; id < t->info().vocab_size; ++id) {
    const int32_t one[1] = {id};
    const std::string piece = t->decode(one);
    CHECK_MESSAGE(piece.find("\"text") == std::string::npos, piece);  // learned from the JSON quoting
    CHECK_MESSAGE(piece.find("\\n") == std::string::npos, piece);
  }
  CHECK(!fs::exists(dir / "tok" / "tokenizer.vocab"));
  for (const auto& e : fs::directory_iterator(dir / "tok")) CHECK(e.path().filename().string()[0] != '.');
}

TEST_CASE("a truncated tokenizer.model is refused as damaged, naming the file") {
  const Fixture& f = fixture();
  const std::string bytes = corpus::read(f.dir / "bpe" / "tokenizer.model");
  test_support::TempDir dir("test_tokenizer_sp");
  std::ofstream(dir / "tokenizer.model", std::ios::binary) << bytes.substr(0, bytes.size() / 2);
  try {
    tok::load_tokenizer(dir.file("tokenizer.model"));
    FAIL("a truncated model loaded");
  } catch (const UserError& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(what.find(dir.file("tokenizer.model")) != std::string::npos);
    CHECK(what.find("this file is damaged") != std::string::npos);
    CHECK(what.find("ParseFromArray") == std::string::npos);
  }
}

TEST_CASE("data prepare cuts a long file into pieces without changing its SentencePiece ids, on 1 and 2 threads") {
  const Fixture& f = fixture();
  test_support::TempDir dir("test_tokenizer_sp");
  std::string text;
  for (size_t d = 0; text.size() < 2500000 && d < f.docs.size(); ++d) text += f.docs[d] + "\n";
  std::ofstream(dir / "long.txt", std::ios::binary) << text;
  const auto t = tok::load_tokenizer(f.dir.file("bpe"));
  std::vector<int32_t> want = t->encode(text);
  want.push_back(*t->eos_id());
  for (int threads : {1, 2}) {
    CAPTURE(threads);
    PrepareOptions o;
    o.inputs = {dir.file("long.txt")};
    o.out = dir.file("out" + std::to_string(threads));
    o.tokenizer = f.dir.file("bpe");
    o.val_fraction = 0;
    o.threads = threads;
    o.progress = nullptr;
    prepare_dataset(o);
    const std::vector<int32_t> got = test_support::token_stream(o.out, Split::Train, t->info().vocab_size);
    REQUIRE(got.size() == want.size());
    CHECK(got == want);
  }
}
