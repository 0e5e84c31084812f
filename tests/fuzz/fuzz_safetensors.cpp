// libFuzzer target: the safetensors header reader `runner import` checks a model's files with
// (runner/export/safetensors.h), on arbitrary bytes written to a file (scripts/fuzz.sh runs it).
// Every byte string must be read or refused with a UserError; any other exception, a crash, a
// sanitizer report or a timeout is a bug. What is read must also hold what the reader promises:
// every tensor inside the file, the tensors tiling the data area without overlap, so that no
// accepted file makes one tensor read another's bytes (a silent wrong result, reported as one).
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "runner/errors.h"
#include "runner/export/safetensors.h"

namespace {

[[noreturn]] void wrong(const char* what) {
  std::fprintf(stderr, "fuzz_safetensors: accepted a header that %s\n", what);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = "/tmp/fuzz_safetensors." + std::to_string(::getpid()) + ".safetensors";
  {
    std::ofstream f(path, std::ios::binary | std::ios::trunc);
    f.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  runner::StIndex idx;
  try {
    runner::read_safetensors_header(path, idx);
  } catch (const runner::UserError&) {
    return 0;  // the expected refusal
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_safetensors: not a UserError: %s\n", e.what());
    std::abort();
  }
  std::vector<std::pair<uint64_t, uint64_t>> spans;
  for (const auto& [name, t] : idx) {
    if (t.begin > t.end || t.end > size) wrong("has a tensor outside the file");
    spans.emplace_back(t.begin, t.end);
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i)
    if (spans[i].first < spans[i - 1].second) wrong("has overlapping tensors");
  if (!spans.empty() && spans.back().second != size) wrong("leaves bytes after the last tensor");
  return 0;
}
