// A graph of one node (node_graph.h).
#include "ops/node_graph.h"

#include <utility>

#include "ops/check.h"
#include "ops/ops.h"

namespace ops {

NodeGraph::NodeGraph(OpKind kind, int64_t B, int64_t T, std::string name) {
  g.B = B;
  g.T = T;
  n.kind = kind;
  n.name = name.empty() ? std::string(op_name(kind)) : std::move(name);
  n.layer = 0;
  n.module = Module::none;
}

NodeGraph& NodeGraph::x(std::vector<int64_t> shape, DType t) {
  g.stage_input = g.add_activation("x", std::move(shape), 0, t);
  n.in.push_back(g.stage_input);
  return *this;
}

NodeGraph& NodeGraph::param(const std::string& name, std::vector<int64_t> shape, DType t) {
  const int id = g.add_param(name, std::move(shape), 0);
  g.tensors[static_cast<size_t>(id)].dtype = t;
  n.in.push_back(id);
  return *this;
}

NodeGraph& NodeGraph::tokens() {
  g.tokens = g.add_input("tokens", {g.B, g.T}, DType::I32);
  n.in.push_back(g.tokens);
  return *this;
}

NodeGraph& NodeGraph::targets() {
  g.targets = g.add_input("targets", {g.B, g.T}, DType::I32);
  n.in.push_back(g.targets);
  return *this;
}

NodeGraph& NodeGraph::out(const std::string& name, std::vector<int64_t> shape, DType t) {
  n.out.push_back(g.add_activation(name, std::move(shape), 0, t));
  return *this;
}

NodeGraph& NodeGraph::done(size_t leaving) {
  OPS_CHECK(leaving < n.out.size(), "a one-node graph sends out an output it has");
  g.add_node(n);
  if (op_def(n.kind).seeds_backward) g.losses = n.out[0];
  else g.stage_output = n.out[leaving];
  g.finalize();
  return *this;
}

}  // namespace ops
