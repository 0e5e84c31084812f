// Graph construction and analysis (see graph.h).
#include "ops/graph.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "ops/ops.h"

namespace ops {

const char* op_name(OpKind k) {
  const int i = static_cast<int>(k);
  return i >= 0 && i < kOpKinds ? op_def(k).name : "?";
}

std::optional<OpKind> op_kind_named(std::string_view name) {
  for (const OpDef* op : kOpTable)
    if (name == op->name) return op->kind;
  return std::nullopt;
}

std::vector<ShardSpec::Run> ShardSpec::runs(int64_t full_len) const {
  if (!split()) return {Run{0, 0, full_len, false}};
  std::vector<Run> out;
  const int nb = sizes.empty() ? blocks : static_cast<int>(sizes.size());
  int64_t at_shard = 0, at_full = 0;
  for (int b = 0; b < nb; ++b) {
    const int64_t fb = sizes.empty() ? full_len / blocks : sizes[static_cast<size_t>(b)];
    if ((replicated >> b) & 1u) {
      out.push_back(Run{at_shard, at_full, fb, true});
      at_shard += fb;
    } else {
      const int64_t sb = fb / parts;
      out.push_back(Run{at_shard, at_full + index * sb, sb, false});
      at_shard += sb;
    }
    at_full += fb;
  }
  return out;
}

int64_t ShardSpec::shard_len(int64_t full_len) const {
  int64_t n = 0;
  for (const Run& r : runs(full_len)) n += r.len;
  return n;
}

// Called per element (initialisation, checkpoint maps): no allocation.
int64_t ShardSpec::full_at(int64_t i, int64_t full_len) const {
  if (!split()) return i;
  const int nb = sizes.empty() ? blocks : static_cast<int>(sizes.size());
  int64_t at_shard = 0, at_full = 0;
  for (int b = 0; b < nb; ++b) {
    const int64_t fb = sizes.empty() ? full_len / blocks : sizes[static_cast<size_t>(b)];
    const bool rep = (replicated >> b) & 1u;
    const int64_t len = rep ? fb : fb / parts;
    if (i < at_shard + len) return at_full + (rep ? 0 : index * len) + (i - at_shard);
    at_shard += len;
    at_full += fb;
  }
  throw std::logic_error("shard index " + std::to_string(i) + " past the shard's " + std::to_string(at_shard));
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

int Graph::add_node(Node n) {
  constexpr size_t kMax = kMaxOperands;
  if (static_cast<int>(n.kind) >= kOpKinds) throw std::logic_error("node " + n.name + ": no such operator kind");
  if (n.in.empty() || n.out.empty() || n.in.size() > kMax || n.out.size() > kMax)
    throw std::logic_error("node " + n.name + " (" + op_name(n.kind) + "): " + std::to_string(n.in.size()) +
                           " inputs and " + std::to_string(n.out.size()) + " outputs; an operator has 1 to " +
                           std::to_string(kMax) + " of each (ops/ops.h, kMaxOperands)");
  n.saves = op_def(n.kind).saves(n);
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
