// Tests for runner/tokenize's byte-level BPE: GPT-2's ids against the reference run in the
// test (node + the npm package gpt-3-encoder, installed by scripts/setup.sh; a missing
// reference fails the test) on a multi-megabyte sample (tests/tokenizer/corpus.h), the split
// patterns against JavaScript's Unicode regex engine, the three file layouts giving the same
// ids and hash, decoding, thread safety, save/load, special tokens and every user error.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/tokenize/split.h"
#include "runner/tokenize/tokenizer.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"
#include "tests/tokenizer/corpus.h"
#include "tests/tokenizer/reference.h"

using namespace runner;
namespace fs = std::filesystem;

namespace {

const std::string kScripts = std::string(RUNNER_TEST_DIR) + "/tokenizer";

// The sample: ~1.8 MB of license texts and Python sources, ~0.6 MB generated (gpt-3-encoder
// needs ~10 s of CPU per MB: this keeps the test near 30 s on two busy cores).
const std::vector<std::string>& sample() {
  static const std::vector<std::string> docs = corpus::documents(1800000, 600000);
  return docs;
}

std::vector<std::vector<int32_t>> encode_all(const tok::Tokenizer& t, const std::vector<std::string>& docs, double* mb_s = nullptr) {
  std::vector<std::vector<int32_t>> out;
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& d : docs) out.push_back(t.encode(d));
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (mb_s) *mb_s = corpus::total_bytes(docs) / 1e6 / s;
  return out;
}

void write(const fs::path& p, const std::string& s) { std::ofstream(p, std::ios::binary) << s; }

// GPT-2's tokenizer.json, as Hugging Face writes it, from encoder.json and vocab.bpe.
nlohmann::json gpt2_tokenizer_json(const fs::path& ref) {
  nlohmann::json vocab = nlohmann::json::parse(corpus::read(ref / "encoder.json"));
  nlohmann::json merges = nlohmann::json::array();
  std::istringstream in(corpus::read(ref / "vocab.bpe"));
  std::string line;
  std::getline(in, line);  // #version
  while (std::getline(in, line))
    if (!line.empty()) merges.push_back(line);
  nlohmann::json j;
  j["version"] = "1.0";
  j["added_tokens"] = {{{"id", 50256}, {"content", "<|endoftext|>"}, {"single_word", false}, {"lstrip", false},
                        {"rstrip", false}, {"normalized", true}, {"special", true}}};
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
  j["post_processor"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}, {"use_regex", true}};
  j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  j["model"] = {{"type", "BPE"}, {"dropout", nullptr}, {"unk_token", nullptr}, {"continuing_subword_prefix", ""},
                {"end_of_word_suffix", ""}, {"fuse_unk", false}, {"byte_fallback", false}, {"vocab", vocab}, {"merges", merges}};
  return j;
}

}  // namespace

TEST_CASE("GPT-2 BPE gives gpt-3-encoder's ids on a multi-megabyte sample, and decoding gives the text back") {
  const fs::path ref = reference::gpt3_encoder();
  test_support::TempDir dir("test_tokenizer");
  const auto& docs = sample();
  reference::write_docs(dir / "docs.json", docs);
  const auto t0 = std::chrono::steady_clock::now();
  REQUIRE(reference::run("node " + kScripts + "/reference.js encode " + ref.string() + " " + dir.file("docs.json") + " " +
                         dir.file("ref.txt")) == 0);
  const double node_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const auto t = tok::load_tokenizer(ref.string());  // encoder.json + vocab.bpe
  CHECK(t->info().kind == "bpe-bytelevel");
  CHECK(t->info().vocab_size == 50257);
  CHECK(t->eos_id() == 50256);
  double mb_s = 0;
  const auto ours = encode_all(*t, docs, &mb_s);
  std::string first;
  const size_t same = reference::compare(docs, ours, reference::read_ids(dir / "ref.txt"), *t, first);
  size_t tokens = 0, round_trips = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    tokens += ours[d].size();
    round_trips += t->decode(ours[d]) == docs[d];
  }
  MESSAGE(docs.size() << " documents, " << corpus::total_bytes(docs) / 1e6 << " MB, " << tokens << " tokens: " << same
          << " identical to gpt-3-encoder; ours " << mb_s << " MB/s (node incl. start-up " << node_s << " s)");
  CHECK_MESSAGE(same == docs.size(), first);
  CHECK(round_trips == docs.size());
}

TEST_CASE("the split patterns cut the text where JavaScript's Unicode regex engine does") {
  reference::gpt3_encoder();  // node
  test_support::TempDir dir("test_tokenizer");
  const auto& docs = sample();
  reference::write_docs(dir / "docs.json", docs);
  for (auto [name, pattern] : {std::pair{"gpt2", tok::SplitPattern::gpt2}, std::pair{"llama3", tok::SplitPattern::llama3}}) {
    CAPTURE(name);
    REQUIRE(reference::run("node " + kScripts + "/reference.js split " + name + " " + dir.file("docs.json") + " " + dir.file("split.txt")) == 0);
    const auto ref = reference::read_ids(dir / "split.txt");
    REQUIRE(ref.size() == docs.size());
    size_t same = 0;
    std::string first;
    for (size_t d = 0; d < docs.size(); ++d) {
      std::vector<std::string_view> pieces;
      tok::split_pieces(pattern, docs[d], pieces);
      std::vector<int32_t> lens;
      for (auto p : pieces) lens.push_back(static_cast<int32_t>(p.size()));
      if (lens == ref[d]) { ++same; continue; }
      size_t k = 0, at = 0;
      while (k < lens.size() && k < ref[d].size() && lens[k] == ref[d][k]) at += lens[k++];
      if (first.empty()) first = "document " + std::to_string(d) + " piece " + std::to_string(k) + ": " + nlohmann::json(docs[d].substr(at, 24)).dump();
    }
    CHECK_MESSAGE(same == docs.size(), first);
  }
  // Llama 3's pattern on the cases its alternatives exist for.
  std::vector<std::string_view> p;
  tok::split_pieces(tok::SplitPattern::llama3, "I'M 12345 (word)\r\n\n  x  ", p);
  CHECK(p == std::vector<std::string_view>{"I", "'M", " ", "123", "45", " (", "word", ")\r\n\n", " ", " x", "  "});
}

TEST_CASE("vocab.json + merges.txt and GPT-2's tokenizer.json give the same ids and hash as encoder.json + vocab.bpe") {
  const fs::path ref = reference::gpt3_encoder();
  test_support::TempDir dir("test_tokenizer");
  fs::create_directories(dir / "pair");
  fs::copy_file(ref / "encoder.json", dir / "pair" / "vocab.json");
  fs::copy_file(ref / "vocab.bpe", dir / "pair" / "merges.txt");
  fs::create_directories(dir / "hf");
  write(dir / "hf" / "tokenizer.json", gpt2_tokenizer_json(ref).dump());
  const auto orig = tok::load_tokenizer((ref / "encoder.json").string());
  const auto pair = tok::load_tokenizer(dir.file("pair"));
  const auto hf = tok::load_tokenizer(dir.file("hf"));
  CHECK(pair->info().hash == orig->info().hash);
  CHECK(hf->info().hash == orig->info().hash);
  CHECK(hf->info().vocab_size == 50257);
  CHECK(hf->eos_id() == 50256);
  const std::vector<std::string> docs(sample().begin(), sample().begin() + 40);
  const auto a = encode_all(*orig, docs), b = encode_all(*pair, docs), c = encode_all(*hf, docs);
  CHECK(a == b);
  CHECK(a == c);
  // <|endoftext|> in the text is the special token (Hugging Face's added_tokens).
  const std::vector<int32_t> want = {15496, 50256, 995};
  CHECK(hf->encode("Hello<|endoftext|> world") == want);
  CHECK(pair->encode("Hello<|endoftext|> world") == want);
  CHECK(hf->decode(want) == "Hello<|endoftext|> world");
}

TEST_CASE("a Llama 3-style tokenizer.json (Split + ByteLevel, ignore_merges) loads, splits its way and round-trips") {
  const fs::path ref = reference::gpt3_encoder();
  test_support::TempDir dir("test_tokenizer");
  nlohmann::json j = gpt2_tokenizer_json(ref);
  j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", {
      {{"type", "Split"}, {"pattern", {{"Regex", R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
       {"behavior", "Isolated"}, {"invert", false}},
      {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}}}};
  j["model"]["ignore_merges"] = true;
  write(dir / "tokenizer.json", j.dump());
  const auto t = tok::load_tokenizer(dir.file("tokenizer.json"));
  const auto g = tok::load_tokenizer(ref.string());
  CHECK(t->info().hash != g->info().hash);
  // Digits in threes (GPT-2 keeps a run of digits whole), the apostrophe joins the letters.
  CHECK(t->decode(t->encode("12345")) == "12345");
  CHECK(t->encode("12345") == std::vector<int32_t>{g->encode("123")[0], g->encode("45")[0]});
  for (size_t d = 0; d < 40; ++d) CHECK(t->decode(t->encode(sample()[d])) == sample()[d]);
}

TEST_CASE("save() writes Hugging Face's layout that loads back with the same ids and hash, wherever it lies") {
  const fs::path ref = reference::gpt3_encoder();
  test_support::TempDir dir("test_tokenizer");
  const auto t = tok::load_tokenizer(ref.string());
  t->save(dir.file("saved"));
  CHECK(fs::exists(dir / "saved" / "vocab.json"));
  CHECK(fs::exists(dir / "saved" / "merges.txt"));
  const auto cfg = nlohmann::json::parse(corpus::read(dir / "saved" / "tokenizer_config.json"));
  CHECK(cfg["eos_token"] == "<|endoftext|>");
  CHECK(cfg["tokenizer_class"] == "GPT2Tokenizer");
  fs::copy(dir / "saved", dir / "moved");
  const auto back = tok::load_tokenizer(dir.file("moved"));
  CHECK(back->info().hash == t->info().hash);
  CHECK(back->eos_id() == t->eos_id());
  CHECK(back->encode(sample()[3]) == t->encode(sample()[3]));
  // tokenizer.json is saved as itself.
  fs::create_directories(dir / "hf");
  write(dir / "hf" / "tokenizer.json", gpt2_tokenizer_json(ref).dump());
  tok::load_tokenizer(dir.file("hf"))->save(dir.file("hf_saved"));
  CHECK(corpus::read(dir / "hf_saved" / "tokenizer.json") == corpus::read(dir / "hf" / "tokenizer.json"));
  CHECK(tok::load_tokenizer(dir.file("hf_saved"))->info().hash == t->info().hash);
  // The byte tokenizer too.
  tok::byte_tokenizer()->save(dir.file("byte"));
  CHECK(tok::load_tokenizer(dir.file("byte"))->info() == tok::byte_tokenizer()->info());
}

TEST_CASE("encode is thread-safe: documents encoded from several threads give the single-threaded ids") {
  const fs::path ref = reference::gpt3_encoder();
  const auto t = tok::load_tokenizer(ref.string());
  const std::vector<std::string> docs(sample().begin(), sample().begin() + 60);
  const auto want = encode_all(*t, docs);
  std::vector<std::vector<int32_t>> got(docs.size());
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k)
    threads.emplace_back([&, k] {
      for (size_t d = k; d < docs.size(); d += 4) got[d] = t->encode(docs[d]);
    });
  for (auto& th : threads) th.join();
  CHECK(got == want);
}

namespace {

void check_error(const std::string& path, const std::string& names, const std::string& says) {
  try {
    tok::load_tokenizer(path);
    FAIL("no error for " << path);
  } catch (const UserError& e) {
    const std::string what = e.what();
    CAPTURE(what);
    CHECK(std::string(e.what()).find(names) != std::string::npos);
    CHECK(std::string(e.what()).find(says) != std::string::npos);
  }
}

}  // namespace

TEST_CASE("a missing or broken tokenizer file is a UserError naming the file") {
  const fs::path ref = reference::gpt3_encoder();
  test_support::TempDir dir("test_tokenizer");
  check_error(dir.file("nowhere"), dir.file("nowhere"), "no such tokenizer");
  fs::create_directories(dir / "empty");
  check_error(dir.file("empty"), dir.file("empty"), "no tokenizer files");
  std::string j = gpt2_tokenizer_json(ref).dump(1);
  write(dir / "cut.json", j.substr(0, j.size() / 2));
  check_error(dir.file("cut.json"), dir.file("cut.json") + ":", "not valid JSON");
  fs::create_directories(dir / "lonely");
  fs::copy_file(ref / "encoder.json", dir / "lonely" / "vocab.json");
  check_error(dir.file("lonely"), "merges.txt", "needs its merges file");
  fs::create_directories(dir / "badmerge");
  fs::copy_file(ref / "encoder.json", dir / "badmerge" / "vocab.json");
  write(dir / "badmerge" / "merges.txt", "#version: 0.2\nĠ t\nthis is three\n");
  check_error(dir.file("badmerge"), dir.file("badmerge/merges.txt") + ":3:1", "two tokens");
  auto nfkc = gpt2_tokenizer_json(ref);
  nfkc["normalizer"] = {{"type", "NFKC"}};
  write(dir / "nfkc.json", nfkc.dump());
  check_error(dir.file("nfkc.json"), dir.file("nfkc.json"), "normalizer 'NFKC' is not supported");
  auto pat = gpt2_tokenizer_json(ref);
  pat["pre_tokenizer"] = {{"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}, {"invert", false}};
  write(dir / "pat.json", pat.dump());
  check_error(dir.file("pat.json"), dir.file("pat.json"), "Split pattern '\\w+' is not supported");
  write(dir / "broken.model", "not a protobuf at all");
  check_error(dir.file("broken.model"), dir.file("broken.model"), "this file is damaged");
}

namespace {

// A tiny SentencePiece-style BPE tokenizer.json with the given model options and stages.
std::unique_ptr<tok::Tokenizer> tiny(const fs::path& dir, const nlohmann::json& model_opts, const nlohmann::json& normalizer,
                                     const nlohmann::json& pre, const nlohmann::json& decoder) {
  nlohmann::json model = {{"type", "BPE"},
                          {"vocab", {{"<unk>", 0}, {"\u2581", 1}, {"a", 2}, {"b", 3}, {"c", 4}, {"ab", 5}, {"abc", 6},
                                     {"\u2581a", 7}, {"<0xC3>", 8}, {"<0xA9>", 9}}},
                          {"merges", {"a b", "\u2581 a"}}};
  if (model_opts.is_object()) model.update(model_opts);
  const nlohmann::json j = {{"model", model}, {"normalizer", normalizer}, {"pre_tokenizer", pre}, {"decoder", decoder}, {"added_tokens", nlohmann::json::array()}};
  write(dir / "tiny.json", j.dump());
  return tok::load_tokenizer((dir / "tiny.json").string());
}

}  // namespace

TEST_CASE("the SentencePiece-style stages: ignore_merges, byte fallback, fused unknowns, Metaspace, Strip, decoders") {
  test_support::TempDir dir("test_tokenizer");
  using V = std::vector<int32_t>;
  const nlohmann::json none;
  const nlohmann::json sp_decoder = {{"type", "Sequence"}, {"decoders", {{{"type", "ByteFallback"}}, {{"type", "Fuse"}},
                                     {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "always"}}}}};
  // Merges make "abc" ab + c; ignore_merges takes the word itself when it is in the vocabulary.
  CHECK(tiny(dir, {}, none, none, none)->encode("abc") == V{5, 4});
  CHECK(tiny(dir, {{"ignore_merges", true}}, none, none, none)->encode("abc") == V{6});
  // An unknown character: its UTF-8 bytes (byte_fallback), else one <unk> per run (fuse_unk) or per character.
  const auto bytes = tiny(dir, {{"byte_fallback", true}, {"unk_token", "<unk>"}}, none, none, sp_decoder);
  CHECK(bytes->encode("\u00e9") == V{8, 9});
  CHECK(bytes->decode(V{8, 9}) == "\u00e9");
  CHECK(bytes->decode(V{8}) == "\ufffd");  // half a character decodes to U+FFFD
  CHECK(tiny(dir, {{"unk_token", "<unk>"}, {"fuse_unk", true}}, none, none, none)->encode("xyzab") == V{0, 5});
  CHECK(tiny(dir, {{"unk_token", "<unk>"}}, none, none, none)->encode("xyzab") == V{0, 0, 0, 5});
  // Metaspace: spaces become ▁, each ▁ starts a word; the prefix per prepend_scheme.
  auto meta = [&](const char* scheme) {
    return tiny(dir, {}, none, {{"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", scheme}, {"split", true}}, sp_decoder);
  };
  CHECK(meta("first")->encode("a b") == V{7, 1, 3});
  CHECK(meta("never")->encode("a b") == V{2, 1, 3});
  CHECK(meta("first")->decode(V{7, 1, 3}) == "a b");
  // Strip (both sides) then Prepend and Replace, as Llama 2's normalizer.
  const nlohmann::json norm = {{"type", "Sequence"}, {"normalizers", {{{"type", "Strip"}, {"strip_left", true}, {"strip_right", true}},
                               {{"type", "Prepend"}, {"prepend", "\u2581"}}, {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}}};
  CHECK(tiny(dir, {}, norm, none, none)->encode("\t a b \n") == V{7, 1, 3});
  // Qwen2's split: digits one by one.
  std::vector<std::string_view> p;
  tok::split_pieces(tok::SplitPattern::qwen2, "x 123", p);
  CHECK(p == std::vector<std::string_view>{"x", " ", "1", "2", "3"});
}

TEST_CASE("tokenizer.json ids are checked at load: outside the vocabulary, past int32 or far past the entries, each named with the file") {
  test_support::TempDir dir("test_tokenizer");
  const nlohmann::json base = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"ab", 2}, {"<|endoftext|>", 3}}}, {"merges", {"a b"}}}},
                               {"added_tokens", nlohmann::json::array()}};
  auto with_added = [&](const nlohmann::json& id) {
    nlohmann::json j = base;
    j["added_tokens"] = {{{"id", id}, {"content", "<|x|>"}, {"special", true}}};
    return j;
  };
  // Each of these loaded before (and -7 or 2^31-1 then aborted data prepare; 2^40 became id 0).
  const std::vector<std::pair<nlohmann::json, std::string>> cases = {
      {with_added(-7), "has the id -7"},
      {with_added(2147483647LL), "has the id 2147483647"},
      {with_added(int64_t{1} << 40), "has the id 1099511627776"},
      {with_added(1.5), "has the id 1.5"},
  };
  for (size_t k = 0; k < cases.size(); ++k) {
    const fs::path f = dir / ("added" + std::to_string(k) + ".json");
    write(f, cases[k].first.dump());
    check_error(f.string(), f.string(), cases[k].second);
  }
  // A 4 KB file naming one id at 2^26 is refused at once (it took 22 s and 2.6 GB).
  nlohmann::json far = base;
  far["model"]["vocab"]["z"] = int64_t{1} << 26;
  write(dir / "far.json", far.dump());
  check_error(dir.file("far.json"), dir.file("far.json"), "model.vocab['z'] has the id 67108864, outside [0, 1029)");
  nlohmann::json neg = base;
  neg["model"]["vocab"]["z"] = -1;
  write(dir / "neg.json", neg.dump());
  check_error(dir.file("neg.json"), dir.file("neg.json"), "has the id -1");
  nlohmann::json merge = base;
  merge["model"]["merges"] = {"a zz"};
  write(dir / "merge.json", merge.dump());
  check_error(dir.file("merge.json"), dir.file("merge.json"), "zz");
  const nlohmann::json empty_unigram = {{"model", {{"type", "Unigram"}, {"unk_id", nullptr}, {"vocab", nlohmann::json::array()}}}};
  write(dir / "unigram.json", empty_unigram.dump());
  check_error(dir.file("unigram.json"), dir.file("unigram.json"), "vocabulary is empty");
  const nlohmann::json bad_unk = {{"model", {{"type", "Unigram"}, {"unk_id", 5}, {"vocab", nlohmann::json::array({nlohmann::json::array({"a", -1.0})})}}}};
  write(dir / "unk.json", bad_unk.dump());
  check_error(dir.file("unk.json"), dir.file("unk.json"), "model.unk_id is 5");
  // GPT-2's vocab.json: the same bound.
  fs::create_directories(dir / "gpt2");
  write(dir / "gpt2" / "vocab.json", R"({"a": 0, "b": 67108864})");
  write(dir / "gpt2" / "merges.txt", "#version: 0.2\n");
  check_error(dir.file("gpt2"), dir.file("gpt2/vocab.json"), "has the id 67108864");
  // Within the bounds it loads, with added tokens past the model's entries (as Llama 3's).
  write(dir / "ok.json", with_added(4).dump());
  CHECK(tok::load_tokenizer(dir.file("ok.json"))->info().vocab_size == 5);
}

TEST_CASE("special-token text: the special id by default, ordinary text with special_as_text, counted either way") {
  const fs::path ref = reference::gpt3_encoder();
  const auto t = tok::load_tokenizer((ref / "encoder.json").string());
  const std::string text = "one<|endoftext|>two <|endoftext|>";
  std::vector<int32_t> as_special, as_text;
  CHECK(t->encode_part(text, tok::EncodeOptions{}, as_special) == 2);
  CHECK(std::count(as_special.begin(), as_special.end(), 50256) == 2);
  tok::EncodeOptions o;
  o.special_as_text = true;
  CHECK(t->encode_part(text, o, as_text) == 2);
  CHECK(std::count(as_text.begin(), as_text.end(), 50256) == 0);
  CHECK(t->decode(as_text) == text);
  CHECK(as_text.size() > as_special.size());
}

TEST_CASE("a SentencePiece-style BPE with whitespace-only pieces encodes a text that starts with one character and a space") {
  test_support::TempDir dir("test_tokenizer");
  // "▁▁" is a piece, so long words are cut only before a ▁ that follows another character;
  // one at byte 1 used to read before the word's start.
  const nlohmann::json j = {{"model", {{"type", "BPE"}, {"vocab", {{"a", 0}, {"b", 1}, {"\u2581", 2}, {"\u2581\u2581", 3}, {"\u2581b", 4}}},
                                       {"merges", {"\u2581 \u2581", "\u2581 b"}}}},
                            {"normalizer", {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "\u2581"}}}};
  write(dir / "ws.json", j.dump());
  const auto t = tok::load_tokenizer(dir.file("ws.json"));
  CHECK(t->encode("a b") == std::vector<int32_t>{0, 4});
  CHECK(t->encode("a  b") == std::vector<int32_t>{0, 3, 1});
}
