// Graph executor (see executor.h). Forward walks the nodes in order, backward in
// reverse; a tensor is released when its last reader is done. One code path serves the
// real run and the dry run that predicts memory.
//
// The executor knows no operator: it owns memory and order (outputs, input gradients,
// scratch counts, releases, recompute, timing) and hands each node to its kind's OpDef
// (ops/ops.h) through one table lookup, which runs the kernels and the collectives.
#include "ops/executor.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "ops/ops.h"

namespace ops {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
// A node's per-operand pointers (ops/ops.h kMaxOperands; Graph::add_node enforces it).
using Operands = std::array<float*, kMaxOperands>;
}  // namespace

struct Executor::Impl {
  const Graph& g;
  Backend* be;  // null in dry-run mode
  bool dry() const { return be == nullptr; }

  std::vector<Tensor> vals, grads;
  std::vector<char> live, glive, galias;
  std::vector<Tensor*> pval, pgrad;
  std::vector<Account> acc;
  bool train = false;
  uint64_t key = 0;
  int64_t sample_offset = 0;
  ReduceGroup* group = nullptr;   // tensor-parallel group (null: no tensor parallelism)
  std::function<void(int)> grad_hook;
  const float* stage_in = nullptr;
  float* stage_out = nullptr;
  std::vector<float> host_scratch;  // OpContext::host (vocabulary-parallel cross-entropy's row statistics)

  // The dry run counts the scratch an OpDef allocates and frees within one call (sequence
  // parallelism's full-sequence temporaries) at the moment the real run holds it.
  void count_scratch(const Node& n, bool backward) {
    if (!dry()) return;
    const OpDef& op = op_def(n.kind);
    const size_t b = op.scratch ? op.scratch(g, n, backward) : 0;
    if (b == 0) return;
    count(Account::Workspace, static_cast<long long>(b));
    count(Account::Workspace, -static_cast<long long>(b));
  }

  // Dry-run counters.
  std::array<size_t, kAccounts> cur{}, peak{};
  size_t peak_total = 0;

  std::array<OpProfile, kOpKinds> prof{};

  Impl(const Graph& graph, Backend* backend) : g(graph), be(backend) {
    size_t n = g.tensors.size();
    vals.resize(n);
    grads.resize(n);
    live.assign(n, 0);
    glive.assign(n, 0);
    galias.assign(n, 0);
    pval.assign(n, nullptr);
    pgrad.assign(n, nullptr);
    acc.assign(n, Account::Workspace);
    for (int k = 0; k < kOpKinds; ++k) prof[k].name = op_name(static_cast<OpKind>(k));
  }

  void count(Account a, long long delta) {
    if (!dry()) return;
    cur[static_cast<int>(a)] += delta;
    size_t total = 0;
    for (int i = 0; i < kAccounts; ++i) {
      peak[i] = std::max(peak[i], cur[i]);
      total += cur[i];
    }
    peak_total = std::max(peak_total, total);
  }

  void alloc(int id, Account a) {
    const TensorDesc& d = g.tensors[id];
    acc[id] = a;
    live[id] = 1;
    if (dry()) count(a, static_cast<long long>(d.nbytes()));
    else vals[id] = Tensor::empty(d.shape, d.dtype, a);
  }
  void release(int id) {
    if (!live[id]) return;
    live[id] = 0;
    if (dry()) count(acc[id], -static_cast<long long>(g.tensors[id].nbytes()));
    else vals[id] = Tensor();
  }
  // Activation gradients live in the workspace account, zeroed (backwards accumulate).
  float* grad(int id) {
    const TensorDesc& d = g.tensors[id];
    if (d.kind == TensorKind::Param) return pgrad[id] ? pgrad[id]->data<float>() : nullptr;
    if (d.kind == TensorKind::Input) return nullptr;
    if (!glive[id]) {
      glive[id] = 1;
      if (dry()) count(Account::Workspace, static_cast<long long>(d.nbytes()));
      else grads[id] = Tensor::zeros(d.shape, d.dtype, Account::Workspace);
    }
    return dry() ? nullptr : grads[id].data<float>();
  }
  // The loss's gradient: dlogits overwrite the probabilities in place, so the gradient
  // aliases the value (no bytes of its own; release_grad only drops the alias).
  float* grad_over_value(int id) {
    glive[id] = 1;
    galias[id] = 1;
    if (dry()) return nullptr;
    grads[id] = vals[id];
    return grads[id].data<float>();
  }
  void release_grad(int id) {
    if (!glive[id]) return;
    glive[id] = 0;
    if (galias[id]) { galias[id] = 0; grads[id] = Tensor(); return; }
    if (dry()) count(Account::Workspace, -static_cast<long long>(g.tensors[id].nbytes()));
    else grads[id] = Tensor();
  }

  // A tensor's value: the bound parameter, or the executor's storage (null when released).
  void* value(int id) {
    if (g.tensors[id].kind != TensorKind::Param) return vals[id].raw();
    if (!pval[id]) throw std::logic_error("parameter " + g.tensors[id].name + " is not bound (bind_param)");
    return pval[id]->raw();
  }

  Account out_account(int id) const {
    return (train && g.tensors[id].saved) ? Account::Activations : Account::Workspace;
  }

  // What node n's OpDef sees: its inputs' values and the step's state.
  OpContext context(const Node& n) {
    OpContext c{.g = g, .n = n, .be = *be};
    c.group = group;
    c.train = train;
    c.key = key;
    c.sample_offset = sample_offset;
    c.host = &host_scratch;
    for (size_t j = 0; j < n.in.size(); ++j) c.ins[j] = value(n.in[j]);
    return c;
  }

  // Runs node n's forward writing into `outs` (buffers by output position).
  void kernel_forward(const Node& n, const Operands& outs) {
    if (dry()) return;
    if (n.tp != TpMode::None && !group)
      throw std::logic_error("node " + n.name + " is tensor-parallel: the executor needs a ReduceGroup (set_group)");
    OpContext c = context(n);
    for (size_t j = 0; j < n.out.size(); ++j) c.outs[j] = outs[j];
    op_def(n.kind).forward(c);
  }

  // Runs node n's backward: acquires its inputs' gradient buffers (zeroed accumulators, or
  // for the loss the logits' own buffer), then the OpDef accumulates into them. Skipped when
  // nothing downstream needed the node's output.
  void kernel_backward(const Node& n, float dloss) {
    const OpDef& op = op_def(n.kind);
    if (!op.seeds_backward && !glive[n.out[0]]) return;
    Operands din{};
    for (size_t j = 0; j < n.in.size(); ++j)
      din[j] = j == 0 && op.seeds_backward ? grad_over_value(n.in[0]) : grad(n.in[j]);
    count_scratch(n, true);
    if (dry()) return;
    OpContext c = context(n);
    for (size_t j = 0; j < n.out.size(); ++j) c.outs[j] = vals[n.out[j]].raw();
    c.dins = din;
    c.dout = op.seeds_backward ? nullptr : grads[n.out[0]].data<float>();
    c.dloss = dloss;
    op.backward(c);
  }

  // Forward of node i: allocate its outputs, run it, release what is no longer needed.
  void forward_node(int i) {
    const Node& n = g.nodes[i];
    Operands outs{};
    for (size_t j = 0; j < n.out.size(); ++j) {
      const int o = n.out[j];
      alloc(o, out_account(o));
      outs[j] = dry() || g.tensors[o].dtype != DType::F32 ? nullptr : vals[o].data<float>();
    }
    count_scratch(n, false);
    auto t0 = Clock::now();
    kernel_forward(n, outs);
    if (!dry() && stage_out && g.stage_output >= 0 && n.out[0] == g.stage_output)
      std::memcpy(stage_out, outs[0], g.tensors[g.stage_output].nbytes());
    auto& p = prof[static_cast<int>(n.kind)];
    p.forward_ms += ms_since(t0);
    p.calls++;
    for (int x : n.in) {
      const TensorDesc& d = g.tensors[x];
      if (d.kind == TensorKind::Activation && d.last_use == i && !(train && d.saved)) release(x);
    }
    for (int o : n.out) {
      const TensorDesc& d = g.tensors[o];
      if (d.last_use == -1 && o != g.losses && !(train && d.saved)) release(o);
    }
  }

  void end_segment(int first, int last) {
    for (int j = first; j <= last; ++j)
      for (int o : g.nodes[j].out)
        if (g.tensors[o].last_use <= last) release(o);
  }

  // Known gap, kept so that plans stay byte-identical: the dry run does not count the
  // scratch that a recomputed node's forward allocates (no count_scratch here), i.e. a
  // sequence-parallel Linear's gathered input. The same node's backward, which runs right
  // after with more scratch (2P+1 shards against P), usually sets the peak instead.
  void recompute_segment(int first, int last) {
    for (int j = first; j <= last; ++j) {
      const Node& n = g.nodes[j];
      Operands outs{};
      std::vector<int> scratch;
      std::vector<Tensor> scratch_vals;
      for (size_t k = 0; k < n.out.size(); ++k) {
        const int o = n.out[k];
        if (live[o]) {  // still alive from forward (read outside the segment): recompute into scratch
          const TensorDesc& d = g.tensors[o];
          if (dry()) { count(Account::Workspace, static_cast<long long>(d.nbytes())); }
          else { scratch_vals.push_back(Tensor::empty(d.shape, d.dtype, Account::Workspace)); outs[k] = scratch_vals.back().data<float>(); }
          scratch.push_back(o);
        } else {
          alloc(o, Account::Activations);
          outs[k] = dry() ? nullptr : vals[o].data<float>();
        }
      }
      auto t0 = Clock::now();
      kernel_forward(n, outs);
      prof[static_cast<int>(n.kind)].recompute_ms += ms_since(t0);
      for (int o : scratch)
        if (dry()) count(Account::Workspace, -static_cast<long long>(g.tensors[o].nbytes()));
      for (int x : n.in) {
        const TensorDesc& d = g.tensors[x];
        if (d.kind == TensorKind::Activation && d.last_use == j && !d.saved && d.producer >= first) release(x);
      }
    }
  }

  void set_inputs(const int32_t* tokens, const int32_t* targets) {
    if (g.stage_input >= 0) {
      alloc(g.stage_input, out_account(g.stage_input));
      if (!dry()) {
        if (!stage_in) throw std::logic_error("forward of a pipeline stage needs its input activation");
        std::memcpy(vals[g.stage_input].raw(), stage_in, g.tensors[g.stage_input].nbytes());
      }
    }
    for (int id : {g.tokens, g.targets}) {
      if (id < 0) continue;
      const TensorDesc& d = g.tensors[id];
      alloc(id, Account::Workspace);
      if (!dry()) std::memcpy(vals[id].raw(), id == g.tokens ? static_cast<const void*>(tokens) : targets, d.nbytes());
    }
  }

  void release_all() {
    for (size_t i = 0; i < g.tensors.size(); ++i) {
      release_grad(static_cast<int>(i));
      release(static_cast<int>(i));
    }
  }

  LossSum forward(const int32_t* tokens, const int32_t* targets, bool is_train) {
    release_all();
    train = is_train;
    set_inputs(tokens, targets);
    int nn = static_cast<int>(g.nodes.size());
    for (int i = 0; i < nn; ++i) {
      forward_node(i);
      int s = g.segment_of(i);
      if (train && s >= 0) {
        auto seg = g.recompute_segments()[s];
        if (seg.second == i) end_segment(seg.first, seg.second);
      }
    }
    LossSum ls;
    if (!dry() && g.losses >= 0) {
      const float* l = vals[g.losses].data<float>();
      const int32_t* t = vals[g.targets].data<int32_t>();
      int64_t n = numel_of(g.tensors[g.losses].shape);
      for (int64_t k = 0; k < n; ++k)
        if (t[k] >= 0) { ls.sum += l[k]; ls.count++; }
    }
    if (g.losses >= 0) release(g.losses);
    if (!train) release_all();
    return ls;
  }

  void backward(float dloss, const float* dstage_out, float* dstage_in) {
    if (!train) throw std::logic_error("backward without a training forward");
    if (g.stage_output >= 0) {  // the gradient received from the next pipeline stage
      float* d = grad(g.stage_output);
      if (!dry()) {
        if (!dstage_out) throw std::logic_error("backward of a pipeline stage needs its output's gradient");
        std::memcpy(d, dstage_out, g.tensors[g.stage_output].nbytes());
      }
    }
    auto segs = g.recompute_segments();
    for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
      int s = g.segment_of(i);
      if (s >= 0 && segs[s].second == i) recompute_segment(segs[s].first, segs[s].second);
      const Node& n = g.nodes[i];
      auto t0 = Clock::now();
      kernel_backward(n, dloss);
      prof[static_cast<int>(n.kind)].backward_ms += ms_since(t0);
      for (int o : n.out) { release_grad(o); release(o); }
      if (grad_hook && !dry()) grad_hook(i);
    }
    if (g.stage_input >= 0 && dstage_in && !dry()) {  // the gradient sent to the previous stage
      if (glive[g.stage_input]) std::memcpy(dstage_in, grads[g.stage_input].raw(), g.tensors[g.stage_input].nbytes());
      else std::memset(dstage_in, 0, g.tensors[g.stage_input].nbytes());
    }
    release_all();
    train = false;
  }
};

Executor::Executor(const Graph& g, Backend& be) : impl_(new Impl(g, &be)) {}
Executor::~Executor() { delete impl_; }

void Executor::bind_param(int id, Tensor* value, Tensor* grad) {
  const TensorDesc& d = impl_->g.tensors[id];
  if (d.kind != TensorKind::Param || value->shape() != d.shape)
    throw std::logic_error("bind_param " + d.name + ": shape " + value->shape_str() + " vs graph " +
                           shape_to_string(d.shape));
  impl_->pval[id] = value;
  impl_->pgrad[id] = grad;
}

Executor::LossSum Executor::forward(const int32_t* tokens, const int32_t* targets, bool train, uint64_t key,
                                    int64_t sample_offset, const float* stage_in, float* stage_out) {
  impl_->key = key;
  impl_->sample_offset = sample_offset;
  impl_->stage_in = stage_in;
  impl_->stage_out = stage_out;
  auto r = impl_->forward(tokens, targets, train);
  impl_->stage_in = nullptr;
  impl_->stage_out = nullptr;
  return r;
}

void Executor::backward(float dloss, const float* dstage_out, float* dstage_in) {
  impl_->backward(dloss, dstage_out, dstage_in);
}

void Executor::set_group(ReduceGroup* group) { impl_->group = group; }
void Executor::set_grad_hook(std::function<void(int)> hook) { impl_->grad_hook = std::move(hook); }

const Tensor& Executor::forward_logits(const int32_t* tokens, const float* stage_in) {
  auto& m = *impl_;
  const Graph& g = m.g;
  m.release_all();
  m.train = false;
  if (g.tokens >= 0) {
    m.alloc(g.tokens, Account::Workspace);
    std::memcpy(m.vals[g.tokens].raw(), tokens, g.tensors[g.tokens].nbytes());
  }
  if (g.stage_input >= 0) {
    if (!stage_in) throw std::logic_error("forward_logits of a pipeline stage needs its input activation");
    m.alloc(g.stage_input, Account::Workspace);
    std::memcpy(m.vals[g.stage_input].raw(), stage_in, g.tensors[g.stage_input].nbytes());
  }
  // The logits' only reader is the loss node, which is not run: they stay alive.
  for (int i = 0; i <= g.tensors[g.logits].producer; ++i) m.forward_node(i);
  return m.vals[g.logits];
}

MemoryEstimate Executor::simulate(const Graph& g) {
  Impl m(g, nullptr);
  m.forward(nullptr, nullptr, true);
  MemoryEstimate est;
  est.activations_after_forward = m.cur[static_cast<int>(Account::Activations)];
  m.backward(1.0f, nullptr, nullptr);
  est.peak = m.peak;
  est.peak_total = m.peak_total;
  return est;
}

std::vector<OpProfile> Executor::profile() const {
  std::vector<OpProfile> out;
  for (auto& p : impl_->prof)
    if (p.calls) out.push_back(p);
  return out;
}

void Executor::reset_profile() {
  for (auto& p : impl_->prof) { p.forward_ms = p.backward_ms = p.recompute_ms = 0; p.calls = 0; }
}

}  // namespace ops
