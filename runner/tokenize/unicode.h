// The few Unicode facts the tokenizers need: UTF-8 decoding, and the classes the GPT-2 and
// Llama 3 split patterns use (\p{L}, \p{N}, \s), without a regex library.
//
// The L and N ranges are generated from Python's unicodedata (gen_unicode_tables.py) and
// searched by bisection below an ASCII table; \s is Unicode's White_Space property, as in
// Python's `regex` and the Oniguruma engine Hugging Face tokenizers use.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace runner::tok::unicode {

struct CodeRange {
  uint32_t lo, hi;  // inclusive
};
extern const CodeRange kLetters[];
extern const size_t kLetters_size;
extern const CodeRange kNumbers[];
extern const size_t kNumbers_size;

enum Class : uint8_t { kOther = 0, kLetter = 1, kNumber = 2, kSpace = 3 };

// The code point starting at s[i] and its length in bytes; an invalid byte decodes as itself
// (a code point in 0x80..0xFF that is none of L, N, \s), length 1, so every byte is covered.
struct Decoded {
  uint32_t cp;
  int len;
};
inline Decoded decode(std::string_view s, size_t i) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) return {b0, 1};
  auto cont = [&](size_t k) { return k < s.size() && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80; };
  auto at = [&](size_t k) { return static_cast<uint32_t>(static_cast<unsigned char>(s[k]) & 0x3F); };
  if (b0 >= 0xC2 && b0 < 0xE0 && cont(i + 1)) return {((b0 & 0x1Fu) << 6) | at(i + 1), 2};
  if (b0 >= 0xE0 && b0 < 0xF0 && cont(i + 1) && cont(i + 2)) {
    const uint32_t cp = ((b0 & 0x0Fu) << 12) | (at(i + 1) << 6) | at(i + 2);
    if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) return {cp, 3};
  }
  if (b0 >= 0xF0 && b0 < 0xF5 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
    const uint32_t cp = ((b0 & 0x07u) << 18) | (at(i + 1) << 12) | (at(i + 2) << 6) | at(i + 3);
    if (cp >= 0x10000 && cp <= 0x10FFFF) return {cp, 4};
  }
  return {b0, 1};
}

Class classify(uint32_t cp);
inline bool is_space(uint32_t cp) { return classify(cp) == kSpace; }

void append_utf8(std::string& out, uint32_t cp);
bool valid_utf8(std::string_view s);

}  // namespace runner::tok::unicode
