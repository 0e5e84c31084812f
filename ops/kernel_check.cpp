// The kernels each operator kind runs (OpDef::kernels, ops/op_*.cpp), checked against a backend.
#include "ops/kernel_check.h"

#include <stdexcept>
#include <string>

#include "ops/ops.h"

namespace ops {

bool native16_available(const Backend& be, DType t) {
  const Graph none{};  // the kinds' plain forms: no tensor parallelism, no decoding, no KV cache
  const Node plain{};
  for (const OpDef* op : kOpTable) {
    if (!op->native16) continue;
    for (bool backward : {false, true})
      for (Kernel k : op->kernels(none, plain, backward, false))
        if (!be.has(k, t)) return false;
  }
  return true;
}

std::vector<MissingKernel> missing_kernels(const Graph& g, const Backend& be, bool train, bool kv_cache) {
  std::vector<MissingKernel> out;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    const OpDef& op = op_def(n.kind);
    if (!op.kernels) throw std::logic_error(std::string("operator kind ") + op.name + " declares no kernels");
    for (bool backward : {false, true}) {
      if (backward && !train) break;
      for (Kernel k : op.kernels(g, n, backward, kv_cache))
        if (!be.has(k, DType::F32)) out.push_back({static_cast<int>(i), k, DType::F32});
    }
  }
  return out;
}

void check_kernels(const Graph& g, const Backend& be, bool train, bool kv_cache) {
  const std::vector<MissingKernel> miss = missing_kernels(g, be, train, kv_cache);
  if (miss.empty()) return;
  std::string msg = std::string("the ") + be.name() + " backend cannot run this plan: it has no kernel for";
  bool kv = false;
  for (const MissingKernel& m : miss) {
    const Node& n = g.nodes[static_cast<size_t>(m.node)];
    msg += std::string("\n  operator ") + n.name + " (" + op_name(n.kind) + "): " + kernel_name(m.kernel) + ", " +
           dtype_name(m.dtype);
    kv = kv || m.kernel == Kernel::KvCacheWrite || m.kernel == Kernel::AttentionDecode;
  }
  if (kv) msg += "\n(the KV cache's kernels: generate with --no-kv-cache, a full forward pass per token)";
  throw std::runtime_error(msg);
}

}  // namespace ops
