// The split patterns as small matchers: at each position the alternatives are tried in the
// pattern's order and the first that matches wins, with the lengths the regex engine's
// backtracking would give (see the comments at the whitespace alternatives).
#include "runner/tokenize/split.h"

#include "runner/tokenize/unicode.h"

namespace runner::tok {

namespace {

using unicode::Class;

constexpr std::string_view kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

struct Cursor {
  std::string_view s;
  Class cls(size_t i) const { return unicode::classify(unicode::decode(s, i).cp); }
  size_t next(size_t i) const { return i + static_cast<size_t>(unicode::decode(s, i).len); }
  // The end of the run of class `c` starting at i.
  size_t run(size_t i, Class c) const {
    while (i < s.size() && cls(i) == c) i = next(i);
    return i;
  }
};

// A contraction after the apostrophe at i: its end, or 0. `fold`: case-insensitive, as
// llama3's (?i:...) (simple case folding also maps U+017F LATIN SMALL LETTER LONG S to s).
size_t contraction(std::string_view s, size_t i, bool fold) {
  auto lower = [&](size_t k) -> int {
    if (k >= s.size()) return 0;
    const auto c = static_cast<unsigned char>(s[k]);
    if (fold && c == 0xC5 && k + 1 < s.size() && static_cast<unsigned char>(s[k + 1]) == 0xBF) return 's' | 0x100;
    return fold && c >= 'A' && c <= 'Z' ? c + 32 : c;
  };
  const int a = lower(i + 1);
  if (a == ('s' | 0x100)) return i + 3;
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  const int b = lower(i + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return 0;
}

// `\s+(?!\S)|\s+` on the whitespace run [i, j): the whole run at the end of the text;
// otherwise all but its last character (which then starts the next piece, e.g. " word"),
// and a single character when that is all the run has.
size_t whitespace_tail(const Cursor& c, size_t i, size_t j) {
  if (j == c.s.size()) return j;
  size_t last = i;
  for (size_t k = i; k < j; k = c.next(k)) last = k;
  return last > i ? last : j;
}

size_t match_gpt2(const Cursor& c, size_t i) {
  const std::string_view s = c.s;
  if (s[i] == '\'') {
    if (size_t e = contraction(s, i, false)) return e;
  }
  const size_t start = (s[i] == ' ' && i + 1 < s.size() && c.cls(i + 1) != unicode::kSpace) ? i + 1 : i;
  const Class k = c.cls(start);
  if (k != unicode::kSpace) return c.run(start, k);
  return whitespace_tail(c, i, c.run(i, unicode::kSpace));
}

bool newline(char ch) { return ch == '\r' || ch == '\n'; }

size_t match_llama(const Cursor& c, size_t i, int max_digits) {
  const std::string_view s = c.s;
  if (s[i] == '\'') {
    if (size_t e = contraction(s, i, true)) return e;
  }
  const Class k = c.cls(i);
  if (k == unicode::kLetter) return c.run(i, k);
  if (k != unicode::kNumber && !newline(s[i])) {  // [^\r\n\p{L}\p{N}]?\p{L}+
    const size_t j = c.next(i);
    if (j < s.size() && c.cls(j) == unicode::kLetter) return c.run(j, unicode::kLetter);
  }
  if (k == unicode::kNumber) {
    size_t j = i;
    for (int d = 0; d < max_digits && j < s.size() && c.cls(j) == unicode::kNumber; ++d) j = c.next(j);
    return j;
  }
  const size_t start = (s[i] == ' ' && i + 1 < s.size() && c.cls(i + 1) == unicode::kOther) ? i + 1 : i;
  if (c.cls(start) == unicode::kOther) {  // ` ?[^\s\p{L}\p{N}]+[\r\n]*`
    size_t j = c.run(start, unicode::kOther);
    while (j < s.size() && newline(s[j])) ++j;
    return j;
  }
  const size_t j = c.run(i, unicode::kSpace);
  // `\s*[\r\n]+`: the greedy \s* gives back characters until a newline follows, so the piece
  // ends just after the run's last newline.
  for (size_t e = j; e > i; --e) {
    if (newline(s[e - 1])) return e;
  }
  return whitespace_tail(c, i, j);
}

}  // namespace

std::optional<SplitPattern> recognise_pattern(std::string_view regex) {
  if (regex == kGpt2) return SplitPattern::gpt2;
  if (regex == kLlama3) return SplitPattern::llama3;
  if (regex == kQwen2) return SplitPattern::qwen2;
  return std::nullopt;
}

const char* pattern_name(SplitPattern p) {
  switch (p) {
    case SplitPattern::gpt2: return "gpt2";
    case SplitPattern::llama3: return "llama3";
    case SplitPattern::qwen2: return "qwen2";
  }
  return "?";
}

void split_pieces(SplitPattern p, std::string_view text, std::vector<std::string_view>& out) {
  const Cursor c{text};
  for (size_t i = 0; i < text.size();) {
    const size_t e = p == SplitPattern::gpt2 ? match_gpt2(c, i) : match_llama(c, i, p == SplitPattern::llama3 ? 3 : 1);
    out.push_back(text.substr(i, e - i));
    i = e;
  }
}

}  // namespace runner::tok
