// The pre-tokenizers' split patterns, matched by hand (no regex library: std::regex has no
// \p{L}/\p{N}), with the leftmost-first alternation and backtracking semantics of the
// regex engines the references use, so the pieces are exactly theirs.
//
//   gpt2:   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3: (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
//           ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2:  llama3 with \p{N} (one digit) in place of \p{N}{1,3}
// Every byte of the text lies in exactly one piece (the patterns cover every character).
#pragma once
#include <optional>
#include <string_view>
#include <vector>

namespace runner::tok {

enum class SplitPattern { gpt2, llama3, qwen2 };

// The pattern a tokenizer.json Split (or ByteLevel use_regex) names; nullopt when it is not
// one of the three.
std::optional<SplitPattern> recognise_pattern(std::string_view regex);
const char* pattern_name(SplitPattern p);

// Appends the pieces of `text` to `out`, in order.
void split_pieces(SplitPattern p, std::string_view text, std::vector<std::string_view>& out);

}  // namespace runner::tok
