// libFuzzer target: a SentencePiece .model on arbitrary bytes (scripts/fuzz.sh runs it). Our
// side of the reader (the wire-format walker, the checks, segmented encoding) must load and
// encode a fixed text with ids inside the vocabulary, or refuse the bytes with a UserError.
// libsentencepiece itself is not instrumented; fuzz.sh counts a crash whose top frame is
// inside it apart, as it does for libhdf5.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "runner/errors.h"
#include "runner/tokenize/sentencepiece.h"
#include "runner/tokenize/sentencepiece_proto.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  (void)runner::tok::read_sp_model(bytes);
  (void)runner::tok::sp_without_training_paths(bytes);
  try {
    const auto t = runner::tok::load_sentencepiece("fuzz/tokenizer.model", bytes, "fuzz");
    std::string text;
    for (int i = 0; i < 300; ++i) text += i % 7 ? "word " : "a\nb  ";
    const auto ids = t->encode(text);
    const int64_t vocab = t->info().vocab_size;
    for (int32_t id : ids)
      if (id < 0 || id >= vocab) {
        std::fprintf(stderr, "fuzz_sentencepiece: id %d outside the vocabulary of %lld\n", id, static_cast<long long>(vocab));
        std::abort();
      }
    (void)t->decode(ids);
  } catch (const runner::UserError&) {
    // the expected refusal
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_sentencepiece: not a UserError: %s\n", e.what());
    std::abort();
  }
  return 0;
}
