// Graph executor (see executor.h). Forward walks the nodes in order, backward in
// reverse; a tensor is released when its last reader is done. One code path serves the
// real run and the dry run that predicts memory.
//
// The executor knows no operator: it owns memory and order (outputs, input gradients,
// scratch counts, releases, recompute, timing) and hands each node to its kind's OpDef
// (ops/ops.h) through one table lookup, which runs the kernels and the collectives.
#include "ops/executor.h"
#include "ops/kernel_check.h"

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "ops/convert.h"
#include "ops/device_timer.h"
#include "ops/gemm_path.h"
#include "ops/knobs.h"
#include "ops/ops.h"

namespace ops {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
// A node's per-operand pointers (ops/ops.h kMaxOperands; Graph::add_node enforces it).
using Operands = std::array<float*, kMaxOperands>;

bool is16(DType t) { return t == DType::BF16 || t == DType::F16; }

// The switch: -1 until first read (then the environment's answer), 0 or 1.
std::atomic<int> g_native16{-1};
}  // namespace

void set_native16(bool on) { g_native16.store(on ? 1 : 0); }
bool native16_enabled() {
  int v = g_native16.load();
  if (v < 0) {
    v = knobs().native16 ? 1 : 0;
    g_native16.store(v);
  }
  return v == 1;
}

struct Executor::Impl {
  const Graph& g;
  Backend* be;  // null in dry-run mode
  bool dry() const { return be == nullptr; }
  // native16_available(*be, t) for BF16 and F16, asked once (-1: not yet): it walks every
  // native16 kind's kernels, and native16_call asks it for each node, each pass.
  mutable std::array<int8_t, 2> native16_ok{-1, -1};
  bool backend_native16(DType t) const {
    int8_t& ok = native16_ok[t == DType::BF16 ? 0 : 1];
    if (ok < 0) ok = native16_available(*be, t) ? 1 : 0;
    return ok == 1;
  }

  std::vector<Tensor> vals, grads;
  std::vector<char> live, glive, galias;
  std::vector<Tensor*> pval, pgrad;
  std::vector<Account> acc;
  bool train = false;
  uint64_t key = 0;
  int64_t sample_offset = 0;
  ReduceGroup* group = nullptr;   // tensor-parallel group (null: no tensor parallelism)
  std::function<void(int)> grad_hook;
  const void* stage_in = nullptr;
  void* stage_out = nullptr;
  KvCache* kv = nullptr;            // OpContext::kv (generation)
  std::vector<float> host_scratch;  // OpContext::host (vocabulary-parallel cross-entropy's row statistics)
  std::vector<float> host_losses;   // the per-position losses crossed out to the host (forward's LossSum)

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

  // fp32 copies of one call's 16-bit operands (see executor.h): allocated through wide(), held
  // until release_wide() at the end of the call, counted in the dry run.
  std::vector<Tensor> wide_keep;
  size_t wide_held = 0;
  float* wide(const TensorDesc& d, bool zero) {
    const size_t b = static_cast<size_t>(numel_of(d.shape)) * sizeof(float);
    if (dry()) {
      count(Account::Workspace, static_cast<long long>(b));
      wide_held += b;
      return nullptr;
    }
    wide_keep.push_back(zero ? Tensor::zeros(d.shape, DType::F32, Account::Workspace)
                             : Tensor::empty(d.shape, DType::F32, Account::Workspace));
    return wide_keep.back().data<float>();
  }
  // A value as the kernels read it: fp32 as stored, or widened from 16 bits (null stays null).
  void* readable(const TensorDesc& d, void* raw, bool present) {
    if (!present || !is16(d.dtype)) return raw;
    float* w = wide(d, false);
    if (!dry()) be->run(k::Convert(w, DType::F32, raw, d.dtype, numel_of(d.shape)));
    return w;
  }
  void release_wide() {
    if (dry()) count(Account::Workspace, -static_cast<long long>(wide_held));
    wide_held = 0;
    wide_keep.clear();
  }

  // Dry-run counters.
  std::array<size_t, kAccounts> cur{}, peak{};
  size_t peak_total = 0;

  std::array<OpProfile, kOpKinds> prof{};
  // On a device with a queue (ops/device_timer.h): each node timed by marks on the queue,
  // added to prof when profile() reads it (the host clock then measures only launches).
  mutable OpEventLog dev_times;
  void resolve_device_times() const {
    dev_times.resolve([this](int k, char pass, double ms) {
      OpProfile& p = const_cast<OpProfile&>(prof[static_cast<size_t>(k)]);
      (pass == 'f' ? p.forward_ms : pass == 'b' ? p.backward_ms : p.recompute_ms) += ms;
    });
  }
  std::vector<TraceEvent>* trace = nullptr;
  void traced(int node, char pass, Clock::time_point t0) {
    if (!trace || dry()) return;
    auto ns = [](Clock::time_point t) { return std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count(); };
    trace->push_back({&g, node, pass, ns(t0), ns(Clock::now())});
  }

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
  // Activation gradients live in the workspace account, in the activation's dtype, zeroed
  // (backwards accumulate).
  void* grad(int id) {
    const TensorDesc& d = g.tensors[id];
    if (d.kind == TensorKind::Param) return pgrad[id] ? pgrad[id]->raw() : nullptr;
    if (d.kind == TensorKind::Input) return nullptr;
    if (!glive[id]) {
      glive[id] = 1;
      if (dry()) count(Account::Workspace, static_cast<long long>(d.nbytes()));
      else grads[id] = Tensor::zeros(d.shape, d.dtype, Account::Workspace);
    }
    return dry() ? nullptr : grads[id].raw();
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
    if (dry()) return nullptr;
    if (g.tensors[id].kind != TensorKind::Param) return vals[id].raw();
    if (!pval[id]) throw std::logic_error("parameter " + g.tensors[id].name + " is not bound (bind_param)");
    return pval[id]->raw();
  }

  Account out_account(int id) const {
    return (train && g.tensors[id].saved) ? Account::Activations : Account::Workspace;
  }

  // Whether node n's forward or backward call reads its 16-bit operands as stored (OpDef::reads16:
  // the Linear on oneDNN's path). The same answer in the dry run and the real run.
  bool as_stored(const Node& n, bool backward) const {
    const OpDef& op = op_def(n.kind);
    return op.reads16 && op.reads16(g, n, backward);
  }

  // Whether node n runs its OpDef's 16-bit-native kernels: the op has them, the
  // switch is on, the plan is not the GPU's, the node is plain (no tensor or sequence
  // parallelism, no decode, no KV cache to fill), its first output is 16-bit (t), every float
  // input is an activation in t or a parameter where the op takes one (OpDef::native16_params;
  // in t where the op reads it as stored, OpDef::native16_stored), and the backend has the
  // kernels for t (the dry run, without a backend, assumes the CPU's, which has them). The same
  // answer in the dry run and the real run.
  bool native16_call(const Node& n) const {
    const OpDef& op = op_def(n.kind);
    if (!op.native16 || !native16_enabled() || n.tp != TpMode::None) return false;
    if (n.gather_input || n.scatter_output || g.decode || gemm_paths_device_now()) return false;
    if (kv && n.kind == OpKind::Attention) return false;  // prefill: kv_cache_write reads an fp32 qkv
    const DType t = g.tensors[n.out[0]].dtype;
    if (!is16(t)) return false;
    for (size_t j = 0; j < n.in.size(); ++j) {
      const TensorDesc& d = g.tensors[n.in[j]];
      if (d.kind == TensorKind::Param) {
        if (!((op.native16_params >> j) & 1u)) return false;
        if (((op.native16_stored >> j) & 1u) && d.dtype != t) return false;
      } else if (d.dtype != DType::I32 && (d.kind != TensorKind::Activation || d.dtype != t)) {
        return false;
      }
    }
    return dry() || backend_native16(t);
  }

  // Node n's input values as its kernels read them (fp32, widened from 16 bits, or int; or as
  // stored when `stored`; when `native`, activations and the parameters the op reads as stored
  // (OpDef::native16_stored) as stored, other parameters widened). The dry run counts exactly
  // the copies made here.
  std::array<void*, kMaxOperands> inputs(const Node& n, bool stored, bool native = false) {
    std::array<void*, kMaxOperands> v{};
    const unsigned param_stored = native ? op_def(n.kind).native16_stored : 0u;
    for (size_t j = 0; j < n.in.size(); ++j) {  // an activation no backward reads may be released already
      const TensorDesc& d = g.tensors[n.in[j]];
      const bool raw = stored || (native && d.kind == TensorKind::Activation) ||
                       (d.kind == TensorKind::Param && ((param_stored >> j) & 1u));
      v[j] = raw ? value(n.in[j]) : readable(d, value(n.in[j]), d.kind != TensorKind::Activation || live[n.in[j]]);
    }
    return v;
  }

  // What node n's OpDef sees: its inputs' values and the step's state (real runs only).
  OpContext context(const Node& n, const std::array<void*, kMaxOperands>& ins) {
    OpContext c{.g = g, .n = n, .be = *be};
    c.group = group;
    c.train = train;
    c.key = key;
    c.sample_offset = sample_offset;
    c.host = &host_scratch;
    c.kv = kv;
    c.ins = ins;
    return c;
  }

  // An output buffer for the kernel: the tensor's fp32 storage, or an fp32 copy of a 16-bit one
  // that finish_outputs rounds into it.
  // A native call (native16_call) writes the 16-bit storage itself.
  float* output_buffer(int o, void* storage, bool native) {
    const TensorDesc& d = g.tensors[o];
    if (is16(d.dtype) && !native) return wide(d, false);
    return static_cast<float*>(storage);
  }
  void finish_outputs(const Node& n, const Operands& outs, const std::vector<void*>& storage, bool native) {
    if (dry() || native) return;
    for (size_t j = 0; j < n.out.size(); ++j) {
      const TensorDesc& d = g.tensors[n.out[j]];
      if (is16(d.dtype) && storage[j]) be->run(k::Convert(storage[j], d.dtype, outs[j], DType::F32, numel_of(d.shape)));
    }
  }

  // Runs node n's forward writing into `outs` (buffers by output position); widened inputs are
  // counted (dry run) or made here and released by the caller (release_wide).
  void kernel_forward(const Node& n, const Operands& outs, bool native) {
    const bool stored = as_stored(n, false);
    auto ins = inputs(n, stored, native);
    count_scratch(n, false);
    if (dry()) return;
    if (n.tp != TpMode::None && !group)
      throw std::logic_error("node " + n.name + " is tensor-parallel: the executor needs a ReduceGroup (set_group)");
    OpContext c = context(n, ins);
    c.as_stored = stored;
    c.native16 = native;
    for (size_t j = 0; j < n.out.size(); ++j) c.outs[j] = outs[j];
    op_def(n.kind).forward(c);
  }

  // Runs node n's backward: acquires its inputs' gradient buffers (zeroed accumulators, or
  // for the loss the logits' own buffer), then the OpDef accumulates into them. Skipped when
  // nothing downstream needed the node's output.
  //
  // 16-bit gradients: the kernel accumulates into zeroed fp32 copies, which are then folded into
  // the stored gradient: an activation's is rounded into its dtype; a parameter's is rounded to
  // the parameter's (compute) dtype, as a 16-bit kernel would produce it, and added to the bound
  // gradient buffer in that buffer's dtype.
  void kernel_backward(const Node& n, float dloss) {
    const OpDef& op = op_def(n.kind);
    // A node that reads both outputs' gradients runs when either is live; the
    // other is then a zeroed buffer (grad()), counted in the dry run as in the real run.
    const bool dout1 = op.reads_dout1 && n.out.size() > 1;
    if (!op.seeds_backward && !glive[n.out[0]] && !(dout1 && glive[n.out[1]])) return;
    if (dout1) {
      grad(n.out[0]);
      grad(n.out[1]);
    }
    const bool native = native16_call(n);  // activation gradients accumulated in place, in 16 bits
    Operands din{};
    std::array<int, kMaxOperands> fold;
    fold.fill(-1);
    for (size_t j = 0; j < n.in.size(); ++j) {
      const int x = n.in[j];
      const TensorDesc& d = g.tensors[x];
      if (j == 0 && op.seeds_backward) {
        if (is16(d.dtype)) throw std::logic_error("node " + n.name + ": the loss reads fp32 logits");
        din[j] = static_cast<float*>(grad_over_value(x));
        continue;
      }
      void* gr = grad(x);
      const bool needed = dry() ? d.kind != TensorKind::Input : gr != nullptr;
      // A parameter whose gradient buffer is fp32 is accumulated into directly: the kernels add
      // (+=) into their input gradients, so the buffer sums fp32 results unrounded.
      const bool direct = (d.kind == TensorKind::Param && d.grad_dtype == DType::F32) ||
                          (native && d.kind == TensorKind::Activation);
      if (needed && is16(d.dtype) && !direct) {
        din[j] = wide(d, true);
        fold[j] = x;
      } else {
        din[j] = static_cast<float*>(gr);
      }
    }
    const bool stored = as_stored(n, true);
    auto ins = inputs(n, stored, native);
    const bool raw_outs = stored || native;  // the outputs and their gradient as stored
    std::array<void*, kMaxOperands> outv{};
    for (size_t j = 0; j < n.out.size(); ++j) {
      void* raw = dry() ? nullptr : vals[n.out[j]].raw();
      outv[j] = raw_outs ? raw : readable(g.tensors[n.out[j]], raw, live[n.out[j]] != 0);
    }
    const float* dout = nullptr;
    if (!op.seeds_backward) {
      void* raw = dry() ? nullptr : grads[n.out[0]].raw();
      dout = static_cast<const float*>(raw_outs ? raw : readable(g.tensors[n.out[0]], raw, true));
    }
    const float* dout_1 = nullptr;
    if (dout1) {
      void* raw = dry() ? nullptr : grads[n.out[1]].raw();
      dout_1 = static_cast<const float*>(raw_outs ? raw : readable(g.tensors[n.out[1]], raw, true));
    }
    count_scratch(n, true);
    if (!dry()) {
      OpContext c = context(n, ins);
      c.as_stored = stored;
      c.native16 = native;
      c.outs = outv;
      c.dins = din;
      c.dout = dout;
      c.dout1 = dout_1;
      // d(out[0]) is this node's to overwrite: the executor's own buffer (or an
      // fp32 copy of a 16-bit one), released right after this call.
      if (op.consumes_dout && !stored) c.dout_own = const_cast<float*>(dout);
      c.dloss = dloss;
      op.backward(c);
      for (size_t j = 0; j < n.in.size(); ++j) {
        const int x = fold[j];
        if (x < 0) continue;
        const TensorDesc& d = g.tensors[x];
        // A parameter's 16-bit buffer gets the sum rounded once; an activation's its dtype's rounding.
        Tensor& dst = d.kind == TensorKind::Param ? *pgrad[x] : grads[x];
        be->run(k::Accumulate(dst.raw(), dst.dtype(), din[j], dst.numel()));
      }
    }
    release_wide();
  }

  // Forward of node i: allocate its outputs, run it, release what is no longer needed.
  void forward_node(int i) {
    const Node& n = g.nodes[i];
    Operands outs{};
    std::vector<void*> storage(n.out.size(), nullptr);
    const bool native = native16_call(n);
    for (size_t j = 0; j < n.out.size(); ++j) {
      const int o = n.out[j];
      alloc(o, out_account(o));
      if (!dry()) storage[j] = vals[o].raw();
      outs[j] = output_buffer(o, storage[j], native);
    }
    auto t0 = Clock::now();
    const int64_t ev = dev_times.begin(static_cast<int>(n.kind), 'f', op_def(n.kind).name);
    kernel_forward(n, outs, native);
    finish_outputs(n, outs, storage, native);
    release_wide();
    // The stage output may be any output of its node (a fused add + norm's normalized out[1]
    // in tests/test_ops_table.cpp's one-node graph).
    for (int o : n.out)
      if (!dry() && stage_out && o == g.stage_output) be->copy(stage_out, vals[o].raw(), g.tensors[o].nbytes());
    auto& p = prof[static_cast<int>(n.kind)];
    if (!dev_times.end(ev)) p.forward_ms += ms_since(t0);
    traced(i, 'f', t0);
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
      std::vector<void*> storage(n.out.size(), nullptr);
      std::vector<int> scratch;
      std::vector<Tensor> scratch_vals;
      const bool native = native16_call(n);
      for (size_t k = 0; k < n.out.size(); ++k) {
        const int o = n.out[k];
        const TensorDesc& d = g.tensors[o];
        if (live[o] && is16(d.dtype) && !native) {  // still alive from forward: recompute into an fp32 copy, dropped
          outs[k] = wide(d, false);
        } else if (live[o]) {  // still alive from forward (read outside the segment): recompute into scratch
          if (dry()) { count(Account::Workspace, static_cast<long long>(d.nbytes())); }
          else { scratch_vals.push_back(Tensor::empty(d.shape, d.dtype, Account::Workspace)); outs[k] = static_cast<float*>(scratch_vals.back().raw()); }
          scratch.push_back(o);
        } else {
          alloc(o, Account::Activations);
          if (!dry()) storage[k] = vals[o].raw();
          outs[k] = output_buffer(o, storage[k], native);
        }
      }
      auto t0 = Clock::now();
      const int64_t ev = dev_times.begin(static_cast<int>(n.kind), 'r', op_def(n.kind).name);
      // The kernel's own scratch is not counted here (the known gap above), only widened operands.
      const bool stored = as_stored(n, false);
      auto ins = inputs(n, stored, native);
      if (!dry()) {
        OpContext c = context(n, ins);
        c.as_stored = stored;
        c.native16 = native;
        for (size_t k = 0; k < n.out.size(); ++k) c.outs[k] = outs[k];
        op_def(n.kind).forward(c);
      }
      finish_outputs(n, outs, storage, native);
      release_wide();
      if (!dev_times.end(ev)) prof[static_cast<int>(n.kind)].recompute_ms += ms_since(t0);
      traced(j, 'r', t0);
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
        be->copy(vals[g.stage_input].raw(), stage_in, g.tensors[g.stage_input].nbytes());
      }
    }
    for (int id : {g.tokens, g.targets}) {  // the batch crossing in (host memory, the data loader's)
      if (id < 0) continue;
      alloc(id, Account::Workspace);
      if (!dry()) vals[id].write_from_host(id == g.tokens ? static_cast<const void*>(tokens) : targets);
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
    if (!dry() && g.losses >= 0) ls = loss_sum(targets);
    if (g.losses >= 0) release(g.losses);
    if (!train) release_all();
    return ls;
  }

  // The loss crossing out: the per-position losses are copied to the host (waiting for the
  // forward) and summed there in position order, over the targets the host handed in.
  LossSum loss_sum(const int32_t* targets) {
    const int64_t n = numel_of(g.tensors[g.losses].shape);
    host_losses.resize(static_cast<size_t>(n));
    vals[g.losses].read_to_host(host_losses.data());
    LossSum ls;
    for (int64_t k = 0; k < n; ++k)
      if (targets[k] >= 0) { ls.sum += host_losses[static_cast<size_t>(k)]; ls.count++; }
    return ls;
  }

  void backward(float dloss, const void* dstage_out, void* dstage_in) {
    if (!train) throw std::logic_error("backward without a training forward");
    if (g.stage_output >= 0) {  // the gradient received from the next pipeline stage
      void* d = grad(g.stage_output);
      if (!dry()) {
        if (!dstage_out) throw std::logic_error("backward of a pipeline stage needs its output's gradient");
        be->copy(d, dstage_out, g.tensors[g.stage_output].nbytes());
      }
    }
    auto segs = g.recompute_segments();
    for (int i = static_cast<int>(g.nodes.size()) - 1; i >= 0; --i) {
      int s = g.segment_of(i);
      if (s >= 0 && segs[s].second == i) recompute_segment(segs[s].first, segs[s].second);
      const Node& n = g.nodes[i];
      auto t0 = Clock::now();
      const int64_t ev = dev_times.begin(static_cast<int>(n.kind), 'b', op_def(n.kind).name);
      kernel_backward(n, dloss);
      if (!dev_times.end(ev)) prof[static_cast<int>(n.kind)].backward_ms += ms_since(t0);
      traced(i, 'b', t0);
      for (int o : n.out) { release_grad(o); release(o); }
      if (grad_hook && !dry()) grad_hook(i);
    }
    if (g.stage_input >= 0 && dstage_in && !dry()) {  // the gradient sent to the previous stage
      if (glive[g.stage_input]) be->copy(dstage_in, grads[g.stage_input].raw(), g.tensors[g.stage_input].nbytes());
      else be->mem_zero(dstage_in, g.tensors[g.stage_input].nbytes());
    }
    release_all();
    train = false;
  }
};

// A real run: the plan's kernels are checked against the backend's table before any step (a
// graph with a loss may run its backward).
Executor::Executor(const Graph& g, Backend& be) : impl_(nullptr) {
  check_kernels(g, be, g.losses >= 0 && !g.decode, false);
  impl_ = new Impl(g, &be);
}
Executor::~Executor() { delete impl_; }

void Executor::bind_param(int id, Tensor* value, Tensor* grad) {
  const TensorDesc& d = impl_->g.tensors[id];
  if (d.kind != TensorKind::Param || value->shape() != d.shape)
    throw std::logic_error("bind_param " + d.name + ": shape " + value->shape_str() + " vs graph " +
                           shape_to_string(d.shape));
  if (value->dtype() != d.dtype || (grad && grad->dtype() != d.grad_dtype))
    throw std::logic_error("bind_param " + d.name + ": value " + dtype_name(value->dtype()) + " and gradient " +
                           (grad ? dtype_name(grad->dtype()) : "none") + " vs graph " + dtype_name(d.dtype) + " and " +
                           dtype_name(d.grad_dtype));
  impl_->pval[id] = value;
  impl_->pgrad[id] = grad;
}

Executor::LossSum Executor::forward(const int32_t* tokens, const int32_t* targets, bool train, uint64_t key,
                                    int64_t sample_offset, const void* stage_in, void* stage_out) {
  // Device times wait for their marks: read them when many are pending (about one step's
  // worth at most, long done by now), not at every micro-batch.
  if (impl_->dev_times.pending() > 4096) impl_->resolve_device_times();
  impl_->key = key;
  impl_->sample_offset = sample_offset;
  impl_->stage_in = stage_in;
  impl_->stage_out = stage_out;
  auto r = impl_->forward(tokens, targets, train);
  impl_->stage_in = nullptr;
  impl_->stage_out = nullptr;
  return r;
}

void Executor::backward(float dloss, const void* dstage_out, void* dstage_in) {
  impl_->backward(dloss, dstage_out, dstage_in);
}

void Executor::set_group(ReduceGroup* group) { impl_->group = group; }
void Executor::set_kv_cache(KvCache* cache) {
  if (cache) check_kernels(impl_->g, *impl_->be, false, true);  // the cache's kernels, before any step
  impl_->kv = cache;
}
void Executor::set_trace(std::vector<TraceEvent>* sink) { impl_->trace = sink; }
void Executor::set_grad_hook(std::function<void(int)> hook) { impl_->grad_hook = std::move(hook); }

const Tensor& Executor::forward_logits(const int32_t* tokens, const void* stage_in) {
  auto& m = *impl_;
  const Graph& g = m.g;
  m.release_all();
  m.train = false;
  if (g.tokens >= 0) {
    m.alloc(g.tokens, Account::Workspace);
    m.vals[g.tokens].write_from_host(tokens);  // the batch crossing in
  }
  if (g.stage_input >= 0) {
    if (!stage_in) throw std::logic_error("forward_logits of a pipeline stage needs its input activation");
    m.alloc(g.stage_input, Account::Workspace);
    m.be->copy(m.vals[g.stage_input].raw(), stage_in, g.tensors[g.stage_input].nbytes());
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
  impl_->resolve_device_times();
  std::vector<OpProfile> out;
  for (auto& p : impl_->prof)
    if (p.calls) out.push_back(p);
  return out;
}

void Executor::reset_profile() {
  impl_->resolve_device_times();
  for (auto& p : impl_->prof) { p.forward_ms = p.backward_ms = p.recompute_ms = 0; p.calls = 0; }
}

}  // namespace ops
