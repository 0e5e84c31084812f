// safetensors headers (safetensors.h). The reader trusts nothing: the 8-byte header length is
// checked against the file size before the header is read, every entry's dtype, shape and data
// offsets against the data area, and the entries against each other (they must tile the data
// area), before any tensor byte is read.
#include "runner/export/safetensors.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "runner/errors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace runner {

namespace {

constexpr uint64_t kMaxHeader = 100ull << 20;  // the format's own limit (100 MB)

int64_t dtype_bytes(const std::string& d) {
  static const std::map<std::string, int64_t> sizes = {
      {"F64", 8}, {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"I64", 8}, {"I32", 4}, {"I16", 2}, {"I8", 1},
      {"U64", 8}, {"U32", 4}, {"U16", 2}, {"U8", 1}, {"BOOL", 1}, {"F8_E4M3", 1}, {"F8_E5M2", 1}};
  auto it = sizes.find(d);
  return it == sizes.end() ? 0 : it->second;
}

}  // namespace

[[noreturn]] void safetensors_corrupt(const std::string& path, const std::string& what) {
  throw UserError({path, 0, 0}, what, "the file is truncated or not a safetensors file: download or copy it again");
}

namespace {

// One entry of a header, checked against the data area of `data_bytes` bytes after `base`.
StTensor header_entry(const std::string& path, const std::string& name, const json& e, uint64_t base, uint64_t data_bytes) {
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") ||
      !e["dtype"].is_string() || !e["shape"].is_array() || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2)
    safetensors_corrupt(path, "tensor " + name + "'s header entry lacks dtype, shape or data_offsets [begin, end]");
  StTensor t;
  t.file = path;
  t.dtype = e["dtype"].get<std::string>();
  // The element count in 64 bits without overflow: a shape whose product passes 2^56 is no
  // tensor a file holds (and would wrap into a size that matches some offsets).
  int64_t numel = 1;
  for (const json& d : e["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (1ull << 62))
      safetensors_corrupt(path, "tensor " + name + " has a shape entry that is not a size");
    t.shape.push_back(d.get<int64_t>());
    if (__builtin_mul_overflow(numel, t.shape.back(), &numel) || numel > (int64_t{1} << 56))
      safetensors_corrupt(path, fmt::format("tensor {}'s shape [{}] has more elements than any file holds", name,
                                            fmt::join(t.shape, ", ")));
  }
  const json& o = e["data_offsets"];
  if (!o[0].is_number_unsigned() || !o[1].is_number_unsigned()) safetensors_corrupt(path, "tensor " + name + "'s data_offsets are not offsets");
  const uint64_t b = o[0].get<uint64_t>(), en = o[1].get<uint64_t>();
  if (b > en || en > data_bytes)
    safetensors_corrupt(path, fmt::format("tensor {}'s data [{}, {}) runs past the end of the data ({} bytes)", name, b, en, data_bytes));
  const int64_t es = dtype_bytes(t.dtype);
  if (es > 0 && en - b != static_cast<uint64_t>(numel) * static_cast<uint64_t>(es))
    safetensors_corrupt(path, fmt::format("tensor {} ({} {}) should hold {} bytes, its offsets give {}", name, t.dtype,
                              fmt::join(t.shape, "x"), static_cast<uint64_t>(numel) * static_cast<uint64_t>(es), en - b));
  t.begin = base + b;
  t.end = base + en;
  return t;
}

}  // namespace

void read_safetensors_header(const std::string& path, StIndex& into) {
  std::ifstream f(path, std::ios::binary);
  if (!f) throw UserError({path, 0, 0}, "cannot open the safetensors file", "check the path and its permissions");
  std::error_code ec;
  const uint64_t size = fs::file_size(path, ec);
  if (ec || size < 8) safetensors_corrupt(path, fmt::format("the file has {} bytes, fewer than the 8-byte header length", size));
  unsigned char lb[8];
  f.read(reinterpret_cast<char*>(lb), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | lb[i];
  if (n > kMaxHeader || n > size - 8)
    safetensors_corrupt(path, fmt::format("the header length {} runs past the end of the file ({} bytes)", n, size));
  std::string text(static_cast<size_t>(n), '\0');
  f.read(text.data(), static_cast<std::streamsize>(n));
  if (!f) safetensors_corrupt(path, "the header could not be read");
  json h = json::parse(text, nullptr, false);
  if (h.is_discarded() || !h.is_object()) safetensors_corrupt(path, "the header is not a JSON object");
  std::vector<std::pair<StTensor, std::string>> here;
  for (auto& [name, e] : h.items()) {
    if (name == "__metadata__") continue;
    if (into.count(name)) throw UserError({path, 0, 0}, "tensor " + name + " appears in two files", "remove the duplicate shard");
    into[name] = header_entry(path, name, e, 8 + n, size - 8 - n);
    here.emplace_back(into[name], name);
  }
  // The tensors tile the data area, as the format requires: in offset order each begins where
  // the previous one ends, from the first byte to the last. An overlap would make one tensor
  // silently read another's bytes; a gap or a tail is bytes no tensor accounts for.
  std::sort(here.begin(), here.end(), [](const auto& a, const auto& b) {
    return a.first.begin != b.first.begin ? a.first.begin < b.first.begin : a.first.end < b.first.end;
  });
  uint64_t at = 8 + n;
  const std::string* prev = nullptr;
  for (const auto& [t, name] : here) {
    if (t.begin < at)
      safetensors_corrupt(path, fmt::format("tensor {}'s data [{}, {}) overlaps tensor {}'s (which ends at {})", name, t.begin - 8 - n,
                                t.end - 8 - n, prev ? *prev : std::string("?"), at - 8 - n));
    if (t.begin > at)
      safetensors_corrupt(path, fmt::format("{} bytes of data before tensor {} belong to no tensor (data offsets {} to {})",
                                t.begin - at, name, at - 8 - n, t.begin - 8 - n));
    at = t.end;
    prev = &name;
  }
  if (at != size)
    safetensors_corrupt(path, fmt::format("the tensors' data ends at offset {}, but the data area holds {} bytes", at - 8 - n, size - 8 - n));
}

}  // namespace runner
