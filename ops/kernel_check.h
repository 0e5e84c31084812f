// The plan's kernels against a backend's table (ops/kernels.h): an entry a backend lacks is a
// clear error before a run starts, not a throw in the middle of a step. Only the F32 entries
// a graph needs are asked for: the 16-bit entries (the 16-bit-native kernels, the 16-bit
// GEMMs) are choices the executor makes where the backend has them, widening otherwise.
#pragma once
#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/graph.h"

namespace ops {

struct MissingKernel {
  int node = -1;  // index into Graph::nodes
  Kernel kernel;
  DType dtype = DType::F32;
};

// What the graph's nodes would run that `be` has no entry for: their forward kernels (the
// decode graph's cached attention), their backward kernels when `train`, and the KV-cache
// prefill when `kv_cache` (a KV cache attached to a graph that is not a decode graph).
std::vector<MissingKernel> missing_kernels(const Graph& g, const Backend& be, bool train, bool kv_cache);

// Whether the backend has the 16-bit-native kernels in t: the (K, t) entry of every kernel of
// every native16 kind (OpDef::kernels of its plain form); the executor widens to fp32 otherwise.
bool native16_available(const Backend& be, DType t);

// Throws std::runtime_error naming, for each missing entry, the operator, kernel, dtype and
// backend (a KV-cache entry also says to generate with --no-kv-cache); returns when none.
void check_kernels(const Graph& g, const Backend& be, bool train, bool kv_cache);

}  // namespace ops
