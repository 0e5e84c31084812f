// Graph construction and analysis (see graph.h).
#include "ops/graph.h"

#include <algorithm>
#include <stdexcept>

namespace ops {

const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::Embedding: return "embedding";
    case OpKind::LayerNorm: return "layernorm";
    case OpKind::RMSNorm: return "rmsnorm";
    case OpKind::Linear: return "linear";
    case OpKind::Rope: return "rope";
    case OpKind::Attention: return "attention";
    case OpKind::Gelu: return "gelu";
    case OpKind::SwiGLU: return "swiglu";
    case OpKind::Add: return "add";
    case OpKind::Dropout: return "dropout";
    case OpKind::SoftmaxXent: return "softmax_xent";
  }
  return "?";
}

int Graph::add_tensor(TensorDesc d) {
  tensors.push_back(std::move(d));
  return static_cast<int>(tensors.size()) - 1;
}

int Graph::add_param(const std::string& name, std::vector<int64_t> shape, int layer, bool decay, ShardSpec shard,
                     std::vector<int64_t> full_shape) {
  TensorDesc d;
  d.name = name;
  d.full_shape = full_shape.empty() ? shape : std::move(full_shape);
  d.shape = std::move(shape);
  d.kind = TensorKind::Param;
  d.layer = layer;
  d.decay = decay;
  d.shard = shard;
  int id = add_tensor(std::move(d));
  params.push_back(id);
  return id;
}

int Graph::add_input(const std::string& name, std::vector<int64_t> shape, DType dtype) {
  TensorDesc d;
  d.name = name;
  d.shape = std::move(shape);
  d.dtype = dtype;
  d.kind = TensorKind::Input;
  return add_tensor(std::move(d));
}

int Graph::add_activation(const std::string& name, std::vector<int64_t> shape, int layer, DType dtype) {
  TensorDesc d;
  d.name = name;
  d.shape = std::move(shape);
  d.dtype = dtype;
  d.kind = TensorKind::Activation;
  d.layer = layer;
  return add_tensor(std::move(d));
}

// Which tensors each kind's backward reads. Parameters and inputs may appear here; only
// activations count toward the activation ledger.
static std::vector<int> saves_of(const Node& n) {
  switch (n.kind) {
    case OpKind::Embedding: return {n.in[0]};                        // tokens
    case OpKind::LayerNorm: return {n.in[0], n.in[1], n.out[1], n.out[2]};  // x, w, mean, rstd
    case OpKind::RMSNorm: return {n.in[0], n.in[1], n.out[1]};        // x, w, rstd
    case OpKind::Linear: return {n.in[0], n.in[1]};                   // x, W
    case OpKind::Rope: return {};
    case OpKind::Attention: return {n.in[0], n.out[1]};               // qkv, probs
    case OpKind::Gelu: return {n.in[0]};
    case OpKind::SwiGLU: return {n.in[0]};
    case OpKind::Add: return {};
    case OpKind::Dropout: return {};                                  // mask regenerated from the RNG
    case OpKind::SoftmaxXent: return {n.in[0], n.in[1]};              // probs (in place of logits), targets
  }
  return {};
}

int Graph::add_node(Node n) {
  n.saves = saves_of(n);
  nodes.push_back(std::move(n));
  return static_cast<int>(nodes.size()) - 1;
}

std::vector<std::pair<int, int>> Graph::recompute_segments() const {
  std::vector<std::pair<int, int>> segs;
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    if (!nodes[i].recompute) continue;
    if (!segs.empty() && segs.back().second == i - 1 && nodes[i - 1].layer == nodes[i].layer)
      segs.back().second = i;
    else
      segs.push_back({i, i});
  }
  return segs;
}

void Graph::finalize() {
  for (auto& t : tensors) { t.producer = -1; t.last_use = -1; t.saved = false; }
  for (int i = 0; i < static_cast<int>(nodes.size()); ++i) {
    for (int o : nodes[i].out) {
      if (tensors[o].producer != -1) throw std::logic_error("tensor " + tensors[o].name + " written twice");
      tensors[o].producer = i;
    }
    for (int x : nodes[i].in) tensors[x].last_use = std::max(tensors[x].last_use, i);
    for (int s : nodes[i].saves)
      if (tensors[s].kind == TensorKind::Activation) tensors[s].saved = true;
  }
  node_segment_.assign(nodes.size(), -1);
  auto segs = recompute_segments();
  for (int s = 0; s < static_cast<int>(segs.size()); ++s) {
    auto [first, last] = segs[s];
    for (int i = first; i <= last; ++i) {
      node_segment_[i] = s;
      // Whatever a recomputed node reads from outside its segment must survive until backward.
      for (int x : nodes[i].in) {
        int p = tensors[x].producer;
        if (tensors[x].kind == TensorKind::Activation && (p < first || p > last)) tensors[x].saved = true;
      }
    }
  }
}

int Graph::find(const std::string& name) const {
  for (int i = 0; i < static_cast<int>(tensors.size()); ++i)
    if (tensors[i].name == name) return i;
  return -1;
}

int64_t Graph::param_count() const {
  int64_t n = 0;
  for (int p : params) n += numel_of(tensors[p].shape);
  return n;
}

}  // namespace ops
