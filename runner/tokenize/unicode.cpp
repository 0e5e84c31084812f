// Unicode classes for the split patterns: an ASCII table, then the White_Space list and a
// bisection of the generated L and N ranges (unicode_tables.cpp).
#include <algorithm>
#include <array>

#include "runner/tokenize/unicode.h"

namespace runner::tok::unicode {

namespace {

bool in_ranges(const CodeRange* r, size_t n, uint32_t cp) {
  const CodeRange* end = r + n;
  const CodeRange* it = std::upper_bound(r, end, cp, [](uint32_t v, const CodeRange& x) { return v < x.lo; });
  return it != r && (it - 1)->hi >= cp;
}

// Unicode's White_Space property (PropList.txt; unchanged since Unicode 6.3).
bool white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F ||
         cp == 0x3000;
}

std::array<Class, 256> latin1_table() {
  std::array<Class, 256> t{};
  for (uint32_t c = 0; c < 256; ++c) {
    t[c] = white_space(c) ? kSpace
           : in_ranges(kLetters, kLetters_size, c) ? kLetter
           : in_ranges(kNumbers, kNumbers_size, c) ? kNumber
                                                  : kOther;
  }
  return t;
}

}  // namespace

Class classify(uint32_t cp) {
  static const std::array<Class, 256> latin1 = latin1_table();
  if (cp < 256) return latin1[cp];
  if (white_space(cp)) return kSpace;
  if (in_ranges(kLetters, kLetters_size, cp)) return kLetter;
  if (in_ranges(kNumbers, kNumbers_size, cp)) return kNumber;
  return kOther;
}

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    const Decoded d = decode(s, i);
    if (d.len == 1 && static_cast<unsigned char>(s[i]) >= 0x80) return false;
    i += static_cast<size_t>(d.len);
  }
  return true;
}

}  // namespace runner::tok::unicode
