// The tokenizer tests' text sample, built the same way on every Debian machine with the
// project's packages: the license texts under /usr/share/common-licenses, the Python
// standard library's sources (/usr/lib/python3.*/), and generated text in many scripts
// (Latin, Greek, Cyrillic, Arabic, Hebrew, Devanagari, Thai, CJK, Hangul, kana), emoji with
// ZWJ sequences and modifiers, digits of several scripts, fractions and numerals, whitespace
// runs (tabs, CRLF, no-break and ideographic spaces) and apostrophe contractions.
//
// Left out, and why: U+0085 and U+FEFF (JavaScript's \s disagrees with Unicode's White_Space
// on them, so gpt-3-encoder's regex splits them unlike GPT-2's), invalid UTF-8 (the
// references read text, not bytes), and the special-token strings (<|endoftext|>, <s>, </s>,
// <unk>), which Hugging Face-style tokenizers match as special tokens and the references do
// not.
#pragma once
#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "runner/tokenize/unicode.h"

namespace corpus {

inline std::string read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void erase_all(std::string& s, const std::string& what) {
  for (size_t i; (i = s.find(what)) != std::string::npos;) s.erase(i, what.size());
}

inline bool clean(std::string& s) {
  if (!runner::tok::unicode::valid_utf8(s)) return false;
  for (const char* bad : {"\xC2\x85", "\xEF\xBB\xBF", "<|endoftext|>", "</s>", "<s>", "<unk>"}) erase_all(s, bad);
  return !s.empty();
}

// Sorted regular files of `dir` matching `ext` ("" for all).
inline std::vector<std::filesystem::path> files(const std::filesystem::path& dir, const std::string& ext) {
  std::vector<std::filesystem::path> out;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_regular_file() && !e.is_symlink() && (ext.empty() || e.path().extension() == ext)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

inline std::filesystem::path python_lib() {
  std::vector<std::filesystem::path> dirs;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/usr/lib", ec)) {
    const std::string n = e.path().filename().string();
    if (n.rfind("python3.", 0) == 0 && std::filesystem::exists(e.path() / "os.py")) dirs.push_back(e.path());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs.empty() ? std::filesystem::path() : dirs.back();
}

struct Rng {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
  uint32_t below(uint32_t n) { return next() % n; }
};

// One generated document: words drawn from ranges of many scripts, separated by varied
// whitespace and punctuation.
inline std::string generated_document(Rng& r, size_t bytes) {
  struct Script { uint32_t lo, hi; };
  static const Script scripts[] = {
      {'a', 'z'}, {'A', 'Z'}, {0xE0, 0xFF}, {0x3B1, 0x3C9}, {0x410, 0x44F}, {0x5D0, 0x5EA}, {0x627, 0x64A},
      {0x905, 0x939}, {0xE01, 0xE2E}, {0x4E00, 0x4FFF}, {0xAC00, 0xAFFF}, {0x3041, 0x3093}, {0x30A1, 0x30F6},
      {0x1F600, 0x1F64F}, {0x1F300, 0x1F3FF}, {'0', '9'}, {0x660, 0x669}, {0x966, 0x96F}, {0xFF10, 0xFF19},
      {0x2160, 0x216B}, {0xBC, 0xBE}, {0x2070, 0x2079}, {0x2200, 0x22FF}, {'!', '/'}, {0x300, 0x36F}};
  static const char* spaces[] = {" ", " ", " ", " ", "  ", "\t", "\n", "\r\n", "\n\n", "   ", " \n", "\xC2\xA0",
                                 "\xE3\x80\x80", "\xE2\x80\x83", "\t\t", "\n    ", "\r\n\r\n", " \t "};
  static const char* extras[] = {"'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL", "n't", ".", ",", "!", "?",
                                 "...", "\xF0\x9F\x91\xA9\xE2\x80\x8D\xF0\x9F\x92\xBB", "\xF0\x9F\x91\x8D\xF0\x9F\x8F\xBD",
                                 "\xE2\x80\x94", "\xC2\xAB", "\xC2\xBB", "(", ")", "\"", "#", "12345", "3.14159", "1,000,000"};
  std::string out;
  while (out.size() < bytes) {
    const Script& sc = scripts[r.below(sizeof scripts / sizeof scripts[0])];
    const uint32_t len = 1 + r.below(9);
    for (uint32_t k = 0; k < len; ++k) runner::tok::unicode::append_utf8(out, sc.lo + r.below(sc.hi - sc.lo + 1));
    if (r.below(4) == 0) out += extras[r.below(sizeof extras / sizeof extras[0])];
    out += spaces[r.below(sizeof spaces / sizeof spaces[0])];
  }
  return out;
}

// The sample as documents: about `file_bytes` of files, then `generated_bytes` of generated
// text in documents of 2-20 kB. The same arguments give the same documents.
inline std::vector<std::string> documents(size_t file_bytes, size_t generated_bytes) {
  std::vector<std::filesystem::path> paths = files("/usr/share/common-licenses", "");
  const auto py = python_lib();
  if (!py.empty())
    for (const auto& p : files(py, ".py")) paths.push_back(p);
  std::vector<std::string> docs;
  size_t total = 0;
  for (const auto& p : paths) {
    if (total >= file_bytes) break;
    std::string s = read(p);
    if (!clean(s)) continue;
    total += s.size();
    docs.push_back(std::move(s));
  }
  Rng r{20261203};
  for (size_t g = 0; g < generated_bytes;) {
    std::string s = generated_document(r, 2000 + r.below(18000));
    clean(s);
    g += s.size();
    docs.push_back(std::move(s));
  }
  return docs;
}

inline size_t total_bytes(const std::vector<std::string>& docs) {
  size_t n = 0;
  for (const auto& d : docs) n += d.size();
  return n;
}

}  // namespace corpus
