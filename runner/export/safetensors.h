// Reading safetensors headers: the 8-byte little-endian header length, the JSON header (dtype,
// shape, data_offsets per tensor, an optional __metadata__), then the raw tensors. Every check
// a corrupt or hostile file needs is made here, before any tensor byte is read: the length
// against the file, each entry's dtype, shape and offsets against the data area, and the
// entries against each other (they tile the data area exactly: no overlap, no gap, no tail).
// Its own file so that the fuzz target (tests/fuzz/fuzz_safetensors.cpp) links it alone.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace runner {

struct StTensor {
  std::string file, dtype;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;  // absolute offsets in the file
};
using StIndex = std::map<std::string, StTensor>;

// Adds the tensors of the safetensors file at `path` to `into`. Throws UserError naming the
// file (and the tensor) for anything that is not a well-formed header, or for a tensor name
// `into` already holds (a tensor in two shards).
void read_safetensors_header(const std::string& path, StIndex& into);

// Throws the UserError of a corrupt safetensors file at `path` (what is wrong; how to fix).
[[noreturn]] void safetensors_corrupt(const std::string& path, const std::string& what);

}  // namespace runner
