// The kernels: one enum value and one argument struct per kernel, the forward and backward of
// every operator side by side. A backend (ops/backend.h) holds a table of entries keyed by
// (Kernel, DType) and callers run an entry with its struct: be.run(k::LayerNormForward(...), t).
//
// Shape letters: B batch, T sequence, C channels, V vocabulary, NH heads, HS = C/NH
// head size, N = B*T rows, OC output channels, H hidden width.
//
// Pointers are to contiguous row-major buffers on the backend's device. An activation pointer
// is `void*` / `const void*` where the kernel has entries for several dtypes: the F32 entry
// reads and writes fp32, the BF16 and F16 entries (the 16-bit-native kernels, below) the
// 16-bit storage. Parameters, parameter gradients and per-row statistics stay `float*`.
//
// Gradient convention (written once, here): every backward ACCUMULATES (+=) into every
// gradient it produces, parameter and activation gradients alike (unlike llm.c, where
// activation gradients are overwritten), so that micro-batches add up and a tensor read by
// several operators sums its gradients. The caller zeroes gradient buffers before the first
// use. There are two exceptions, both the loss, which starts the backward chain: its dlogits
// are OVERWRITTEN (=), because they are written over the probabilities they are computed from
// (dlogits may alias probs; the executor passes the logits' own buffer):
//   SoftmaxXentBackward   (the unsharded cross-entropy)
//   XentShardBackward     (the vocabulary-parallel one)
// A null gradient pointer means "not needed": skip that work. The fused kernels write over an
// input to save an (N, OC) buffer: LinearGeluBackward turns its d(out) into d(pre) in place
// (the caller's d(out) is dead after it; ops/ops.h, OpDef::consumes_dout), and
// AddLayerNormBackward / AddRmsNormBackward turn their d(sum) into the total d(sum) in place
// the same way.
//
// The 16-bit-native entries, (K, BF16) and (K, F16) of the memory-bound kernels
// (ops/cpu/native16.h): the activations (inputs, outputs and their gradients) are stored in t
// and read and written as such; parameters, parameter gradients and per-row statistics stay
// fp32, except the parameters an entry takes as `const void*` (stored in t:
// OpDef::native16_stored). Each computes, bit for bit, what the executor's widened path
// computes: widen to fp32, the F32 entry, round the output to t; an activation gradient d
// (stored in t) becomes RNE_t(d + g), g the F32 entry's gradient accumulated into zeros
// (Accumulate's rounding). Only where native16_available(be, t) (ops/backend.h); the executor
// checks it and widens otherwise.
//
// Each struct's `pointers(f)` calls f on every device pointer field, by reference (the strict
// device rewrites them into its arena's kernel view). A kernel that returns a value to the
// host writes it through a host pointer that `pointers` does not visit, and says
// `kToHost = true`, so that a queued device waits for it.
#pragma once
#include <cstdint>
#include <tuple>

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
  template <class F> void pointers(F&& f) { f(k), f(v), f(k_scale), f(v_scale); }
};

// AdamW's hyperparameters for one AdamwUpdateTyped / AdamwUpdateZeroGrad call (AdamwUpdate's,
// gathered).
struct AdamwArgs {
  float lr = 0, beta1 = 0, beta2 = 0, eps = 0, weight_decay = 0;
  int64_t t = 1;          // bias-correction step, >= 1
  float grad_scale = 1;   // the gradient is multiplied by it first (clipping, 1 / loss scale)
};

// The pointwise activations of an ungated MLP (model.activation), as X(Name, stem). Each has
// a NameForward and a NameBackward kernel of one form (below), and each backend builds both
// entries (the CPU's 16-bit-native ones too) from its own formula, named by the stem: the
// CPU's stem_f and stem_grad_f (ops/cpu/vecmath.h), CUDA's stem_d and stem_grad_d. An
// activation is a line here and its formula in each backend.
//   Gelu   GELU, tanh approximation (GPT-2's gelu_new; PyTorch GELU(approximate="tanh")).
//   Relu2  squared ReLU (Primer, So et al. 2021): relu(x)^2, d(inp) += d(out) * 2 relu(x). A
//          NaN input gives NaN both ways (not 0), so the loss scaler still sees an overflow.
#define OPS_ACTIVATIONS(X) X(Gelu, gelu) X(Relu2, relu2)

enum class Kernel : int {
  Convert, Accumulate, SumSquaresTyped, Fill, AdamwUpdateTyped, AdamwUpdateZeroGrad,
  EmbeddingForward, EmbeddingBackward, EmbeddingShardForward, EmbeddingShardBackward,
  LayerNormForward, LayerNormBackward, RmsNormForward, RmsNormBackward,
  MatmulForward, MatmulBackward, RopeForward, RopeBackward,
  AttentionForward, AttentionBackward, KvCacheWrite, AttentionDecode,
  LinearGeluForward, LinearGeluBackward,
  AddLayerNormForward, AddLayerNormBackward, AddRmsNormForward, AddRmsNormBackward,
  SwigluForward, SwigluBackward, AddForward, AddInplace, DropoutForward, DropoutBackward,
  SoftmaxXentForward, SoftmaxXentBackward, XentShardMax, XentShardSumexp, XentShardFinish, XentShardBackward,
  AdamwUpdate, SumSquares, Scale,
#define OPS_ACTIVATION_IDS(A, a) A##Forward, A##Backward,
  OPS_ACTIVATIONS(OPS_ACTIVATION_IDS)
#undef OPS_ACTIVATION_IDS
  Count_
};
constexpr int kKernelCount = static_cast<int>(Kernel::Count_);

namespace k {

#define OPS_KERNEL_(K, to_host)               \
  static constexpr Kernel id = Kernel::K;     \
  static constexpr const char* name = #K;     \
  static constexpr bool kToHost = to_host
#define OPS_KERNEL(K) OPS_KERNEL_(K, false)

// ---- Generic kernels over any storage dtype (no host loop over tensor memory) ----
// Their dtypes are fields: the entry is (K, F32) whatever the storage.

// dst[i] = src[i] converted (fp32 <-> bf16/fp16 round to nearest even; same dtype: a copy).
// Only F32, BF16 and F16.
struct Convert {
  OPS_KERNEL(Convert);
  void* dst; DType dt; const void* src; DType st; int64_t n;
  template <class F> void pointers(F&& f) { f(dst), f(src); }
};
// dst[i] = round_dt(dst[i] + src[i]): fp32 src accumulated into a dst of dtype dt.
struct Accumulate {
  OPS_KERNEL(Accumulate);
  void* dst; DType dt; const float* src; int64_t n;
  template <class F> void pointers(F&& f) { f(dst), f(src); }
};
// *result = sum of squares in double of x (dtype t: F32, BF16, F16); NaN or inf when x holds
// one. `result` is host memory.
struct SumSquaresTyped {
  OPS_KERNEL_(SumSquaresTyped, true);
  const void* x; DType t; int64_t n; double* result;
  template <class F> void pointers(F&& f) { f(x); }
};
// x[i] = v (fp32), for a tensor of dtype t.
struct Fill {
  OPS_KERNEL(Fill);
  void* x; DType t; float v; int64_t n;
  template <class F> void pointers(F&& f) { f(x); }
};
// AdamW over one parameter range as the run stores it, so that the optimizer never widens
// on the host: `param` holds n values of dtype pt and `grad` n of dtype gt (F32, BF16, F16;
// a 16-bit gradient is widened to fp32). With `master` (n fp32 master weights) the update is
// applied to the master and param := round_pt(master); without, to param itself (a 16-bit one
// widened, updated in fp32 and rounded back). m, v: the fp32 moments (n each). The host
// composition (adamw_update_typed_composed, ops/backend.h) updates fp32-only ranges in one
// AdamwUpdate call and the others in pieces of 2^14 through fp32 buffers, the arithmetic
// runner's optimizer always had (bit for bit).
struct AdamwUpdateTyped {
  OPS_KERNEL(AdamwUpdateTyped);
  void* param; DType pt; const void* grad; DType gt; float* master; float* m; float* v; int64_t n; AdamwArgs a;
  template <class F> void pointers(F&& f) { f(param), f(grad), f(master), f(m), f(v); }
};
// AdamwUpdateTyped, then grad[0, n) := 0 (dtype gt): the optimizer step and the gradient
// zeroing for the next step in one call, so a backend can do both in one pass over memory
// (the CPU's: ops/cpu/adamw.h; same bits as the two calls, on any thread count). The
// composition (adamw_update_zero_grad_composed): the two calls, queued in order (what
// ops/cuda/ runs).
struct AdamwUpdateZeroGrad {
  OPS_KERNEL(AdamwUpdateZeroGrad);
  void* param; DType pt; void* grad; DType gt; float* master; float* m; float* v; int64_t n; AdamwArgs a;
  template <class F> void pointers(F&& f) { f(param), f(grad), f(master), f(m), f(v); }
};

// ---- Embedding ----
// Token (+ optional learned position) embedding.
// out: (B,T,C) = wte[tokens[b,t]] + (wpe ? wpe[t] : 0)   (overwritten)
// tokens: (B,T) int32, wte: (V,C), wpe: (maxT,C) or null.
// 16-bit entries: wte and wpe are stored in t: only the rows the tokens and positions name are
// read and widened (out = RNE_t(wte[token] + wpe[t]) summed in fp32, as the widened path does).
struct EmbeddingForward {
  OPS_KERNEL(EmbeddingForward);
  void* out; const int32_t* tokens; const void* wte; const void* wpe; int B, T, C;
  template <class F> void pointers(F&& f) { f(out), f(tokens), f(wte), f(wpe); }
};
// dwte: (V,C) +=, dwpe: (maxT,C) += (either may be null), dout: (B,T,C)
struct EmbeddingBackward {
  OPS_KERNEL(EmbeddingBackward);
  float* dwte; float* dwpe; const void* dout; const int32_t* tokens; int B, T, C;
  template <class F> void pointers(F&& f) { f(dwte), f(dwpe), f(dout), f(tokens); }
};
// Vocabulary-parallel embedding (tensor parallelism): wte holds rows [vstart, vstart+Vlocal) of
// the full table. A token inside that range contributes its row; a token outside contributes
// zeros (forward) and nothing (backward). The caller all-reduces `out` over the group, passing
// wpe on exactly one rank, and passes dwpe on every rank (dout is replicated).
struct EmbeddingShardForward {
  OPS_KERNEL(EmbeddingShardForward);
  float* out; const int32_t* tokens; const float* wte; const float* wpe; int B, T, C, vstart, Vlocal;
  template <class F> void pointers(F&& f) { f(out), f(tokens), f(wte), f(wpe); }
};
struct EmbeddingShardBackward {
  OPS_KERNEL(EmbeddingShardBackward);
  float* dwte; float* dwpe; const float* dout; const int32_t* tokens; int B, T, C, vstart, Vlocal;
  template <class F> void pointers(F&& f) { f(dwte), f(dwpe), f(dout), f(tokens); }
};

// ---- Norms ----
// LayerNorm over the last dimension. out: (N,C) overwritten; mean, rstd: (N) saved for backward.
struct LayerNormForward {
  OPS_KERNEL(LayerNormForward);
  void* out; float* mean; float* rstd; const void* inp; const float* weight; const float* bias; int N, C; float eps;
  template <class F> void pointers(F&& f) { f(out), f(mean), f(rstd), f(inp), f(weight), f(bias); }
};
struct LayerNormBackward {
  OPS_KERNEL(LayerNormBackward);
  void* dinp; float* dweight; float* dbias; const void* dout; const void* inp; const float* weight;
  const float* mean; const float* rstd; int N, C;
  template <class F> void pointers(F&& f) {
    f(dinp), f(dweight), f(dbias), f(dout), f(inp), f(weight), f(mean), f(rstd);
  }
};
// RMSNorm: out = inp * rstd * weight, rstd = 1/sqrt(mean(inp^2) + eps). rstd: (N) saved.
struct RmsNormForward {
  OPS_KERNEL(RmsNormForward);
  void* out; float* rstd; const void* inp; const float* weight; int N, C; float eps;
  template <class F> void pointers(F&& f) { f(out), f(rstd), f(inp), f(weight); }
};
struct RmsNormBackward {
  OPS_KERNEL(RmsNormBackward);
  void* dinp; float* dweight; const void* dout; const void* inp; const float* weight; const float* rstd; int N, C;
  template <class F> void pointers(F&& f) { f(dinp), f(dweight), f(dout), f(inp), f(weight), f(rstd); }
};

// ---- Linear ----
// Linear: out (N,OC) = inp (N,C) @ weight(OC,C)^T + bias(OC) (bias may be null). Overwrites out.
// The 16-bit entries take inp, weight and bias as stored in t (BF16 or F16), accumulate the
// products in fp32, and write fp32 with the same contract. Only where has(MatmulForward, t);
// whether it is used is ops/gemm_path.h's measured choice, and a backend without it widens.
struct MatmulForward {
  OPS_KERNEL(MatmulForward);
  float* out; const void* inp; const void* weight; const void* bias; int N, C, OC;
  template <class F> void pointers(F&& f) { f(out), f(inp), f(weight), f(bias); }
};
// dinp (N,C) +=, dweight (OC,C) +=, dbias (OC) +=; dout (N,OC) (16-bit entries: dout, inp and
// weight stored in t, the gradients fp32).
struct MatmulBackward {
  OPS_KERNEL(MatmulBackward);
  float* dinp; float* dweight; float* dbias; const void* dout; const void* inp; const void* weight; int N, C, OC;
  template <class F> void pointers(F&& f) { f(dinp), f(dweight), f(dbias), f(dout), f(inp), f(weight); }
};

// ---- Rotary position embedding ----
// Rotary position embedding on the q and k heads of a packed qkv tensor (B,T,W), W =
// (NH + 2 NKV) HS, C = NH*HS (the query channels; Heads above); v is copied.
// "rotate half" convention (GPT-NeoX / LLaMA): for head channel i < HS/2, with
// f_i = theta^(-2i/HS) and angle a = t*f_i: out[i] = x[i]cos a - x[i+HS/2]sin a,
// out[i+HS/2] = x[i+HS/2]cos a + x[i]sin a.
struct RopeForward {
  OPS_KERNEL(RopeForward);
  void* out; const void* inp; int B, T, C; Heads heads; float theta;
  template <class F> void pointers(F&& f) { f(out), f(inp); }
};
struct RopeBackward {
  OPS_KERNEL(RopeBackward);
  void* dinp; const void* dout; int B, T, C; Heads heads; float theta;
  template <class F> void pointers(F&& f) { f(dinp), f(dout); }
};

// ---- Attention ----
// Causal self-attention over packed qkv (B,T,W) = [q | k | v] per token, W = (NH + 2 NKV) HS,
// C = NH*HS; query head h owns channels [h*HS, (h+1)*HS) of q and reads key-value head
// j = heads.kv_of(h), channels [j*HS, (j+1)*HS) of k and of v. Scores scaled by 1/sqrt(HS).
// Neither call keeps the (T,T) probabilities (flash-style, Dao et al. 2022, so that the
// activation memory is linear in T): the forward computes them block by block and saves one
// number per query row, the backward recomputes the scores by blocks from q and k.
// out: (B,T,C) overwritten. lse: (B,NH,T) fp32 overwritten, the natural log-sum-exp of row t's
// scaled causal scores, lse[t] = log(sum_{s<=t} exp(score[t][s])), so that the probabilities
// (before dropout) are P[t][s] = exp(score[t][s] - lse[t]). Dropout on P uses drop.key with
// counter = offset + ((b*NH + h)*T + t)*T + s (heads_total/head_start: the global head, see
// DropoutSpec), drawn in the forward and regenerated in the backward, never stored.
// 16-bit entries: qkv, out (and dout, dqkv) in t; lse and `work` stay fp32.
struct AttentionForward {
  OPS_KERNEL(AttentionForward);
  void* out; float* lse; const void* qkv; int B, T, C; Heads heads; DropoutSpec drop;
  template <class F> void pointers(F&& f) { f(out), f(lse), f(qkv); }
};
// dqkv: (B,T,W) +=. dout: (B,T,C). lse: the forward's, with the same qkv and drop. A backend
// may use lse to recompute P = exp(score - lse) (the GPU's) or recompute the row statistics
// exactly as its forward did (the CPU's, so that its probabilities, and so its gradients, are
// bit-identical to those of a kernel that stored them). The gradient of a key-value head
// sums over the query heads that read it. `work`: (B,NH,T,2HS) floats when heads.group > 1 (a
// backend that sums the group otherwise, e.g. with atomics, may ignore it; work_floats says
// how much); null otherwise. 16-bit entries: dqkv gets one fold per element, RNE_t(dqkv + g),
// g what the F32 entry accumulates into a zeroed fp32 buffer (for a key-value head: its
// group's sum in query-head order).
struct AttentionBackward {
  OPS_KERNEL(AttentionBackward);
  void* dqkv; const void* dout; const void* qkv; const float* lse; int B, T, C; Heads heads; DropoutSpec drop;
  float* work = nullptr;
  template <class F> void pointers(F&& f) { f(dqkv), f(dout), f(qkv), f(lse), f(work); }
  // Floats of `work` (the same on every backend, so that the plan's dry run and every device
  // count the same workspace).
  static int64_t work_floats(int B, int T, int C, Heads heads) {
    return heads.group > 1 ? static_cast<int64_t>(B) * T * C * 2 : 0;
  }
};
// The KV cache (generation; forward only, nothing to differentiate).
// Prefill: K and V of qkv (B,T,W) (after rope, as the attention reads them) into positions
// [0, T) of rows [0, B) of the cache.
struct KvCacheWrite {
  OPS_KERNEL(KvCacheWrite);
  KvView kv; const float* qkv; int B, T, C; Heads heads;
  template <class F> void pointers(F&& f) { kv.pointers(f), f(qkv); }
};
// Decode, one new token per row: qkv (B,W) holds row b's token at position pos[b]. With
// theta > 0 its q and k are first rotated at pos[b] (RopeForward's convention and angles);
// k and v are stored at pos[b], then out (B,C) = attention of q over the cache's positions
// [0, pos[b]] of row b (scale 1/sqrt(HS), causal by construction, no dropout).
struct AttentionDecode {
  OPS_KERNEL(AttentionDecode);
  float* out; const float* qkv; KvView kv; const int32_t* pos; int B, C; Heads heads; float theta;
  template <class F> void pointers(F&& f) { f(out), f(qkv), kv.pointers(f), f(pos); }
};

// ---- Pointwise ----
// The activations (OPS_ACTIVATIONS, above): out = f(inp), overwritten; d(inp) += d(out) f'(inp).
#define OPS_ACTIVATION_KERNELS(A, a)                                        \
  struct A##Forward {                                                       \
    OPS_KERNEL(A##Forward);                                                 \
    static constexpr const char* stem = #a;                                 \
    void* out; const void* inp; int64_t n;                                  \
    template <class F> void pointers(F&& f) { f(out), f(inp); }             \
  };                                                                        \
  struct A##Backward {                                                      \
    OPS_KERNEL(A##Backward);                                                \
    void* dinp; const void* inp; const void* dout; int64_t n;               \
    template <class F> void pointers(F&& f) { f(dinp), f(inp), f(dout); }   \
  };
OPS_ACTIVATIONS(OPS_ACTIVATION_KERNELS)
#undef OPS_ACTIVATION_KERNELS
// Linear + bias + GELU in one call: the MLP's fc and its activation (fp32).
// pre (N,OC) = inp (N,C) @ weight (OC,C)^T + bias (bias may be null), kept for the backward;
// out (N,OC) = gelu(pre). Both overwritten. The operations of MatmulForward then
// GeluForward in their order (the bias before the GEMM's sums, as MatmulForward adds it),
// so out and pre are bit-identical to the unfused pair's.
struct LinearGeluForward {
  OPS_KERNEL(LinearGeluForward);
  float* out; float* pre; const float* inp; const float* weight; const float* bias; int N, C, OC;
  template <class F> void pointers(F&& f) { f(out), f(pre), f(inp), f(weight), f(bias); }
};
// dpre (N,OC) holds d(out) on entry and d(pre) = d(out) * gelu'(pre) on return
// (OVERWRITTEN in place: the caller's d(out) is dead after the call, so no second (N,OC)
// buffer). dbias (OC) += colsum(d(pre)), dinp (N,C) += d(pre) @ weight, dweight (OC,C) +=
// d(pre)^T @ inp (null: skip). Bit-identical to GeluBackward into a zeroed buffer then
// MatmulBackward. The composition (linear_gelu_backward_composed) does those calls through a
// temporary (N,OC) buffer the ledger does not count; the CPU fuses them.
struct LinearGeluBackward {
  OPS_KERNEL(LinearGeluBackward);
  float* dinp; float* dweight; float* dbias; float* dpre; const float* pre; const float* inp; const float* weight;
  int N, C, OC;
  template <class F> void pointers(F&& f) { f(dinp), f(dweight), f(dbias), f(dpre), f(pre), f(inp), f(weight); }
};
// A residual add and the norm of its sum in one call (AddNorm, ops/op_fused.cpp).
// Activations (a, b, sum, out and their gradients) are stored in the entry's dtype: F32, or
// BF16/F16 as on the 16-bit-native path; weight, bias, their gradients, mean and rstd are
// fp32 as always. sum (N,C) = a + b (rounded to t), out (N,C) = the norm of the stored
// (rounded) sum, mean/rstd (N) saved: the bits of AddForward then LayerNormForward (the same
// dtype's entries). Backward: dsum (N,C) holds d(sum) from downstream on entry and the total
// d(sum) + norm-backward(dout) on return (OVERWRITTEN in place: the caller's buffer is dead
// after the call); da, db (N,C) += that total (null: skip); dweight, dbias +=. The bits of
// LayerNormBackward accumulating into dsum then two AddInplace. The compositions
// (add_layernorm_forward_composed, ...) are those calls; the CPU fuses them into one pass
// over rows.
struct AddLayerNormForward {
  OPS_KERNEL(AddLayerNormForward);
  void* sum; void* out; float* mean; float* rstd; const void* a; const void* b; const float* weight;
  const float* bias; int N, C; float eps;
  template <class F> void pointers(F&& f) { f(sum), f(out), f(mean), f(rstd), f(a), f(b), f(weight), f(bias); }
};
struct AddLayerNormBackward {
  OPS_KERNEL(AddLayerNormBackward);
  void* da; void* db; float* dweight; float* dbias; void* dsum; const void* dout; const void* sum;
  const float* weight; const float* mean; const float* rstd; int N, C;
  template <class F> void pointers(F&& f) {
    f(da), f(db), f(dweight), f(dbias), f(dsum), f(dout), f(sum), f(weight), f(mean), f(rstd);
  }
};
struct AddRmsNormForward {
  OPS_KERNEL(AddRmsNormForward);
  void* sum; void* out; float* rstd; const void* a; const void* b; const float* weight; int N, C; float eps;
  template <class F> void pointers(F&& f) { f(sum), f(out), f(rstd), f(a), f(b), f(weight); }
};
struct AddRmsNormBackward {
  OPS_KERNEL(AddRmsNormBackward);
  void* da; void* db; float* dweight; void* dsum; const void* dout; const void* sum; const float* weight;
  const float* rstd; int N, C;
  template <class F> void pointers(F&& f) { f(da), f(db), f(dweight), f(dsum), f(dout), f(sum), f(weight), f(rstd); }
};
// SwiGLU: inp (N, 2H) = [gate | up]; out (N,H) = silu(gate) * up.
struct SwigluForward {
  OPS_KERNEL(SwigluForward);
  void* out; const void* inp; int N, H;
  template <class F> void pointers(F&& f) { f(out), f(inp); }
};
struct SwigluBackward {
  OPS_KERNEL(SwigluBackward);
  void* dinp; const void* dout; const void* inp; int N, H;
  template <class F> void pointers(F&& f) { f(dinp), f(dout), f(inp); }
};
// out = a + b (out may alias a or b). Its backward is two AddInplace calls.
struct AddForward {
  OPS_KERNEL(AddForward);
  void* out; const void* a; const void* b; int64_t n;
  template <class F> void pointers(F&& f) { f(out), f(a), f(b); }
};
// dst += src. 16-bit entries: dst := RNE_t(dst + (0 + src)), the F32 entry into a zeroed fp32
// copy, then accumulated.
struct AddInplace {
  OPS_KERNEL(AddInplace);
  void* dst; const void* src; int64_t n;
  template <class F> void pointers(F&& f) { f(dst), f(src); }
};
// Inverted dropout: out = inp * keep(i) / (1-p), keep(i) = rng_uniform(key, offset + i) >= p.
struct DropoutForward {
  OPS_KERNEL(DropoutForward);
  void* out; const void* inp; int64_t n; DropoutSpec drop;
  template <class F> void pointers(F&& f) { f(out), f(inp); }
};
struct DropoutBackward {
  OPS_KERNEL(DropoutBackward);
  void* dinp; const void* dout; int64_t n; DropoutSpec drop;
  template <class F> void pointers(F&& f) { f(dinp), f(dout); }
};

// ---- Loss ----
// Softmax cross-entropy fused. logits: (N,V), the first Vreal columns are real (the rest is
// padding and is ignored). targets: (N) int32, a negative target means "ignore this row"
// (loss 0, gradient 0). losses: (N) per-row loss. probs: (N,V) softmax output (may alias logits).
struct SoftmaxXentForward {
  OPS_KERNEL(SoftmaxXentForward);
  float* losses; float* probs; const float* logits; const int32_t* targets; int N, V, Vreal;
  template <class F> void pointers(F&& f) { f(losses), f(probs), f(logits), f(targets); }
};
// dlogits (N,V) OVERWRITTEN (may alias probs) = (probs - onehot(target)) * dloss; padding columns 0.
struct SoftmaxXentBackward {
  OPS_KERNEL(SoftmaxXentBackward);
  float* dlogits; const float* probs; const int32_t* targets; float dloss; int N, V, Vreal;
  template <class F> void pointers(F&& f) { f(dlogits), f(probs), f(targets); }
};
// Vocabulary-parallel softmax cross-entropy (Megatron), never gathering the logits. This rank
// holds columns [vstart, vstart+V) of the full (N, Vfull) logits, of which its first Vreal are
// real (Vreal may be 0 for a shard that is all padding). Targets are full-vocabulary ids.
// Phase 1: rowmax[r] = max over this shard's real columns (-inf when Vreal == 0).
//   The caller all-reduces rowmax with MAX.
struct XentShardMax {
  OPS_KERNEL(XentShardMax);
  float* rowmax; const float* logits; int N, V, Vreal;
  template <class F> void pointers(F&& f) { f(rowmax), f(logits); }
};
// Phase 2: sumexp[r] = sum over real columns of exp(logit - rowmax[r]);
//   tlogit[r] = logits[r, targets[r] - vstart] - rowmax[r] when the target is in this shard, else 0.
//   The caller all-reduces sumexp and tlogit with SUM.
struct XentShardSumexp {
  OPS_KERNEL(XentShardSumexp);
  float* sumexp; float* tlogit; const float* logits; const float* rowmax; const int32_t* targets; int N, V, Vreal,
      vstart;
  template <class F> void pointers(F&& f) { f(sumexp), f(tlogit), f(logits), f(rowmax), f(targets); }
};
// Phase 3: probs = exp(logit - rowmax) / sumexp on real columns, 0 on padding (probs may alias
// logits); losses[r] = log(sumexp[r]) - tlogit[r], 0 for a negative target.
struct XentShardFinish {
  OPS_KERNEL(XentShardFinish);
  float* losses; float* probs; const float* logits; const float* rowmax; const float* sumexp; const float* tlogit;
  const int32_t* targets; int N, V, Vreal;
  template <class F> void pointers(F&& f) {
    f(losses), f(probs), f(logits), f(rowmax), f(sumexp), f(tlogit), f(targets);
  }
};
// dlogits (N,V) OVERWRITTEN (may alias probs) = (probs - onehot(target - vstart)) * dloss; rows
// with a negative target and padding columns get 0.
struct XentShardBackward {
  OPS_KERNEL(XentShardBackward);
  float* dlogits; const float* probs; const int32_t* targets; float dloss; int N, V, Vreal, vstart;
  template <class F> void pointers(F&& f) { f(dlogits), f(probs), f(targets); }
};

// ---- Optimizer ----
// AdamW (Loshchilov & Hutter 2019), decoupled weight decay, bias correction with step t >= 1.
// grad is multiplied by grad_scale first (clipping, loss-scale removal).
// m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; mhat = m/(1-b1^t); vhat = v/(1-b2^t);
// param -= lr * (mhat / (sqrt(vhat) + eps) + wd * param)
struct AdamwUpdate {
  OPS_KERNEL(AdamwUpdate);
  float* param; const float* grad; float* m; float* v; int64_t n; float lr, beta1, beta2, eps, weight_decay;
  int64_t t; float grad_scale;
  template <class F> void pointers(F&& f) { f(param), f(grad), f(m), f(v); }
};
// *result = sum of squares in double (for the global gradient norm); `result` is host memory.
struct SumSquares {
  OPS_KERNEL_(SumSquares, true);
  const float* x; int64_t n; double* result;
  template <class F> void pointers(F&& f) { f(x); }
};
// x *= s
struct Scale {
  OPS_KERNEL(Scale);
  float* x; int64_t n; float s;
  template <class F> void pointers(F&& f) { f(x); }
};

#undef OPS_KERNEL
#undef OPS_KERNEL_

// Every kernel, for code that treats them all alike (the strict device wraps each).
using AllKernels =
    std::tuple<Convert, Accumulate, SumSquaresTyped, Fill, AdamwUpdateTyped, AdamwUpdateZeroGrad, EmbeddingForward,
               EmbeddingBackward, EmbeddingShardForward, EmbeddingShardBackward, LayerNormForward, LayerNormBackward,
               RmsNormForward, RmsNormBackward, MatmulForward, MatmulBackward, RopeForward, RopeBackward,
               AttentionForward, AttentionBackward, KvCacheWrite, AttentionDecode, LinearGeluForward, LinearGeluBackward, AddLayerNormForward, AddLayerNormBackward, AddRmsNormForward,
               AddRmsNormBackward, SwigluForward, SwigluBackward, AddForward, AddInplace, DropoutForward,
               DropoutBackward, SoftmaxXentForward, SoftmaxXentBackward, XentShardMax, XentShardSumexp,
               XentShardFinish, XentShardBackward, AdamwUpdate, SumSquares, Scale
#define OPS_ACTIVATION_TYPES(A, a) , A##Forward, A##Backward
               OPS_ACTIVATIONS(OPS_ACTIVATION_TYPES)
#undef OPS_ACTIVATION_TYPES
               >;
static_assert(std::tuple_size_v<AllKernels> == kKernelCount, "AllKernels names every Kernel");

}  // namespace k

// A kernel's name ("LayerNormForward").
const char* kernel_name(Kernel k);

}  // namespace ops
