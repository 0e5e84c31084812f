// libFuzzer target: a Hugging Face tokenizer.json on arbitrary bytes (scripts/fuzz.sh runs it).
// A tokenizer file is untrusted input: every byte string must either load, encode and decode
// a fixed text with ids inside the vocabulary, or be refused with a UserError. Any other
// exception, an id outside the vocabulary, a crash, a sanitizer report or a timeout is a bug
// in our code.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runner/errors.h"
#include "runner/tokenize/stages.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    runner::tok::Pipeline p = runner::tok::parse_tokenizer_json("fuzz/tokenizer.json", text);
    runner::tok::choose_special_ids(p, "");
    runner::tok::SourceFiles src;
    src.files.emplace_back("tokenizer.json", text);
    const auto t = runner::tok::make_pipeline_tokenizer(std::move(p), "fuzz", std::move(src));
    const auto ids = t->encode(" Hello, world!\n\tcaf\xC3\xA9 123 <|endoftext|></s> \xE2\x96\x81x");
    const int64_t vocab = t->info().vocab_size;
    for (int32_t id : ids)
      if (id < 0 || id >= vocab) {
        std::fprintf(stderr, "fuzz_tokenizer_json: id %d outside the vocabulary of %lld\n", id, static_cast<long long>(vocab));
        std::abort();
      }
    (void)t->decode(ids);
  } catch (const runner::UserError&) {
    // the expected refusal
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_tokenizer_json: not a UserError: %s\n", e.what());
    std::abort();
  }
  return 0;
}
