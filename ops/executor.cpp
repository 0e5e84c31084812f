// Graph executor (see executor.h). Forward walks the nodes in order, backward in
// reverse; a tensor is released when its last reader is done. One code path serves the
// real run and the dry run that predicts memory.
#include "ops/executor.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <stdexcept>

#include "ops/rng.h"

namespace ops {

namespace {
using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
}
constexpr int kKinds = static_cast<int>(OpKind::SoftmaxXent) + 1;
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
  std::vector<float> xent_stats;  // vocabulary-parallel cross-entropy: rowmax, sumexp, tlogit (3N floats)

  int tp_rank() const { return group ? group->rank() : 0; }

  // Sequence parallelism's full-sequence temporaries (workspace account). The dry run counts
  // the same bytes at the same moment (scratch_bytes), so the ledger predicts them.
  Tensor scratch(std::vector<int64_t> shape, bool zero) {
    return zero ? Tensor::zeros(std::move(shape), DType::F32, Account::Workspace)
                : Tensor::empty(std::move(shape), DType::F32, Account::Workspace);
  }
  size_t scratch_bytes(const Node& n, bool backward) const {
    if (g.sp_parts <= 1) return 0;
    const int64_t P = g.sp_parts;
    if (n.kind == OpKind::Embedding && n.scatter_output) return static_cast<size_t>(numel_of(g.tensors[n.out[0]].shape) * P) * 4;
    if (n.kind != OpKind::Linear) return 0;
    const TensorDesc& x = g.tensors[n.in[0]];
    const TensorDesc& y = g.tensors[n.out[0]];
    if (n.gather_input) return static_cast<size_t>(numel_of(x.shape) * (backward ? 2 * P + 1 : P)) * 4;
    if (n.scatter_output) return static_cast<size_t>(numel_of(y.shape) * P) * 4;
    return 0;
  }
  void count_scratch(const Node& n, bool backward) {
    size_t b = scratch_bytes(n, backward);
    if (!dry() || b == 0) return;
    count(Account::Workspace, static_cast<long long>(b));
    count(Account::Workspace, -static_cast<long long>(b));
  }
  // Dropout on a sequence shard: counters of this rank's rows of the micro-batch.
  DropoutSpec shard_drop(const Node& n, int64_t numel) const {
    if (!n.seq_shard) return drop_for(n, numel / g.B);
    DropoutSpec d = drop_for(n, numel * g.sp_parts / g.B);
    d.offset += static_cast<uint64_t>(g.sp_index) * static_cast<uint64_t>(numel);
    return d;
  }
  void allreduce(float* x, int64_t n) {
    if (group && group->size() > 1) group->allreduce_sum(x, n);
  }

  // Dry-run counters.
  std::array<size_t, kAccounts> cur{}, peak{};
  size_t peak_total = 0;

  std::array<OpProfile, kKinds> prof{};

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
    for (int k = 0; k < kKinds; ++k) prof[k].name = op_name(static_cast<OpKind>(k));
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
  float* grad_if_live(int id) { return glive[id] && !dry() ? grads[id].data<float>() : nullptr; }
  void release_grad(int id) {
    if (!glive[id]) return;
    glive[id] = 0;
    if (galias[id]) { galias[id] = 0; grads[id] = Tensor(); return; }
    if (dry()) count(Account::Workspace, -static_cast<long long>(g.tensors[id].nbytes()));
    else grads[id] = Tensor();
  }

  float* f(int id) {
    if (dry()) return nullptr;
    const TensorDesc& d = g.tensors[id];
    if (d.kind == TensorKind::Param) return pval[id]->data<float>();
    return vals[id].data<float>();
  }
  const int32_t* i32(int id) { return dry() ? nullptr : vals[id].data<int32_t>(); }

  Account out_account(int id) const {
    return (train && g.tensors[id].saved) ? Account::Activations : Account::Workspace;
  }

  DropoutSpec drop_for(const Node& n, int64_t per_sample) const {
    DropoutSpec d;
    d.p = train ? n.dropout : 0.0f;
    d.key = rng_key(key, n.site);
    d.offset = static_cast<uint64_t>(sample_offset * per_sample);
    return d;
  }

  // Attention dropout counters are those of the logical head in the whole model, so a head
  // shard draws the masks the unsharded model draws (ops/backend.h, DropoutSpec).
  DropoutSpec attention_drop(const Node& n, const TensorDesc& probs) const {
    int total = n.heads_total > 0 ? n.heads_total : n.heads;
    DropoutSpec d = drop_for(n, numel_of(probs.shape) / g.B / n.heads * total);
    d.heads_total = total;
    d.head_start = n.head_start;
    return d;
  }

  static int64_t rows(const TensorDesc& d) { return numel_of(d.shape) / d.shape.back(); }

  // Runs node n's forward kernel writing into `outs` (tensor pointers by output position).
  void kernel_forward(const Node& n, const std::vector<float*>& o) {
    if (dry()) return;
    if (n.tp != TpMode::None && !group)
      throw std::logic_error("node " + n.name + " is tensor-parallel: the executor needs a ReduceGroup (set_group)");
    const auto& in = n.in;
    const TensorDesc& x = g.tensors[in[0]];
    switch (n.kind) {
      case OpKind::Embedding: {
        int C = static_cast<int>(g.tensors[n.out[0]].shape.back());
        const float* wpe = in.size() > 2 ? f(in[2]) : nullptr;
        if (n.tp == TpMode::VocabEmbed) {  // each rank adds its vocabulary rows; wpe once
          const int64_t out_n = numel_of(g.tensors[n.out[0]].shape);
          Tensor full;
          float* dst = o[0];
          if (n.scatter_output) {  // sequence parallel: sum, and keep this rank's rows
            full = scratch({out_n * g.sp_parts}, false);
            dst = full.data<float>();
          }
          be->embedding_shard_forward(dst, i32(in[0]), f(in[1]), tp_rank() == 0 ? wpe : nullptr,
                                      static_cast<int>(g.B), static_cast<int>(g.T), C,
                                      static_cast<int>(n.vocab_start), static_cast<int>(g.tensors[in[1]].shape[0]));
          if (n.scatter_output) group->reduce_scatter_sum(dst, o[0], out_n);
          else allreduce(o[0], out_n);
        } else {
          be->embedding_forward(o[0], i32(in[0]), f(in[1]), wpe, static_cast<int>(g.B), static_cast<int>(g.T), C);
        }
        break;
      }
      case OpKind::LayerNorm:
        be->layernorm_forward(o[0], o[1], o[2], f(in[0]), f(in[1]), in.size() > 2 ? f(in[2]) : nullptr,
                              static_cast<int>(rows(x)), static_cast<int>(x.shape.back()), n.eps);
        break;
      case OpKind::RMSNorm:
        be->rmsnorm_forward(o[0], o[1], f(in[0]), f(in[1]), static_cast<int>(rows(x)),
                            static_cast<int>(x.shape.back()), n.eps);
        break;
      case OpKind::Linear: {
        const TensorDesc& w = g.tensors[in[1]];
        const int IC = static_cast<int>(w.shape[1]), OC = static_cast<int>(w.shape[0]);
        const float* bias = in.size() > 2 ? f(in[2]) : nullptr;
        const float* xin = f(in[0]);
        int64_t nrows = rows(x);
        Tensor xfull, yfull;
        if (n.gather_input) {  // sequence parallel: the whole sequence's input
          xfull = scratch({nrows * g.sp_parts, IC}, false);
          group->allgather(xin, xfull.data<float>(), numel_of(x.shape));
          xin = xfull.data<float>();
          nrows *= g.sp_parts;
        }
        if (n.scatter_output) {  // sequence parallel: partial sums reduce-scattered to this rank's rows
          yfull = scratch({nrows, OC}, false);
          be->matmul_forward(yfull.data<float>(), xin, f(in[1]), nullptr, static_cast<int>(nrows), IC, OC);
          const TensorDesc& y = g.tensors[n.out[0]];
          group->reduce_scatter_sum(yfull.data<float>(), o[0], numel_of(y.shape));
          if (bias)
            for (int64_t r = 0; r < rows(y); ++r) be->add_inplace(o[0] + r * OC, bias, OC);
          break;
        }
        bool row = n.tp == TpMode::Row;
        if (row && tp_rank() != 0) bias = nullptr;  // partial sums: the bias is added once
        be->matmul_forward(o[0], xin, f(in[1]), bias, static_cast<int>(nrows), IC, OC);
        if (row) allreduce(o[0], numel_of(g.tensors[n.out[0]].shape));
        break;
      }
      case OpKind::Rope:
        be->rope_forward(o[0], f(in[0]), static_cast<int>(g.B), static_cast<int>(g.T),
                         static_cast<int>(x.shape.back() / 3), n.heads, n.theta);
        break;
      case OpKind::Attention: {
        int C = static_cast<int>(x.shape.back() / 3);
        const TensorDesc& probs = g.tensors[n.out[1]];
        be->attention_forward(o[0], o[1], f(in[0]), static_cast<int>(g.B), static_cast<int>(g.T), C, n.heads,
                              attention_drop(n, probs));
        break;
      }
      case OpKind::Gelu: be->gelu_forward(o[0], f(in[0]), numel_of(x.shape)); break;
      case OpKind::SwiGLU:
        be->swiglu_forward(o[0], f(in[0]), static_cast<int>(rows(x)), static_cast<int>(x.shape.back() / 2));
        break;
      case OpKind::Add: be->add_forward(o[0], f(in[0]), f(in[1]), numel_of(x.shape)); break;
      case OpKind::Dropout:
        be->dropout_forward(o[0], f(in[0]), numel_of(x.shape), shard_drop(n, numel_of(x.shape)));
        break;
      case OpKind::SoftmaxXent: {
        float* probs = n.inplace ? f(in[0]) : o[1];
        int N = static_cast<int>(rows(x)), V = static_cast<int>(x.shape.back()), Vr = static_cast<int>(n.vocab_real);
        if (n.tp == TpMode::VocabXent) {
          xent_stats.resize(3 * static_cast<size_t>(N));
          float* mx = xent_stats.data();
          float* se = mx + N;
          float* tl = se + N;
          be->xent_shard_max(mx, f(in[0]), N, V, Vr);
          group->allreduce_max(mx, N);
          be->xent_shard_sumexp(se, tl, f(in[0]), mx, i32(in[1]), N, V, Vr, static_cast<int>(n.vocab_start));
          group->allreduce_sum(se, 2 * static_cast<int64_t>(N));  // sumexp and tlogit are adjacent
          be->xent_shard_finish(o[0], probs, f(in[0]), mx, se, tl, i32(in[1]), N, V, Vr);
        } else {
          be->softmax_xent_forward(o[0], probs, f(in[0]), i32(in[1]), N, V, Vr);
        }
        break;
      }
    }
  }

  void kernel_backward(const Node& n, float dloss) {
    const auto& in = n.in;
    const TensorDesc& x = g.tensors[in[0]];
    float* dout = n.kind == OpKind::SoftmaxXent ? nullptr : grad_if_live(n.out[0]);
    bool have_dout = n.kind == OpKind::SoftmaxXent || glive[n.out[0]];
    if (!have_dout) return;  // nothing downstream needed this output
    switch (n.kind) {
      case OpKind::Embedding: {
        float* dwte = grad(in[1]);
        float* dwpe = in.size() > 2 ? grad(in[2]) : nullptr;
        count_scratch(n, true);
        if (dry()) break;
        int C = static_cast<int>(g.tensors[n.out[0]].shape.back());
        Tensor dfull;
        if (n.scatter_output) {  // sequence parallel: the whole sequence's output gradient
          const int64_t out_n = numel_of(g.tensors[n.out[0]].shape);
          dfull = scratch({out_n * g.sp_parts}, false);
          group->allgather(dout, dfull.data<float>(), out_n);
          dout = dfull.data<float>();
        }
        if (n.tp == TpMode::VocabEmbed)
          be->embedding_shard_backward(dwte, dwpe, dout, i32(in[0]), static_cast<int>(g.B), static_cast<int>(g.T), C,
                                       static_cast<int>(n.vocab_start), static_cast<int>(g.tensors[in[1]].shape[0]));
        else
          be->embedding_backward(dwte, dwpe, dout, i32(in[0]), static_cast<int>(g.B), static_cast<int>(g.T), C);
        break;
      }
      case OpKind::LayerNorm: {
        float* dx = grad(in[0]);
        float* dw = grad(in[1]);
        float* db = in.size() > 2 ? grad(in[2]) : nullptr;
        if (dry()) break;
        be->layernorm_backward(dx, dw, db, dout, f(in[0]), f(in[1]), f(n.out[1]), f(n.out[2]),
                               static_cast<int>(rows(x)), static_cast<int>(x.shape.back()));
        break;
      }
      case OpKind::RMSNorm: {
        float* dx = grad(in[0]);
        float* dw = grad(in[1]);
        if (dry()) break;
        be->rmsnorm_backward(dx, dw, dout, f(in[0]), f(in[1]), f(n.out[1]), static_cast<int>(rows(x)),
                             static_cast<int>(x.shape.back()));
        break;
      }
      case OpKind::Linear: {
        const TensorDesc& w = g.tensors[in[1]];
        float* dx = x.kind == TensorKind::Activation ? grad(in[0]) : nullptr;
        float* dw = grad(in[1]);
        float* db = in.size() > 2 ? grad(in[2]) : nullptr;
        count_scratch(n, true);
        if (dry()) break;
        const int IC = static_cast<int>(w.shape[1]), OC = static_cast<int>(w.shape[0]);
        if (n.gather_input || n.scatter_output) {  // sequence parallel
          const float* xin = f(in[0]);
          const float* dy = dout;
          int64_t nrows = rows(x);
          Tensor xfull, dyfull, dxfull, dxpart;
          if (n.gather_input) {  // re-gather the input (only the shard was kept)
            xfull = scratch({nrows * g.sp_parts, IC}, false);
            group->allgather(xin, xfull.data<float>(), numel_of(x.shape));
            xin = xfull.data<float>();
            nrows *= g.sp_parts;
          }
          if (n.scatter_output) {
            const TensorDesc& y = g.tensors[n.out[0]];
            // This rank's rows' share of the bias gradient (the caller sums it over tp).
            if (db) be->matmul_backward(nullptr, nullptr, db, dout, xin, f(in[1]), static_cast<int>(rows(y)), IC, OC);
            db = nullptr;
            dyfull = scratch({rows(y) * g.sp_parts, OC}, false);
            group->allgather(dout, dyfull.data<float>(), numel_of(y.shape));
            dy = dyfull.data<float>();
          }
          float* dxf = dx;
          if (n.gather_input && dx) {
            dxfull = scratch({nrows, IC}, true);
            dxf = dxfull.data<float>();
          }
          be->matmul_backward(dxf, dw, db, dy, xin, f(in[1]), static_cast<int>(nrows), IC, OC);
          if (n.gather_input && dx) {  // reduce-scatter d(input) back to this rank's rows
            dxpart = scratch(x.shape, false);
            group->reduce_scatter_sum(dxfull.data<float>(), dxpart.data<float>(), numel_of(x.shape));
            be->add_inplace(dx, dxpart.data<float>(), numel_of(x.shape));
          }
          break;
        }
        be->matmul_backward(dx, dw, db, dout, f(in[0]), f(in[1]), static_cast<int>(rows(x)), IC, OC);
        // Column-parallel: each rank holds part of d(input); the input's only reader is this
        // node (a norm's output), so its gradient buffer holds exactly this sum's terms.
        if (n.tp == TpMode::Column && dx) allreduce(dx, numel_of(x.shape));
        break;
      }
      case OpKind::Rope: {
        float* dx = grad(in[0]);
        if (dry()) break;
        be->rope_backward(dx, dout, static_cast<int>(g.B), static_cast<int>(g.T),
                          static_cast<int>(x.shape.back() / 3), n.heads, n.theta);
        break;
      }
      case OpKind::Attention: {
        float* dx = grad(in[0]);
        if (dry()) break;
        const TensorDesc& probs = g.tensors[n.out[1]];
        be->attention_backward(dx, dout, f(in[0]), f(n.out[1]), static_cast<int>(g.B), static_cast<int>(g.T),
                               static_cast<int>(x.shape.back() / 3), n.heads, attention_drop(n, probs));
        break;
      }
      case OpKind::Gelu: {
        float* dx = grad(in[0]);
        if (!dry()) be->gelu_backward(dx, f(in[0]), dout, numel_of(x.shape));
        break;
      }
      case OpKind::SwiGLU: {
        float* dx = grad(in[0]);
        if (!dry())
          be->swiglu_backward(dx, dout, f(in[0]), static_cast<int>(rows(x)), static_cast<int>(x.shape.back() / 2));
        break;
      }
      case OpKind::Add: {
        float* da = grad(in[0]);
        float* db = grad(in[1]);
        if (!dry()) {
          be->add_inplace(da, dout, numel_of(x.shape));
          be->add_inplace(db, dout, numel_of(x.shape));
        }
        break;
      }
      case OpKind::Dropout: {
        float* dx = grad(in[0]);
        if (!dry()) be->dropout_backward(dx, dout, numel_of(x.shape), shard_drop(n, numel_of(x.shape)));
        break;
      }
      case OpKind::SoftmaxXent: {
        // dlogits overwrite the probabilities in place: the gradient aliases the value.
        int lg = in[0];
        glive[lg] = 1;
        galias[lg] = 1;
        if (!dry()) {
          grads[lg] = vals[lg];
          if (n.tp == TpMode::VocabXent)
            be->xent_shard_backward(grads[lg].data<float>(), f(lg), i32(in[1]), dloss, static_cast<int>(rows(x)),
                                    static_cast<int>(x.shape.back()), static_cast<int>(n.vocab_real),
                                    static_cast<int>(n.vocab_start));
          else
            be->softmax_xent_backward(grads[lg].data<float>(), f(lg), i32(in[1]), dloss, static_cast<int>(rows(x)),
                                      static_cast<int>(x.shape.back()), static_cast<int>(n.vocab_real));
        }
        break;
      }
    }
  }

  // Forward of node i: allocate its outputs, run it, release what is no longer needed.
  void forward_node(int i) {
    const Node& n = g.nodes[i];
    std::vector<float*> outs;
    for (int o : n.out) {
      alloc(o, out_account(o));
      outs.push_back(dry() || g.tensors[o].dtype != DType::F32 ? nullptr : vals[o].data<float>());
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

  void recompute_segment(int first, int last) {
    for (int j = first; j <= last; ++j) {
      const Node& n = g.nodes[j];
      std::vector<float*> outs;
      std::vector<int> scratch;
      std::vector<Tensor> scratch_vals;
      for (int o : n.out) {
        if (live[o]) {  // still alive from forward (read outside the segment): recompute into scratch
          const TensorDesc& d = g.tensors[o];
          if (dry()) { count(Account::Workspace, static_cast<long long>(d.nbytes())); outs.push_back(nullptr); }
          else { scratch_vals.push_back(Tensor::empty(d.shape, d.dtype, Account::Workspace)); outs.push_back(scratch_vals.back().data<float>()); }
          scratch.push_back(o);
        } else {
          alloc(o, Account::Activations);
          outs.push_back(dry() ? nullptr : vals[o].data<float>());
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
    release(g.losses);
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
