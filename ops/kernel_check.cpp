// The kernels each operator kind runs, by pass (ops/op_*.cpp), checked against a backend.
#include "ops/kernel_check.h"

#include <stdexcept>
#include <string>

namespace ops {

namespace {

void add(std::vector<Kernel>& v, std::initializer_list<Kernel> ks) { v.insert(v.end(), ks.begin(), ks.end()); }

// The F32 kernels node n runs in its forward (and backward when `train`).
std::vector<Kernel> kernels_of(const Graph& g, const Node& n, bool train, bool kv_cache) {
  std::vector<Kernel> v;
  switch (n.kind) {
    case OpKind::Embedding:
      if (n.tp == TpMode::VocabEmbed) {
        add(v, {Kernel::EmbeddingShardForward});
        if (train) add(v, {Kernel::EmbeddingShardBackward});
      } else {
        add(v, {Kernel::EmbeddingForward});
        if (train) add(v, {Kernel::EmbeddingBackward});
      }
      break;
    case OpKind::LayerNorm:
      add(v, {Kernel::LayerNormForward});
      if (train) add(v, {Kernel::LayerNormBackward});
      break;
    case OpKind::RMSNorm:
      add(v, {Kernel::RmsNormForward});
      if (train) add(v, {Kernel::RmsNormBackward});
      break;
    case OpKind::Linear:
      add(v, {Kernel::MatmulForward});
      if (train) add(v, {Kernel::MatmulBackward});
      break;
    case OpKind::Rope:
      add(v, {Kernel::RopeForward});
      if (train) add(v, {Kernel::RopeBackward});
      break;
    case OpKind::Attention:
      if (g.decode) {
        add(v, {Kernel::AttentionDecode});
      } else {
        add(v, {Kernel::AttentionForward});
        if (kv_cache) add(v, {Kernel::KvCacheWrite});
        if (train) add(v, {Kernel::AttentionBackward});
      }
      break;
    case OpKind::Gelu:
      add(v, {Kernel::GeluForward});
      if (train) add(v, {Kernel::GeluBackward});
      break;
    case OpKind::SwiGLU:
      add(v, {Kernel::SwigluForward});
      if (train) add(v, {Kernel::SwigluBackward});
      break;
    case OpKind::Add:
      add(v, {Kernel::AddForward});
      if (train) add(v, {Kernel::AddInplace});
      break;
    case OpKind::Dropout:
      add(v, {Kernel::DropoutForward});
      if (train) add(v, {Kernel::DropoutBackward});
      break;
    case OpKind::SoftmaxXent:
      if (n.tp == TpMode::VocabXent) {
        add(v, {Kernel::XentShardMax, Kernel::XentShardSumexp, Kernel::XentShardFinish});
        if (train) add(v, {Kernel::XentShardBackward});
      } else {
        add(v, {Kernel::SoftmaxXentForward});
        if (train) add(v, {Kernel::SoftmaxXentBackward});
      }
      break;
    case OpKind::LinearGelu:
      add(v, {Kernel::LinearGeluForward});
      if (train) add(v, {Kernel::LinearGeluBackward});
      break;
    case OpKind::AddLayerNorm:
      add(v, {Kernel::AddLayerNormForward});
      if (train) add(v, {Kernel::AddLayerNormBackward});
      break;
    case OpKind::AddRMSNorm:
      add(v, {Kernel::AddRmsNormForward});
      if (train) add(v, {Kernel::AddRmsNormBackward});
      break;
    case OpKind::Relu2:
      add(v, {Kernel::Relu2Forward});
      if (train) add(v, {Kernel::Relu2Backward});
      break;
    case OpKind::Count:
      break;
  }
  return v;
}

}  // namespace

std::vector<MissingKernel> missing_kernels(const Graph& g, const Backend& be, bool train, bool kv_cache) {
  std::vector<MissingKernel> out;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (Kernel k : kernels_of(g, g.nodes[i], train, kv_cache))
      if (!be.has(k, DType::F32)) out.push_back({static_cast<int>(i), k, DType::F32});
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
