// The kernel interface: forward and backward of every operator, side by side.
//
// ops/cpu/ implements it now (OpenBLAS + OpenMP); ops/cuda/ will implement the same
// interface. Callers never know which one runs. Pointers are to contiguous row-major
// fp32 buffers on the backend's device.
//
// Shape letters: B batch, T sequence, C channels, V vocabulary, NH heads, HS = C/NH
// head size, N = B*T rows, OC output channels, H hidden width.
//
// Gradient convention (written once, here): every backward ACCUMULATES (+=) into every
// gradient it produces, parameter and activation gradients alike (unlike llm.c, where
// activation gradients are overwritten), so that micro-batches add up and a tensor read by
// several operators sums its gradients. The caller zeroes gradient buffers before the first
// use. There are two exceptions, both the loss, which starts the backward chain: its dlogits
// are OVERWRITTEN (=), because they are written over the probabilities they are computed from
// (dlogits may alias probs; the executor passes the logits' own buffer):
//   softmax_xent_backward   (the unsharded cross-entropy)
//   xent_shard_backward     (the vocabulary-parallel one)
// A null gradient pointer means "not needed": skip that work. [i29: fused] One kernel writes
// over an input: linear_gelu_backward turns its d(out) into d(pre) in place (the caller's
// d(out) is dead after it; ops/ops.h, OpDef::consumes_dout), and add_layernorm_backward /
// add_rmsnorm_backward turn their d(sum) into the total d(sum) in place the same way.
#pragma once
#include <cstdint>
#include <stdexcept>

#include "ops/tensor.h"

namespace ops {

struct DropoutSpec {
  float p = 0.0f;    // drop probability; 0 disables dropout
  uint64_t key = 0;  // counter-based RNG key (ops/rng.h)
  uint64_t offset = 0;  // element i of the buffer keeps iff rng_uniform(key, offset + i) >= p; the offset
                        // places a micro-batch inside the global batch so masks do not depend on the layout
  // Attention only, for tensor parallelism: this call computes heads [head_start, head_start + NH)
  // of a model with heads_total heads (0: NH, i.e. all of them), and the mask counter of
  // (b, h, t, s) is offset + ((b*heads_total + head_start + h)*T + t)*T + s, the counter the
  // unsharded model uses for that logical head. `offset` is then in units of the full model's
  // probabilities (sample_index * heads_total * T * T).
  int heads_total = 0;
  int head_start = 0;
};

// The heads of one attention call. Grouped-query attention (Ainslie et al. 2023, "GQA"):
// `q` query heads share `kv` key-value heads, and a packed qkv row is
// [q: q*HS | k: kv*HS | v: kv*HS] (kv == q: multi-head attention; kv == 1: multi-query).
// Query head h reads key-value head (first + h) / group. group is the model's query heads per
// key-value head; first is 0 except under tensor parallelism with replicated key-value heads
// (tp does not divide them: every rank holds all of them, and its query heads start at model
// head `first`). An int converts to full multi-head attention over that many heads.
struct Heads {
  int q = 0;
  int kv = 0;
  int group = 1;
  int first = 0;
  constexpr Heads() = default;
  constexpr Heads(int NH) : q(NH), kv(NH) {}  // NOLINT: implicit on purpose (an int is NH full heads)
  constexpr Heads(int NH, int NKV, int group_, int first_ = 0) : q(NH), kv(NKV), group(group_), first(first_) {}
  // NH query heads over NKV key-value heads, the whole model's (no tensor-parallel shard).
  static constexpr Heads grouped(int NH, int NKV) { return Heads(NH, NKV, NKV > 0 ? NH / NKV : 1, 0); }
  constexpr int kv_of(int h) const { return (first + h) / group; }
  // Query heads [h0, h1) of this call read key-value head j.
  constexpr int q_begin(int j) const { return j * group - first < 0 ? 0 : j * group - first; }
  constexpr int q_end(int j) const { return (j + 1) * group - first > q ? q : (j + 1) * group - first; }
  // Whether every query head maps into [0, kv) (the shapes a kernel checks first).
  constexpr bool valid() const {
    return q > 0 && kv > 0 && group > 0 && first >= 0 && kv_of(0) >= 0 && kv_of(q - 1) < kv;
  }
};

// One layer's KV cache as the kernels see it (ops/kv_cache.h owns the storage): K and V of
// `rows` sequences x `context` positions x NKV*HS channels (this rank's key-value heads, head
// j owning channels [j*HS, (j+1)*HS)), row-major (row, position, channel), stored in `dtype`:
//   F32, BF16, F16  the values (16-bit ones rounded to nearest even);
//   I8              codes q = round(x / scale) in [-127, 127] with one fp32 scale per (row,
//                   position, head), scale = max|x| / 127 over that head's HS channels (0 for
//                   an all-zero head); x is read back as q * scale. k_scale, v_scale: (rows,
//                   context, NKV).
struct KvView {
  void* k = nullptr;
  void* v = nullptr;
  float* k_scale = nullptr;
  float* v_scale = nullptr;
  DType dtype = DType::F32;
  int64_t context = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;

  // ---- The backend's memory and its queue (issue 26: tensors owned by the backend) ----
  // Tensor storage (ops/tensor.h) comes from here. On the CPU it is host memory and every call
  // runs at once; on a GPU (and on the strict CPU device, ops/strict/) it is device memory that
  // host code must never dereference, and the calls below are queued in order with the kernels.
  // These defaults are the host's: the CPU backend uses them as they are.
  //
  // Whether host code may read and write this backend's memory directly.
  virtual bool host_memory() const { return true; }
  // `bytes` of memory (64-byte aligned, uninitialised; cached by size and reused); mem_free
  // returns it after every queued use (stream order), so the block may be handed out again.
  virtual void* mem_alloc(size_t bytes);
  virtual void mem_free(void* p, size_t bytes);
  // Queued: p[0, bytes) := 0.
  virtual void mem_zero(void* p, size_t bytes);
  // Queued device-to-device copy (the ranges do not overlap).
  virtual void copy(void* dst, const void* src, size_t bytes);
  // The crossings (host <-> device), each queued after the kernels before it. copy_in reads
  // `src` before it returns (the host buffer may be reused at once). copy_out's `dst` holds the
  // bytes only after synchronize(): before that it holds anything (the strict device fills it
  // with a poison pattern, so a read that forgot to wait gives wrong numbers, not lucky ones).
  virtual void copy_in(void* dst, const void* src, size_t bytes);
  virtual void copy_out(void* dst, const void* src, size_t bytes);
  // Waits for every queued call; rethrows the first error a queued kernel raised.
  virtual void synchronize() {}

  // ---- Generic kernels over any storage dtype (issue 26: no host loop over tensor memory) ----
  // dst[i] = src[i] converted (fp32 <-> bf16/fp16 round to nearest even; same dtype: a copy).
  // Only F32, BF16 and F16.
  virtual void convert(void* dst, DType dt, const void* src, DType st, int64_t n);
  // dst[i] = round_dt(dst[i] + src[i]): fp32 src accumulated into a dst of dtype dt.
  virtual void accumulate(void* dst, DType dt, const float* src, int64_t n);
  // Sum of squares in double of x (dtype t: F32, BF16, F16); NaN or inf when x holds one.
  virtual double sum_squares_typed(const void* x, DType t, int64_t n);
  // x[i] = v (fp32), for a tensor of dtype t.
  virtual void fill(void* x, DType t, float v, int64_t n);
  // Issue 26, room by room: new kernels go under the marker of their room, here and in every
  // backend (ops/cpu/cpu_backend.cpp, ops/strict/strict_backend.cpp, ops/cuda/cuda_backend.cu).
  // [i26: ops step path]
  // AdamW's hyperparameters for one call of adamw_update_typed (adamw_update's, gathered).
  struct AdamwArgs {
    float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
    int64_t t = 1;          // bias-correction step, >= 1
    float grad_scale = 1;   // the gradient is multiplied by it first (clipping, 1 / loss scale)
  };
  // AdamW over one parameter range as the run stores it, so that the optimizer never widens
  // on the host: `param` holds n values of dtype pt and `grad` n of dtype gt (F32, BF16, F16;
  // a 16-bit gradient is widened to fp32). With `master` (n fp32 master weights) the update is
  // applied to the master and param := round_pt(master); without, to param itself (a 16-bit one
  // widened, updated in fp32 and rounded back). m, v: the fp32 moments (n each). The host
  // default updates fp32-only ranges in one adamw_update call and the others in pieces of 2^14
  // through fp32 buffers, the arithmetic runner's optimizer always had (bit for bit).
  virtual void adamw_update_typed(void* param, DType pt, const void* grad, DType gt, float* master, float* m,
                                  float* v, int64_t n, const AdamwArgs& a);
  // [i29: optimizer]
  // adamw_update_typed, then grad[0, n) := 0 (dtype gt): the optimizer step and the gradient
  // zeroing for the next step in one call, so a backend can do both in one pass over memory
  // (the CPU's: ops/cpu/adamw.h; same bits as the two calls, on any thread count). Default:
  // the two calls, queued in order (what ops/cuda/ runs).
  virtual void adamw_update_zero_grad(void* param, DType pt, void* grad, DType gt, float* master, float* m,
                                      float* v, int64_t n, const AdamwArgs& a);
  // [i26: parallel]
  // [i26: train and checkpoint]
  // Staging for checkpoints and the rollback snapshot (runner/checkpoint/staging.h): the host
  // buffers parameters and optimizer state are copied out into. alloc_pinned gives host memory
  // the device copies to at full speed without holding up its queue (page-locked on CUDA; the
  // host's block cache by default); host code may read it, once the copy has been waited for.
  virtual void* alloc_pinned(size_t bytes);
  virtual void free_pinned(void* p, size_t bytes);
  // copy_out on the device's side queue (a copy stream on CUDA), for an asynchronous save: it
  // sees every call queued before it; later calls that write `src` wait for it on the device,
  // not on the host. `dst` holds the bytes only after stage_wait() of a fence taken after it
  // (before that, anything: the strict device fills it with poison). Host default: a memcpy.
  virtual void stage_out(void* dst, const void* src, size_t bytes);
  // A point on the side queue after every stage_out so far, and the wait for it: any thread
  // (the checkpoint writer's) may wait, and waits only for the staged copies, not for the
  // kernels queued since; a fence is waited for once. Throws when the copies did not run.
  virtual uint64_t stage_fence() { return 0; }
  virtual void stage_wait(uint64_t fence) {}
  // [i29: native16] 16-bit-native memory-bound kernels (ops/cpu/native16.h). The activations
  // (inputs, outputs and their gradients) are stored in t (BF16 or F16) and read and written as
  // such; parameters, parameter gradients and per-row statistics stay fp32, except the
  // parameters an entry point takes as `const void*` (stored in t: OpDef::native16_stored).
  // Each computes, bit for bit, what the executor's widened path computes: widen to fp32, the
  // fp32 kernel above, round the output to t; an activation gradient d (stored in t) becomes
  // RNE_t(d + g), g the fp32 kernel's gradient accumulated into zeros (accumulate()'s
  // rounding). Only where native16_available(t); the executor checks it and widens otherwise.
  virtual bool native16_available(DType t) { return false; }
  // wte (V,C) and wpe (maxT,C) or null are stored in t: only the rows the tokens and positions
  // name are read and widened (out = RNE_t(wte[token] + wpe[t]) summed in fp32, as the widened
  // path does).
  virtual void embedding_forward16(void* out, DType t, const int32_t* tokens, const void* wte, const void* wpe,
                                   int B, int T, int C);
  virtual void embedding_backward16(float* dwte, float* dwpe, const void* dout, DType t, const int32_t* tokens,
                                    int B, int T, int C);
  virtual void layernorm_forward16(void* out, float* mean, float* rstd, const void* inp, const float* weight,
                                   const float* bias, DType t, int N, int C, float eps);
  virtual void layernorm_backward16(void* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                                    const float* weight, const float* mean, const float* rstd, DType t, int N,
                                    int C);
  virtual void rmsnorm_forward16(void* out, float* rstd, const void* inp, const float* weight, DType t, int N,
                                 int C, float eps);
  virtual void rmsnorm_backward16(void* dinp, float* dweight, const void* dout, const void* inp,
                                  const float* weight, const float* rstd, DType t, int N, int C);
  virtual void rope_forward16(void* out, const void* inp, DType t, int B, int T, int C, Heads heads, float theta);
  virtual void rope_backward16(void* dinp, const void* dout, DType t, int B, int T, int C, Heads heads,
                               float theta);
  virtual void gelu_forward16(void* out, const void* inp, DType t, int64_t n);
  virtual void gelu_backward16(void* dinp, const void* inp, const void* dout, DType t, int64_t n);
  virtual void swiglu_forward16(void* out, const void* inp, DType t, int N, int H);
  virtual void swiglu_backward16(void* dinp, const void* dout, const void* inp, DType t, int N, int H);
  virtual void add_forward16(void* out, const void* a, const void* b, DType t, int64_t n);
  // dst := RNE_t(dst + (0 + src)): add_inplace into a zeroed fp32 copy, then accumulated.
  virtual void add_inplace16(void* dst, const void* src, DType t, int64_t n);
  virtual void dropout_forward16(void* out, const void* inp, DType t, int64_t n, DropoutSpec drop);
  virtual void dropout_backward16(void* dinp, const void* dout, DType t, int64_t n, DropoutSpec drop);
  // Causal self-attention (attention_forward / attention_backward below) on a 16-bit qkv (B,T,W),
  // out (B,T,C) and dout, dqkv in t; lse (B,NH,T) and `work` stay fp32. dqkv gets one fold per
  // element, RNE_t(dqkv + g), g what attention_backward accumulates into a zeroed fp32 buffer
  // (for a key-value head: its group's sum in query-head order).
  virtual void attention_forward16(void* out, float* lse, const void* qkv, DType t, int B, int T, int C,
                                   Heads heads, DropoutSpec drop);
  virtual void attention_backward16(void* dqkv, const void* dout, const void* qkv, const float* lse, DType t,
                                    int B, int T, int C, Heads heads, DropoutSpec drop, float* work);
  // [i26: generate and export]
  // [i26: attention]

  // Token (+ optional learned position) embedding.
  // out: (B,T,C) = wte[tokens[b,t]] + (wpe ? wpe[t] : 0)   (overwritten)
  // tokens: (B,T) int32, wte: (V,C), wpe: (maxT,C) or null
  virtual void embedding_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                 int B, int T, int C) = 0;
  // dwte: (V,C) +=, dwpe: (maxT,C) += (either may be null), dout: (B,T,C)
  virtual void embedding_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                  int B, int T, int C) = 0;
  // Vocabulary-parallel embedding (tensor parallelism): wte holds rows [vstart, vstart+Vlocal) of
  // the full table. A token inside that range contributes its row; a token outside contributes
  // zeros (forward) and nothing (backward). The caller all-reduces `out` over the group, passing
  // wpe on exactly one rank, and passes dwpe on every rank (dout is replicated).
  virtual void embedding_shard_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe,
                                       int B, int T, int C, int vstart, int Vlocal) = 0;
  virtual void embedding_shard_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens,
                                        int B, int T, int C, int vstart, int Vlocal) = 0;

  // LayerNorm over the last dimension. out: (N,C) overwritten; mean, rstd: (N) saved for backward.
  virtual void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                 const float* bias, int N, int C, float eps) = 0;
  virtual void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                                  const float* weight, const float* mean, const float* rstd, int N, int C) = 0;

  // RMSNorm: out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps). rstd: (N) saved.
  virtual void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                               float eps) = 0;
  virtual void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp,
                                const float* weight, const float* rstd, int N, int C) = 0;

  // Linear: out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias(OC) (bias may be null). Overwrites out.
  virtual void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                              int OC) = 0;
  // dinp (N,C) +=, dweight (OC,C) +=, dbias (OC) +=; dout (N,OC).
  virtual void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                               const float* weight, int N, int C, int OC) = 0;

  // Linear over 16-bit operands as stored: inp, weight, bias and dout hold dtype t (BF16 or
  // F16), products accumulate in fp32, and the outputs are fp32 with matmul_forward's and
  // matmul_backward's contract (out overwritten; dinp, dweight, dbias +=). Only where
  // matmul16_available(t); whether it is used is ops/gemm_path.h's measured choice.
  virtual bool matmul16_available(DType t) { return false; }
  virtual void matmul16_forward(float* out, const void* inp, const void* weight, const void* bias, DType t, int N,
                                int C, int OC) {
    throw std::logic_error(std::string(name()) + " backend: no 16-bit matmul");
  }
  virtual void matmul16_backward(float* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                                 const void* weight, DType t, int N, int C, int OC) {
    throw std::logic_error(std::string(name()) + " backend: no 16-bit matmul");
  }

  // Rotary position embedding on the q and k heads of a packed qkv tensor (B,T,W), W =
  // (NH + 2 NKV) HS, C = NH*HS (the query channels; Heads above); v is copied.
  // "rotate half" convention (GPT-NeoX / LLaMA): for head channel i < HS/2, with
  // f_i = theta^(-2i/HS) and angle a = t*f_i: out[i] = x[i]cos a - x[i+HS/2]sin a,
  // out[i+HS/2] = x[i+HS/2]cos a + x[i]sin a.
  virtual void rope_forward(float* out, const float* inp, int B, int T, int C, Heads heads, float theta) = 0;
  virtual void rope_backward(float* dinp, const float* dout, int B, int T, int C, Heads heads, float theta) = 0;

  // Causal self-attention over packed qkv (B,T,W) = [q | k | v] per token, W = (NH + 2 NKV) HS,
  // C = NH*HS; query head h owns channels [h*HS, (h+1)*HS) of q and reads key-value head
  // j = heads.kv_of(h), channels [j*HS, (j+1)*HS) of k and of v. Scores scaled by 1/sqrt(HS).
  // Neither call keeps the (T,T) probabilities (issue 26: flash-style, Dao et al. 2022): the
  // forward computes them block by block and saves one number per query row, the backward
  // recomputes the scores by blocks from q and k.
  // out: (B,T,C) overwritten. lse: (B,NH,T) fp32 overwritten, the natural log-sum-exp of row t's
  // scaled causal scores, lse[t] = log(sum_{s<=t} exp(score[t][s])), so that the probabilities
  // (before dropout) are P[t][s] = exp(score[t][s] - lse[t]). Dropout on P uses drop.key with
  // counter = offset + ((b*NH + h)*T + t)*T + s (heads_total/head_start: the global head, see
  // DropoutSpec), drawn in the forward and regenerated in the backward, never stored.
  virtual void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, Heads heads,
                                 DropoutSpec drop) = 0;
  // dqkv: (B,T,W) +=. dout: (B,T,C). lse: the forward's, with the same qkv and drop. A backend
  // may use lse to recompute P = exp(score - lse) (the GPU's) or recompute the row statistics
  // exactly as its forward did (the CPU's, so that its probabilities, and so its gradients, are
  // bit-identical to those of a kernel that stored them). The gradient of a key-value head
  // sums over the query heads that read it. `work`: (B,NH,T,2HS) floats when heads.group > 1 (a
  // backend that sums the group otherwise, e.g. with atomics, may ignore it;
  // attention_backward_work says how much); null otherwise.
  virtual void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B,
                                  int T, int C, Heads heads, DropoutSpec drop, float* work = nullptr) = 0;
  // Floats of attention_backward's `work` (the same on every backend, so that the plan's
  // dry run and every device count the same workspace).
  static int64_t attention_backward_work(int B, int T, int C, Heads heads) {
    return heads.group > 1 ? static_cast<int64_t>(B) * T * C * 2 : 0;
  }

  // The KV cache (generation; forward only, nothing to differentiate).
  // Prefill: K and V of qkv (B,T,W) (after rope, as the attention reads them) into positions
  // [0, T) of rows [0, B) of the cache.
  virtual void kv_cache_write(KvView kv, const float* qkv, int B, int T, int C, Heads heads) {
    throw std::logic_error(std::string(name()) + " backend: no KV cache");
  }
  // Decode, one new token per row: qkv (B,W) holds row b's token at position pos[b]. With
  // theta > 0 its q and k are first rotated at pos[b] (rope_forward's convention and angles);
  // k and v are stored at pos[b], then out (B,C) = attention of q over the cache's positions
  // [0, pos[b]] of row b (scale 1/sqrt(HS), causal by construction, no dropout).
  virtual void attention_decode(float* out, const float* qkv, KvView kv, const int32_t* pos, int B, int C,
                                Heads heads, float theta) {
    throw std::logic_error(std::string(name()) + " backend: no KV cache");
  }

  // GELU, tanh approximation (GPT-2's gelu_new; PyTorch GELU(approximate="tanh")).
  virtual void gelu_forward(float* out, const float* inp, int64_t n) = 0;
  virtual void gelu_backward(float* dinp, const float* inp, const float* dout, int64_t n) = 0;

  // [i29: fused] Linear + bias + GELU in one call: the MLP's fc and its activation (fp32).
  // pre (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (bias may be null), kept for the backward;
  // out (N,OC) = gelu(pre). Both overwritten. The operations of matmul_forward then
  // gelu_forward in their order (the bias before the GEMM's sums, as matmul_forward adds it),
  // so out and pre are bit-identical to the unfused pair's.
  virtual void linear_gelu_forward(float* out, float* pre, const float* inp, const float* weight, const float* bias,
                                   int N, int C, int OC);
  // [i29: fused] dpre (N,OC) holds d(out) on entry and d(pre) = d(out) * gelu'(pre) on return
  // (OVERWRITTEN in place: the caller's d(out) is dead after the call, so no second (N,OC)
  // buffer). dbias (OC) += colsum(d(pre)), dinp (N,C) += d(pre) @ weight, dweight (OC,C) +=
  // d(pre)^T @ inp (null: skip). Bit-identical to gelu_backward into a zeroed buffer then
  // matmul_backward. This host default composes those calls through a temporary (N,OC)
  // buffer the ledger does not count: a backend overrides it (the CPU's, the strict device's).
  virtual void linear_gelu_backward(float* dinp, float* dweight, float* dbias, float* dpre, const float* pre,
                                    const float* inp, const float* weight, int N, int C, int OC);

  // [i29: fused] A residual add and the norm of its sum in one call (AddNorm, ops/op_fused.cpp).
  // Activations (a, b, sum, out and their gradients) are stored in t: F32, or BF16/F16 as on
  // the 16-bit-native path (native16_available(t)); weight, bias, their gradients, mean and
  // rstd are fp32 as always. sum (N,C) = a + b (rounded to t), out (N,C) = the norm of the
  // stored (rounded) sum, mean/rstd (N) saved: the bits of add_forward then layernorm_forward
  // (or their *16 forms). Backward: dsum (N,C) holds d(sum) from downstream on entry and the
  // total d(sum) + norm-backward(dout) on return (OVERWRITTEN in place: the caller's buffer is
  // dead after the call); da, db (N,C) += that total (null: skip); dweight, dbias +=. The bits
  // of layernorm_backward accumulating into dsum then two add_inplace (or their *16 forms).
  // These host defaults are those compositions; the CPU fuses them into one pass over rows.
  virtual void add_layernorm_forward(void* sum, void* out, float* mean, float* rstd, const void* a, const void* b,
                                     const float* weight, const float* bias, DType t, int N, int C, float eps);
  virtual void add_layernorm_backward(void* da, void* db, float* dweight, float* dbias, void* dsum, const void* dout,
                                      const void* sum, const float* weight, const float* mean, const float* rstd,
                                      DType t, int N, int C);
  virtual void add_rmsnorm_forward(void* sum, void* out, float* rstd, const void* a, const void* b,
                                   const float* weight, DType t, int N, int C, float eps);
  virtual void add_rmsnorm_backward(void* da, void* db, float* dweight, void* dsum, const void* dout, const void* sum,
                                    const float* weight, const float* rstd, DType t, int N, int C);

  // SwiGLU: inp (N, 2H) = [gate | up]; out (N,H) = silu(gate) * up.
  virtual void swiglu_forward(float* out, const float* inp, int N, int H) = 0;
  virtual void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int H) = 0;

  // out = a + b (out may alias a or b). Its backward is two add_inplace calls.
  virtual void add_forward(float* out, const float* a, const float* b, int64_t n) = 0;
  // dst += src
  virtual void add_inplace(float* dst, const float* src, int64_t n) = 0;

  // Inverted dropout: out = inp * keep(i) / (1-p), keep(i) = rng_uniform(key, offset + i) >= p.
  virtual void dropout_forward(float* out, const float* inp, int64_t n, DropoutSpec drop) = 0;
  virtual void dropout_backward(float* dinp, const float* dout, int64_t n, DropoutSpec drop) = 0;

  // Softmax cross-entropy fused. logits: (N,V), the first Vreal columns are real (the rest is
  // padding and is ignored). targets: (N) int32, a negative target means "ignore this row"
  // (loss 0, gradient 0). losses: (N) per-row loss. probs: (N,V) softmax output (may alias logits).
  virtual void softmax_xent_forward(float* losses, float* probs, const float* logits, const int32_t* targets, int N,
                                    int V, int Vreal) = 0;
  // dlogits (N,V) OVERWRITTEN (may alias probs) = (probs - onehot(target)) * dloss; padding columns 0.
  virtual void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N,
                                     int V, int Vreal) = 0;

  // Vocabulary-parallel softmax cross-entropy (Megatron), never gathering the logits. This rank
  // holds columns [vstart, vstart+V) of the full (N, Vfull) logits, of which its first Vreal are
  // real (Vreal may be 0 for a shard that is all padding). Targets are full-vocabulary ids.
  // Phase 1: rowmax[r] = max over this shard's real columns (-inf when Vreal == 0).
  //   The caller all-reduces rowmax with MAX.
  virtual void xent_shard_max(float* rowmax, const float* logits, int N, int V, int Vreal) = 0;
  // Phase 2: sumexp[r] = sum over real columns of exp(logit - rowmax[r]);
  //   tlogit[r] = logits[r, targets[r] - vstart] - rowmax[r] when the target is in this shard, else 0.
  //   The caller all-reduces sumexp and tlogit with SUM.
  virtual void xent_shard_sumexp(float* sumexp, float* tlogit, const float* logits, const float* rowmax,
                                 const int32_t* targets, int N, int V, int Vreal, int vstart) = 0;
  // Phase 3: probs = exp(logit - rowmax) / sumexp on real columns, 0 on padding (probs may alias
  // logits); losses[r] = log(sumexp[r]) - tlogit[r], 0 for a negative target.
  virtual void xent_shard_finish(float* losses, float* probs, const float* logits, const float* rowmax,
                                 const float* sumexp, const float* tlogit, const int32_t* targets, int N, int V,
                                 int Vreal) = 0;
  // dlogits (N,V) OVERWRITTEN (may alias probs) = (probs - onehot(target - vstart)) * dloss; rows
  // with a negative target and padding columns get 0.
  virtual void xent_shard_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N,
                                   int V, int Vreal, int vstart) = 0;

  // AdamW (Loshchilov & Hutter 2019), decoupled weight decay, bias correction with step t >= 1.
  // grad is multiplied by grad_scale first (clipping, loss-scale removal).
  // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mhat = m/(1-b1^t); vhat = v/(1-b2^t);
  // param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param)
  virtual void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, int64_t t, float grad_scale) = 0;

  // Sum of squares in double (for the global gradient norm).
  virtual double sum_squares(const float* x, int64_t n) = 0;
  virtual void scale(float* x, int64_t n, float s) = 0;
};

// The CPU backend (OpenBLAS + OpenMP). Thread count comes from OpenMP (OMP_NUM_THREADS
// or set_num_threads()).
Backend& cpu_backend();
void set_num_threads(int n);
int num_threads();

}  // namespace ops
