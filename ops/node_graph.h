// A graph of one node: one operator alone, for measuring it (`runner calibrate`) or testing it
// (the operator tests). Tensors are added in the order the node reads them, as the model
// builder would: the float input `x` is the graph's stage input, parameters are stored in the
// dtype given (the compute copy, as the model builds it), tokens and targets are (B, T) int32.
// done() adds the node and sends one output out of the graph: for the loss (OpDef::
// seeds_backward) its first output as the losses; otherwise output `leaving` (default the
// first) as the stage output.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "ops/graph.h"
#include "ops/ops.h"

namespace ops {

struct NodeGraph {
  Graph g;
  Node n;

  // `name` names the node (the operator's profiler name when empty).
  NodeGraph(OpKind kind, int64_t B, int64_t T, std::string name = "");
  NodeGraph& x(std::vector<int64_t> shape, DType t);
  NodeGraph& param(const std::string& name, std::vector<int64_t> shape, DType t);
  NodeGraph& tokens();
  NodeGraph& targets();
  NodeGraph& out(const std::string& name, std::vector<int64_t> shape, DType t);
  NodeGraph& done(size_t leaving = 0);
};

// An operator's bandwidth probe (OpDef::probe) building its node into a NodeGraph: tensors in
// `act`, except the outputs the probe wants in fp32 (statistics).
class NodeGraphProbe final : public ProbeBuilder {
 public:
  NodeGraphProbe(NodeGraph& g, DType act) : ng_(g), act_(act) {}
  void x(std::vector<int64_t> shape) override { ng_.x(std::move(shape), act_); }
  void param(const std::string& name, std::vector<int64_t> shape) override { ng_.param(name, std::move(shape), act_); }
  void tokens() override { ng_.tokens(); }
  void targets() override { ng_.targets(); }
  void out(const std::string& name, std::vector<int64_t> shape, bool f32) override {
    ng_.out(name, std::move(shape), f32 ? DType::F32 : act_);
  }
  Node& node() override { return ng_.n; }

 private:
  NodeGraph& ng_;
  DType act_;
};

}  // namespace ops
