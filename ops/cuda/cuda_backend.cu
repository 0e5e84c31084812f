// The CUDA backend: every kernel of ops/backend.h on the GPU, forward and backward side by
// side, with the CPU backend's arithmetic (ops/cpu/cpu_backend.cpp is the reference; the same
// formulas, fp32 throughout, sums of squares in double). GEMMs go to cuBLASLt with fp32
// accumulation (fp32, bf16 and fp16 operands), the bias fused in its epilogue. Dropout draws
// from ops/rng.h's counter RNG (the same inline functions, compiled for the device), so a
// mask is bit-identical to the CPU's.
//
// Conventions (ops/backend.h): every backward accumulates (+=) except the two loss backwards,
// which overwrite; a null gradient pointer skips that work. Reductions over rows (dweight,
// dbias, embedding gradients, attention's dk/dv) use atomicAdd: results match the CPU to
// rounding, not bit for bit, and vary with scheduling.
//
// Status: written and compiled without a GPU; it has not yet run on one (see cuda_backend.h).
#include <cublasLt.h>
#include <dlfcn.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <nvtx3/nvToolsExt.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "ops/cuda/cuda_backend.h"
#include "ops/adamw_math.h"
#include "ops/backend_fp32.h"
#include "ops/cuda/cuda_workspace.h"

// ops/rng.h's functions are plain inline C++; compile them for both sides.
#define inline __host__ __device__ inline
#include "ops/rng.h"
#include "ops/convert.h"  // the CPU's bit-exact fp32 <-> bf16/fp16 rounding, on the device too
#undef inline

namespace ops::cuda {
namespace {

// cuBLASLt, loaded when the backend starts (dlopen), not when the process does: every runner
// process links this backend, and mapping the 540 MB library costs ~0.2 s of start-up
// (measured: a program linking it, 20 runs 4.4 s against 0.05 s), which CPU runs never need.
struct LtApi {
#define RUNNER_LT_FN(name) decltype(&cublasLt##name) name = nullptr;
  RUNNER_LT_FN(Create)
  RUNNER_LT_FN(Destroy)
  RUNNER_LT_FN(Matmul)
  RUNNER_LT_FN(MatmulAlgoGetHeuristic)
  RUNNER_LT_FN(MatmulDescCreate)
  RUNNER_LT_FN(MatmulDescDestroy)
  RUNNER_LT_FN(MatmulDescSetAttribute)
  RUNNER_LT_FN(MatmulPreferenceCreate)
  RUNNER_LT_FN(MatmulPreferenceDestroy)
  RUNNER_LT_FN(MatmulPreferenceSetAttribute)
  RUNNER_LT_FN(MatrixLayoutCreate)
  RUNNER_LT_FN(MatrixLayoutDestroy)
#undef RUNNER_LT_FN
};
const LtApi& lt_api() {
  static const LtApi api = [] {
    const std::string soname = "libcublasLt.so." + std::to_string(CUBLAS_VER_MAJOR);
    void* h = dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL);
#ifdef RUNNER_CUDA_LIBDIR
    if (!h) h = dlopen((std::string(RUNNER_CUDA_LIBDIR) + "/" + soname).c_str(), RTLD_NOW | RTLD_LOCAL);
#endif
    if (!h) throw std::runtime_error("CUDA backend: cannot load " + soname + " (cuBLASLt): " + dlerror());
    LtApi a;
    auto load = [h](auto& fn, const char* name) {
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(h, name));
      if (!fn) throw std::runtime_error(std::string("CUDA backend: cuBLASLt has no ") + name);
    };
#define RUNNER_LT_LOAD(name) load(a.name, "cublasLt" #name);
    RUNNER_LT_LOAD(Create)
    RUNNER_LT_LOAD(Destroy)
    RUNNER_LT_LOAD(Matmul)
    RUNNER_LT_LOAD(MatmulAlgoGetHeuristic)
    RUNNER_LT_LOAD(MatmulDescCreate)
    RUNNER_LT_LOAD(MatmulDescDestroy)
    RUNNER_LT_LOAD(MatmulDescSetAttribute)
    RUNNER_LT_LOAD(MatmulPreferenceCreate)
    RUNNER_LT_LOAD(MatmulPreferenceDestroy)
    RUNNER_LT_LOAD(MatmulPreferenceSetAttribute)
    RUNNER_LT_LOAD(MatrixLayoutCreate)
    RUNNER_LT_LOAD(MatrixLayoutDestroy)
#undef RUNNER_LT_LOAD
    return a;
  }();
  return api;
}

[[noreturn]] void fail(const char* what, const char* err, const char* file, int line) {
  throw std::runtime_error(std::string("CUDA backend: ") + what + ": " + err + " (" + file + ":" +
                           std::to_string(line) + ")");
}
#define CU_CHECK(x)                                                            \
  do {                                                                         \
    cudaError_t e_ = (x);                                                      \
    if (e_ != cudaSuccess) fail(#x, cudaGetErrorString(e_), __FILE__, __LINE__); \
  } while (0)
#define LT_CHECK(x)                                                                    \
  do {                                                                                 \
    cublasStatus_t s_ = (x);                                                           \
    if (s_ != CUBLAS_STATUS_SUCCESS) fail(#x, ("cublasStatus_t " + std::to_string(static_cast<int>(s_))).c_str(), __FILE__, __LINE__); \
  } while (0)
#define LAUNCH_CHECK() CU_CHECK(cudaGetLastError())
#define REQUIRE_ARG(cond, msg) \
  do {                         \
    if (!(cond)) throw std::invalid_argument(std::string("cuda backend: ") + (msg)); \
  } while (0)

constexpr int kThreads = 256;

inline int blocks_for(int64_t n, int threads = kThreads) {
  int64_t b = (n + threads - 1) / threads;
  return static_cast<int>(b < 1 ? 1 : (b > 65535 * 16 ? 65535 * 16 : b));
}

// ------------------------------------------------------------------ reductions
__device__ inline float warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ inline float warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
__device__ inline double warp_sum_d(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
// Block-wide sum/max (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ float block_sum(float v) {
  __shared__ float sh[32];
  __shared__ float result;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nw ? sh[lane] : 0.0f;
    w = warp_sum(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}
__device__ float block_max(float v) {
  __shared__ float sh[32];
  __shared__ float result;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  if (warp == 0) {
    float w = lane < nw ? sh[lane] : -INFINITY;
    w = warp_max(w);
    if (lane == 0) result = w;
  }
  __syncthreads();
  return result;
}

// The CPU's vecmath.h functions, with CUDA's expf (CPU: exp_f, a polynomial; they agree to a
// few ulp, which the tests' tolerances allow).
__device__ inline float sigmoid_d(float x) { return 1.0f / (1.0f + expf(-x)); }
constexpr float kGeluA = 0.7978845608028654f;
constexpr float kGeluB = 0.044715f;
__device__ inline float gelu_d(float x) {
  const float u = kGeluA * (x + kGeluB * x * x * x);
  return x * sigmoid_d(2.0f * u);
}
__device__ inline float gelu_grad_d(float x) {
  const float u = kGeluA * (x + kGeluB * x * x * x);
  const float du = kGeluA * (1.0f + 3.0f * kGeluB * x * x);
  const float s = sigmoid_d(2.0f * u);
  return s + 2.0f * x * s * (1.0f - s) * du;
}
// relu(x)^2 and 2 relu(x), as ops/cpu/vecmath.h writes them (a NaN stays NaN).
__device__ inline float relu2_d(float x) { return x < 0.0f ? 0.0f : x * x; }
__device__ inline float relu2_grad_d(float x) { return x < 0.0f ? 0.0f : x + x; }

// ------------------------------------------------------------------ embedding
__global__ void embedding_fwd_k(float* out, const int32_t* tokens, const float* wte, const float* wpe, int64_t N,
                                int T, int C, int vstart, int Vlocal) {
  const int64_t r = blockIdx.x;
  if (r >= N) return;
  const int64_t local = static_cast<int64_t>(tokens[r]) - vstart;
  const float* w = local >= 0 && local < Vlocal ? wte + local * C : nullptr;
  const float* p = wpe ? wpe + (r % T) * C : nullptr;
  for (int i = threadIdx.x; i < C; i += blockDim.x)
    out[r * C + i] = (w ? w[i] : 0.0f) + (p ? p[i] : 0.0f);
}
__global__ void embedding_bwd_k(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int64_t N, int T,
                                int C, int vstart, int Vlocal) {
  const int64_t r = blockIdx.x;
  if (r >= N) return;
  const int64_t local = static_cast<int64_t>(tokens[r]) - vstart;
  float* w = dwte && local >= 0 && local < Vlocal ? dwte + local * C : nullptr;
  float* p = dwpe ? dwpe + (r % T) * C : nullptr;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float d = dout[r * C + i];
    if (w) atomicAdd(w + i, d);
    if (p) atomicAdd(p + i, d);
  }
}

// ------------------------------------------------------------------ layernorm / rmsnorm
// One block per row. weight / bias null: ones / zeros.
__global__ void layernorm_fwd_k(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                                const float* bias, int C, float eps) {
  const int64_t r = blockIdx.x;
  const float* x = inp + r * C;
  float s = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) s += x[i];
  const float m = block_sum(s) / C;
  float v = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) v += (x[i] - m) * (x[i] - m);
  const float rs = 1.0f / sqrtf(block_sum(v) / C + eps);
  for (int i = threadIdx.x; i < C; i += blockDim.x)
    out[r * C + i] = (x[i] - m) * rs * (weight ? weight[i] : 1.0f) + (bias ? bias[i] : 0.0f);
  if (threadIdx.x == 0) {
    if (mean) mean[r] = m;
    if (rstd) rstd[r] = rs;
  }
}
__global__ void layernorm_bwd_dx_k(float* dinp, const float* dout, const float* inp, const float* weight,
                                   const float* mean, const float* rstd, int C) {
  const int64_t r = blockIdx.x;
  const float* x = inp + r * C;
  const float* dy = dout + r * C;
  const float m = mean[r], rs = rstd[r];
  float gs = 0.0f, gxs = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) {
    const float g = (weight ? weight[i] : 1.0f) * dy[i];
    gs += g;
    gxs += g * (x[i] - m) * rs;
  }
  const float g_mean = block_sum(gs) / C;
  const float gx_mean = block_sum(gxs) / C;
  for (int i = threadIdx.x; i < C; i += blockDim.x)
    dinp[r * C + i] += rs * ((weight ? weight[i] : 1.0f) * dy[i] - g_mean - (x[i] - m) * rs * gx_mean);
}
// dweight[j] += sum_r dout xhat, dbias[j] += sum_r dout over a (column, row-chunk) grid: each
// thread owns one column over kRowsPerChunk rows, then one atomicAdd. mean null: rmsnorm (xhat = x rstd).
constexpr int kRowsPerChunk = 64;
__global__ void norm_bwd_dw_k(float* dweight, float* dbias, const float* dout, const float* inp, const float* mean,
                              const float* rstd, int64_t N, int C) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= C) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  float sw = 0.0f, sb = 0.0f;
  for (int64_t r = r0; r < r1; r++) {
    const float dy = dout[r * C + j];
    const float xhat = (inp[r * C + j] - (mean ? mean[r] : 0.0f)) * rstd[r];
    sw += dy * xhat;
    sb += dy;
  }
  if (dweight) atomicAdd(dweight + j, sw);
  if (dbias) atomicAdd(dbias + j, sb);
}
__global__ void rmsnorm_fwd_k(float* out, float* rstd, const float* inp, const float* weight, int C, float eps) {
  const int64_t r = blockIdx.x;
  const float* x = inp + r * C;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) ss += x[i] * x[i];
  const float rs = 1.0f / sqrtf(block_sum(ss) / C + eps);
  for (int i = threadIdx.x; i < C; i += blockDim.x) out[r * C + i] = x[i] * rs * (weight ? weight[i] : 1.0f);
  if (threadIdx.x == 0 && rstd) rstd[r] = rs;
}
__global__ void rmsnorm_bwd_dx_k(float* dinp, const float* dout, const float* inp, const float* weight,
                                 const float* rstd, int C) {
  const int64_t r = blockIdx.x;
  const float* x = inp + r * C;
  const float* dy = dout + r * C;
  const float rs = rstd[r];
  float gxs = 0.0f;
  for (int i = threadIdx.x; i < C; i += blockDim.x) gxs += (weight ? weight[i] : 1.0f) * dy[i] * x[i] * rs;
  const float gx_mean = block_sum(gxs) / C;
  for (int i = threadIdx.x; i < C; i += blockDim.x)
    dinp[r * C + i] += rs * ((weight ? weight[i] : 1.0f) * dy[i] - x[i] * rs * gx_mean);
}

// ------------------------------------------------------------------ bias gradient, conversions
template <class T> __device__ inline float to_float(T v);
template <> __device__ inline float to_float<float>(float v) { return v; }
template <> __device__ inline float to_float<__nv_bfloat16>(__nv_bfloat16 v) { return __bfloat162float(v); }
template <> __device__ inline float to_float<__half>(__half v) { return __half2float(v); }

// dbias[j] += sum over rows of dout[r, j]: (column, row-chunk) grid as norm_bwd_dw_k.
template <class T>
__global__ void bias_bwd_k(float* dbias, const T* dout, int64_t N, int OC) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= OC) return;
  const int64_t r0 = static_cast<int64_t>(blockIdx.y) * kRowsPerChunk;
  const int64_t r1 = r0 + kRowsPerChunk < N ? r0 + kRowsPerChunk : N;
  float s = 0.0f;
  for (int64_t r = r0; r < r1; r++) s += to_float<T>(dout[r * OC + j]);
  atomicAdd(dbias + j, s);
}
template <class T>
__global__ void widen_k(float* dst, const T* src, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    dst[i] = to_float<T>(src[i]);
}

// ------------------------------------------------------------------ rope
// One thread per (row, q-or-k head, i < HS/2) pair; v copied (forward) or accumulated (backward).
// Rows are (NH + 2 NKV) HS wide (grouped-query attention: NH q heads, NKV k heads, NKV v heads).
// Angles as the CPU's table: f = theta^(-2i/HS) and cos(t f), sin(t f) in double, rounded to float.
__global__ void rope_k(float* dst, const float* src, int64_t N, int T, int C, int NH, int NKV, float theta,
                       bool inverse) {
  const int HS = C / NH, half = HS / 2, W = C + 2 * NKV * HS, Cv = NKV * HS;
  const int64_t pairs = static_cast<int64_t>(NH + NKV) * half;
  const int64_t total = N * pairs;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < total;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / pairs;
    const int rem = static_cast<int>(idx % pairs), hh = rem / half, i = rem % half;
    const int t = static_cast<int>(r % T);
    const double f = pow(static_cast<double>(theta), -2.0 * i / HS);
    const float cs = static_cast<float>(cos(t * f)), sn = static_cast<float>(sin(t * f));
    const int64_t o1 = r * W + static_cast<int64_t>(hh) * HS + i, o2 = o1 + half;
    const float a = src[o1], b = src[o2];
    if (inverse) {
      dst[o1] += a * cs + b * sn;
      dst[o2] += b * cs - a * sn;
    } else {
      dst[o1] = a * cs - b * sn;
      dst[o2] = b * cs + a * sn;
    }
  }
  const int64_t nv = N * Cv;
  for (int64_t idx = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; idx < nv;
       idx += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = idx / Cv, i = idx % Cv, o = r * W + C + Cv + i;
    if (inverse) dst[o] += src[o];
    else dst[o] = src[o];
  }
}

// ------------------------------------------------------------------ attention
// Flash-style (activation memory linear in T): the (T, T) probabilities never reach global memory. One block per
// (query row t, b*NH + h): the row's scores live in shared memory (T floats, T <= kMaxAttnT),
// softmax there, lse[t] = max + log(sum) written out, then out = sum_s Pd[s] v[s] with threads
// over (channel, key slice) and a shared-memory reduction. The backward recomputes the row's
// scores from q, k and P = exp(score - lse) from the saved lse (no second softmax pass).
// Dropout counter: ctr0(b,h) + t*T + s. Grouped-query attention: qkv rows are W = C + 2 NKV HS
// wide and query head h reads key-value head hd.kv_of(h) (ops/backend.h, Heads); the
// backward's atomics sum a group's dK and dV.
// Not tiled over query rows and without tensor cores: a correct, memory-lean kernel, not a
// fast one (a FlashAttention-2 tiling or cuDNN's fused attention would replace it).
struct HeadCtr {
  uint64_t offset;
  int heads_total, head_start;
  __device__ uint64_t ctr0(int b, int h, int T, int NH) const {
    const uint64_t heads = heads_total > 0 ? static_cast<uint64_t>(heads_total) : static_cast<uint64_t>(NH);
    const uint64_t g = static_cast<uint64_t>(b) * heads + static_cast<uint64_t>(head_start) + static_cast<uint64_t>(h);
    return offset + g * static_cast<uint64_t>(T) * static_cast<uint64_t>(T);
  }
};
constexpr int kAttnThreads = 256;
constexpr int kMaxHS = 256;
// scale q[t].k[s] for key s of the row's head (q in shared memory).
__device__ inline float attn_score(const float* qs, const float* kbase, int s, int C3, int HS, float scale) {
  const float* k = kbase + static_cast<int64_t>(s) * C3;
  float d = 0.0f;
  for (int i = 0; i < HS; i++) d += qs[i] * k[i];
  return d * scale;
}
__global__ void attention_fwd_k(float* out, float* lse, const float* qkv, int T, int C, Heads hd, float p,
                                uint64_t key, HeadCtr hc) {
  extern __shared__ float P[];  // the row's scores, then its probabilities (t + 1 of T floats)
  const int NH = hd.q, t = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH, HS = C / NH;
  const int C3 = C + 2 * hd.kv * HS;  // the qkv row
  const float scale = rsqrtf(static_cast<float>(HS));
  const float* q = qkv + (static_cast<int64_t>(b) * T + t) * C3 + h * HS;
  const float* kbase = qkv + static_cast<int64_t>(b) * T * C3 + C + hd.kv_of(h) * HS;
  const float* vbase = kbase + hd.kv * HS;
  __shared__ float qs[kMaxHS];
  for (int i = threadIdx.x; i < HS; i += blockDim.x) qs[i] = q[i];
  __syncthreads();
  float mx = -INFINITY;
  for (int s = threadIdx.x; s <= t; s += blockDim.x) {
    const float d = attn_score(qs, kbase, s, C3, HS, scale);
    P[s] = d;
    mx = fmaxf(mx, d);
  }
  mx = block_max(mx);
  float sum = 0.0f;
  for (int s = threadIdx.x; s <= t; s += blockDim.x) {
    const float e = expf(P[s] - mx);
    P[s] = e;
    sum += e;
  }
  sum = block_sum(sum);  // (synchronizes: every P[s] is written)
  const float inv = 1.0f / sum;
  if (threadIdx.x == 0) lse[static_cast<int64_t>(bh) * T + t] = mx + logf(sum);
  const bool dropout = p > 0.0f;
  const float kscale = dropout ? 1.0f / (1.0f - p) : 1.0f;
  const uint64_t c0 = hc.ctr0(b, h, T, NH) + static_cast<uint64_t>(t) * T;
  // threads: (slice, channel) with slices = blockDim.x / HS (>= 1)
  __shared__ float part[kAttnThreads];
  const int slices = blockDim.x / HS > 0 ? blockDim.x / HS : 1;
  const int ch = threadIdx.x % HS, sl = threadIdx.x / HS;
  float acc = 0.0f;
  if (sl < slices) {
    for (int s = sl; s <= t; s += slices) {
      float w = P[s] * inv;
      if (dropout) w = ops::rng_uniform(key, c0 + s) >= p ? w * kscale : 0.0f;
      acc += w * vbase[static_cast<int64_t>(s) * C3 + ch];
    }
  }
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < HS) {
    float o = 0.0f;
    for (int k = 0; k < slices; k++) o += part[k * HS + threadIdx.x];
    out[(static_cast<int64_t>(b) * T + t) * C + h * HS + threadIdx.x] = o;
  }
}
// Backward, one block per (t, bh): P[s] = exp(scale q[t].k[s] - lse[t]); dPd[s] = dO[t].v[s];
// dP = dPd * mask; dS = P (dP - sum dP P); dq[t] += scale sum_s dS[s] k[s];
// dk[s] += scale dS[s] q[t]; dv[s] += Pd[s] dO[t] (atomics). P and dS are kept in shared memory
// (2T floats, T <= kMaxAttnT).
constexpr int kMaxAttnT = 8192;
__global__ void attention_bwd_k(float* dqkv, const float* dout, const float* qkv, const float* lse, int T, int C,
                                Heads hd, float p, uint64_t key, HeadCtr hc) {
  extern __shared__ float shm[];  // P: T floats, then dS: T floats
  float* P = shm;
  float* dS = shm + T;
  const int NH = hd.q, t = blockIdx.x, bh = blockIdx.y, b = bh / NH, h = bh % NH, HS = C / NH;
  const int C3 = C + 2 * hd.kv * HS, koff = C + hd.kv_of(h) * HS, voff = koff + hd.kv * HS;
  const float scale = rsqrtf(static_cast<float>(HS));
  const int64_t rowq = (static_cast<int64_t>(b) * T + t) * C3 + h * HS;
  const float* q = qkv + rowq;
  const float* kbase = qkv + static_cast<int64_t>(b) * T * C3 + koff;
  const float* vbase = qkv + static_cast<int64_t>(b) * T * C3 + voff;
  const float* dO = dout + (static_cast<int64_t>(b) * T + t) * C + h * HS;
  const float L = lse[static_cast<int64_t>(bh) * T + t];
  const bool dropout = p > 0.0f;
  const float kscale = dropout ? 1.0f / (1.0f - p) : 1.0f;
  const uint64_t c0 = hc.ctr0(b, h, T, NH) + static_cast<uint64_t>(t) * T;
  __shared__ float dos[kMaxHS], qs[kMaxHS];
  for (int i = threadIdx.x; i < HS; i += blockDim.x) {
    dos[i] = dO[i];
    qs[i] = q[i];
  }
  __syncthreads();
  float dot = 0.0f;
  for (int s = threadIdx.x; s <= t; s += blockDim.x) {
    const float pr = expf(attn_score(qs, kbase, s, C3, HS, scale) - L);
    const float* v = vbase + static_cast<int64_t>(s) * C3;
    float d = 0.0f;
    for (int i = 0; i < HS; i++) d += dos[i] * v[i];
    const float mk = dropout ? (ops::rng_uniform(key, c0 + s) >= p ? kscale : 0.0f) : 1.0f;
    d *= mk;          // dP
    P[s] = pr;
    dS[s] = d;
    dot += d * pr;
    // dv[s] += Pd[s] dO[t]
    const float pd = pr * mk;
    float* dv = dqkv + (static_cast<int64_t>(b) * T + s) * C3 + voff;
    if (pd != 0.0f)
      for (int i = 0; i < HS; i++) atomicAdd(dv + i, pd * dos[i]);
  }
  dot = block_sum(dot);
  for (int s = threadIdx.x; s <= t; s += blockDim.x) {
    const float ds = P[s] * (dS[s] - dot);
    dS[s] = ds;
    float* dk = dqkv + (static_cast<int64_t>(b) * T + s) * C3 + koff;
    if (ds != 0.0f)
      for (int i = 0; i < HS; i++) atomicAdd(dk + i, scale * ds * qs[i]);
  }
  __syncthreads();
  // dq[t][i] = scale sum_s dS[s] k[s][i]: threads (slice, channel), shared reduction.
  __shared__ float part[kAttnThreads];
  const int slices = blockDim.x / HS > 0 ? blockDim.x / HS : 1;
  const int ch = threadIdx.x % HS, sl = threadIdx.x / HS;
  float acc = 0.0f;
  if (sl < slices)
    for (int s = sl; s <= t; s += slices) acc += dS[s] * kbase[static_cast<int64_t>(s) * C3 + ch];
  part[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x < HS) {
    float o = 0.0f;
    for (int k = 0; k < slices; k++) o += part[k * HS + threadIdx.x];
    dqkv[rowq + threadIdx.x] += scale * o;
  }
}

// ------------------------------------------------------------------ pointwise
#define GRID_STRIDE(i, n) \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

// The activations (OPS_ACTIVATIONS, ops/kernels.h), each from its formula above (stem_d and
// stem_grad_d), named by a functor so that one kernel template serves them all.
template <class F>
__global__ void activation_fwd_k(float* out, const float* inp, int64_t n) {
  GRID_STRIDE(i, n) out[i] = F::f(inp[i]);
}
template <class F>
__global__ void activation_bwd_k(float* dinp, const float* inp, const float* dout, int64_t n) {
  GRID_STRIDE(i, n) dinp[i] += dout[i] * F::df(inp[i]);
}
#define OPS_CUDA_ACTIVATION_FORMULA(A, a)                               \
  struct A##Formula {                                                   \
    __device__ static float f(float x) { return a##_d(x); }            \
    __device__ static float df(float x) { return a##_grad_d(x); }      \
  };
OPS_ACTIVATIONS(OPS_CUDA_ACTIVATION_FORMULA)
#undef OPS_CUDA_ACTIVATION_FORMULA
// LinearGelu's backward: d(pre) = d(out) * gelu'(pre), in place over d(out). The
// composed default's bits (linear_gelu_backward_composed: 0 + d(out) * gelu'(pre) into a zeroed
// temporary, then copied back) without its (N, OC) temporary, which no ledger counts.
__global__ void gelu_bwd_inplace_k(float* d, const float* pre, int64_t n) {
  GRID_STRIDE(i, n) d[i] = 0.0f + d[i] * gelu_grad_d(pre[i]);
}
__global__ void swiglu_fwd_k(float* out, const float* inp, int64_t N, int H) {
  GRID_STRIDE(idx, N * H) {
    const int64_t r = idx / H, i = idx % H;
    const float g = inp[r * 2 * H + i], u = inp[r * 2 * H + H + i];
    out[idx] = g * sigmoid_d(g) * u;
  }
}
__global__ void swiglu_bwd_k(float* dinp, const float* dout, const float* inp, int64_t N, int H) {
  GRID_STRIDE(idx, N * H) {
    const int64_t r = idx / H, i = idx % H;
    const float g = inp[r * 2 * H + i], u = inp[r * 2 * H + H + i], dy = dout[idx];
    const float s = sigmoid_d(g);
    dinp[r * 2 * H + i] += dy * u * s * (1.0f + g * (1.0f - s));
    dinp[r * 2 * H + H + i] += dy * g * s;
  }
}
__global__ void add_k(float* out, const float* a, const float* b, int64_t n) { GRID_STRIDE(i, n) out[i] = a[i] + b[i]; }
__global__ void add_inplace_k(float* dst, const float* src, int64_t n) { GRID_STRIDE(i, n) dst[i] += src[i]; }
__global__ void scale_k(float* x, int64_t n, float s) { GRID_STRIDE(i, n) x[i] *= s; }
__global__ void dropout_fwd_k(float* out, const float* inp, int64_t n, uint64_t key, uint64_t offset, float p,
                              float scale) {
  GRID_STRIDE(i, n) out[i] = ops::rng_uniform(key, offset + static_cast<uint64_t>(i)) >= p ? inp[i] * scale : 0.0f;
}
__global__ void dropout_bwd_k(float* dinp, const float* dout, int64_t n, uint64_t key, uint64_t offset, float p,
                              float scale) {
  GRID_STRIDE(i, n) dinp[i] += ops::rng_uniform(key, offset + static_cast<uint64_t>(i)) >= p ? dout[i] * scale : 0.0f;
}

// ------------------------------------------------------------------ softmax cross-entropy
// One block per row. *bad is set to the row + 1 of a target >= Vreal (the CPU throws; the host
// checks the flag after the kernel).
__global__ void softmax_xent_fwd_k(float* losses, float* probs, const float* logits, const int32_t* targets, int V,
                                   int Vreal, int* bad) {
  const int64_t r = blockIdx.x;
  const float* x = logits + r * V;
  float* pr = probs + r * V;
  const int tgt = targets[r];
  if (tgt >= Vreal) {
    if (threadIdx.x == 0) atomicMax(bad, static_cast<int>(r) + 1);
    return;
  }
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < Vreal; i += blockDim.x) mx = fmaxf(mx, x[i]);
  mx = block_max(mx);
  const float xt = tgt >= 0 ? x[tgt] : 0.0f;
  __syncthreads();  // xt read by all before pr (may alias x) is written
  float sum = 0.0f;
  for (int i = threadIdx.x; i < Vreal; i += blockDim.x) {
    const float e = expf(x[i] - mx);
    pr[i] = e;
    sum += e;
  }
  sum = block_sum(sum);
  const float inv = 1.0f / sum;
  for (int i = threadIdx.x; i < V; i += blockDim.x) pr[i] = i < Vreal ? pr[i] * inv : 0.0f;
  if (threadIdx.x == 0) losses[r] = tgt >= 0 ? logf(sum) - (xt - mx) : 0.0f;
}
// dlogits = (probs - onehot(target - vstart)) * dloss (overwrite; may alias probs).
__global__ void softmax_xent_bwd_k(float* dlogits, const float* probs, const int32_t* targets, float dloss, int V,
                                   int Vreal, int vstart) {
  const int64_t r = blockIdx.x;
  const int tgt = targets[r];
  const int64_t local = static_cast<int64_t>(tgt) - vstart;
  for (int i = threadIdx.x; i < V; i += blockDim.x) {
    float d = 0.0f;
    if (tgt >= 0 && i < Vreal) {
      d = probs[r * V + i] * dloss;
      if (i == local) d -= dloss;
    }
    dlogits[r * V + i] = d;
  }
}
__global__ void xent_shard_max_k(float* rowmax, const float* logits, int V, int Vreal) {
  const int64_t r = blockIdx.x;
  float mx = -INFINITY;
  for (int i = threadIdx.x; i < Vreal; i += blockDim.x) mx = fmaxf(mx, logits[r * V + i]);
  mx = block_max(mx);
  if (threadIdx.x == 0) rowmax[r] = mx;
}
__global__ void xent_shard_sumexp_k(float* sumexp, float* tlogit, const float* logits, const float* rowmax,
                                    const int32_t* targets, int V, int Vreal, int vstart, int* bad) {
  const int64_t r = blockIdx.x;
  const float mx = rowmax[r];
  float sum = 0.0f;
  for (int i = threadIdx.x; i < Vreal; i += blockDim.x) sum += expf(logits[r * V + i] - mx);
  sum = block_sum(sum);
  if (threadIdx.x == 0) {
    sumexp[r] = sum;
    const int tgt = targets[r];
    const int64_t local = static_cast<int64_t>(tgt) - vstart;
    if (local >= Vreal && local < V) atomicMax(bad, static_cast<int>(r) + 1);
    const bool mine = tgt >= 0 && local >= 0 && local < Vreal;
    tlogit[r] = mine ? logits[r * V + local] - mx : 0.0f;
  }
}
__global__ void xent_shard_finish_k(float* losses, float* probs, const float* logits, const float* rowmax,
                                    const float* sumexp, const float* tlogit, const int32_t* targets, int V, int Vreal) {
  const int64_t r = blockIdx.x;
  const float mx = rowmax[r], inv = 1.0f / sumexp[r];
  for (int i = threadIdx.x; i < V; i += blockDim.x)
    probs[r * V + i] = i < Vreal ? expf(logits[r * V + i] - mx) * inv : 0.0f;
  if (threadIdx.x == 0 && losses) losses[r] = targets[r] >= 0 ? logf(sumexp[r]) - tlogit[r] : 0.0f;
}

// ------------------------------------------------------------------ optimizer, norms
__global__ void adamw_k(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                        float beta2, float eps, float wd, float inv_bc1, float inv_bc2, float gs) {
  const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
  GRID_STRIDE(i, n) {
    param[i] = adamw_element(param[i], grad[i] * gs, m[i], v[i], lr, beta1, beta2, a1, a2, eps, wd, inv_bc1, inv_bc2);
  }
}
// AdamW over a parameter as stored (ops/kernels.h, AdamwUpdateTyped): the
// gradient widened from TG, the update applied to the fp32 master when there is one (param :=
// its rounding) or to the TP parameter widened; adamw_k's arithmetic per element.
template <class T> __device__ inline T from_float(float v);
template <> __device__ inline float from_float<float>(float v) { return v; }
template <> __device__ inline __nv_bfloat16 from_float<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
template <> __device__ inline __half from_float<__half>(float v) { return __float2half_rn(v); }
template <class TP, class TG>
__global__ void adamw_typed_k(TP* param, const TG* grad, float* master, float* m, float* v, int64_t n, float lr,
                              float beta1, float beta2, float eps, float wd, float inv_bc1, float inv_bc2, float gs) {
  const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = to_float<TG>(grad[i]) * gs;
    const float w = adamw_element(master ? master[i] : to_float<TP>(param[i]), g, m[i], v[i], lr, beta1, beta2, a1, a2,
                                  eps, wd, inv_bc1, inv_bc2);
    if (master) master[i] = w;
    param[i] = from_float<TP>(w);
  }
}

// Adds the block's per-thread partial sums `s` to *out (warp sums, then one atomic per block).
__device__ inline void block_sum_to(double* out, double s) {
  __shared__ double sh[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  s = warp_sum_d(s);
  if (lane == 0) sh[warp] = s;
  __syncthreads();
  if (warp == 0) {
    double w = lane < static_cast<int>(blockDim.x >> 5) ? sh[lane] : 0.0;
    w = warp_sum_d(w);
    if (lane == 0) atomicAdd(out, w);
  }
}

__global__ void sum_squares_k(double* out, const float* x, int64_t n) {
  double s = 0.0;
  GRID_STRIDE(i, n) s += static_cast<double>(x[i]) * static_cast<double>(x[i]);
  block_sum_to(out, s);
}

// ------------------------------------------------------------------ generic kernels
// Any float storage dtype, element i read and written with ops/convert.h's rounding, so the
// device's bf16/fp16 values are bit-identical to the CPU backend's.
__device__ inline float load_as_f32(const void* p, DType t, int64_t i) {
  if (t == DType::F32) return static_cast<const float*>(p)[i];
  const uint16_t h = static_cast<const uint16_t*>(p)[i];
  return t == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h);
}
__device__ inline void store_from_f32(void* p, DType t, int64_t i, float v) {
  if (t == DType::F32) static_cast<float*>(p)[i] = v;
  else static_cast<uint16_t*>(p)[i] = t == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
}
__global__ void convert_k(void* dst, DType dt, const void* src, DType st, int64_t n) {
  GRID_STRIDE(i, n) store_from_f32(dst, dt, i, load_as_f32(src, st, i));
}
__global__ void accumulate_k(void* dst, DType dt, const float* src, int64_t n) {
  GRID_STRIDE(i, n) store_from_f32(dst, dt, i, load_as_f32(dst, dt, i) + src[i]);
}
__global__ void fill_k(void* x, DType t, float v, int64_t n) { GRID_STRIDE(i, n) store_from_f32(x, t, i, v); }
// sum_squares_k over any float dtype: the element widened to fp32 (exact), squared in double.
__global__ void sum_squares_typed_k(double* out, const void* x, DType t, int64_t n) {
  double s = 0.0;
  GRID_STRIDE(i, n) {
    const double v = load_as_f32(x, t, i);
    s += v * v;
  }
  block_sum_to(out, s);
}
inline bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

// ------------------------------------------------------------------ the backend
cudaDataType_t lt_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: throw std::invalid_argument(std::string("cuda backend: no GEMM for dtype ") + dtype_name(t));
  }
}

// This rank's GPU: its local rank on the node (Open MPI, Slurm, torchrun's variable) modulo the
// GPUs it sees, so that 8 ranks on an 8-GPU node take one GPU each and ranks outnumbering the
// GPUs share them (the host-staged communicator then carries their traffic, gpu_comm.h).
int local_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 1) return 0;
  for (const char* v : {"OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID", "MPI_LOCALRANKID", "LOCAL_RANK"})
    if (const char* e = std::getenv(v); e && *e) return std::atoi(e) % count;
  return 0;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() : device_(local_device()) {
    CU_CHECK(cudaSetDevice(device_));
    CU_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    LT_CHECK(lt_api().Create(&lt_));
    CU_CHECK(cudaMalloc(&workspace_, kWorkspace));
    CU_CHECK(cudaMalloc(&scratch_, kScratchBytes));
    CU_CHECK(cudaMalloc(&widened_, kWidenedBiasFloats * sizeof(float)));
    widened_n_ = kWidenedBiasFloats;
    // kFixedWorkspaceBytes (cuda_workspace.h): the plan of a GPU device adds the same figure.
    MemoryTracker::instance().on_alloc(Account::Workspace, kFixedWorkspaceBytes);
    // Tensor memory: the device's stream-ordered pool, told to keep what it frees (a release
    // threshold of "never"), so steady-state steps allocate from its cache, not the driver.
    CU_CHECK(cudaDeviceGetDefaultMemPool(&pool_, device_));
    uint64_t keep = UINT64_MAX;
    CU_CHECK(cudaMemPoolSetAttribute(pool_, cudaMemPoolAttrReleaseThreshold, &keep));
    for (int i = 0; i < kStageSlots; ++i) {
      CU_CHECK(cudaMallocHost(&stage_[i], kStageBytes));
      CU_CHECK(cudaEventCreateWithFlags(&stage_done_[i], cudaEventDisableTiming));
    }
    // The kernel table: no KV-cache entries (generation runs with --no-kv-cache here).
    provide<k::Convert>(DType::F32, [this](const k::Convert& q) { convert(q.dst, q.dt, q.src, q.st, q.n); });
    provide<k::Accumulate>(DType::F32, [this](const k::Accumulate& q) { accumulate(q.dst, q.dt, static_cast<const float*>(q.src), q.n); });
    provide_fp32_members(this);
    provide<k::Fill>(DType::F32, [this](const k::Fill& q) { fill(q.x, q.t, q.v, q.n); });
    for (DType t : {DType::BF16, DType::F16})
      provide<k::MatmulForward>(t, [this, t](const k::MatmulForward& q) { matmul_forward_narrow(static_cast<float*>(q.out), q.inp, q.weight, q.bias, t, q.N, q.C, q.OC); }, narrow_gemm_ok);
    for (DType t : {DType::BF16, DType::F16})
      provide<k::MatmulBackward>(t, [this, t](const k::MatmulBackward& q) { matmul_backward_narrow(static_cast<float*>(q.dinp), static_cast<float*>(q.dweight), static_cast<float*>(q.dbias), q.dout, q.inp, q.weight, t, q.N, q.C, q.OC); }, narrow_gemm_ok);
#define OPS_CUDA_ACTIVATION(A, a) provide_activation<k::A##Forward, k::A##Backward, A##Formula>();
    OPS_ACTIVATIONS(OPS_CUDA_ACTIVATION)
#undef OPS_CUDA_ACTIVATION
    // What this backend does not fuse: the compositions (ops/backend.h), fp32 only (no
    // 16-bit-native kernels here: the executor widens).
    provide<k::LinearGeluForward>(DType::F32, [this](const k::LinearGeluForward& q) { linear_gelu_forward_composed(*this, q); });
    provide<k::AdamwUpdateZeroGrad>(DType::F32, [this](const k::AdamwUpdateZeroGrad& q) { adamw_update_zero_grad_composed(*this, q); });
    provide<k::AddLayerNormForward>(DType::F32, [this](const k::AddLayerNormForward& q) { add_layernorm_forward_composed(*this, q, DType::F32); });
    provide<k::AddLayerNormBackward>(DType::F32, [this](const k::AddLayerNormBackward& q) { add_layernorm_backward_composed(*this, q, DType::F32); });
    provide<k::AddRmsNormForward>(DType::F32, [this](const k::AddRmsNormForward& q) { add_rmsnorm_forward_composed(*this, q, DType::F32); });
    provide<k::AddRmsNormBackward>(DType::F32, [this](const k::AddRmsNormBackward& q) { add_rmsnorm_backward_composed(*this, q, DType::F32); });
  }
  ~CudaBackend() override {
    // Process exit: the driver may already be shutting down, so errors are ignored here.
    for (int i = 0; i < kStageSlots; ++i) {
      cudaFreeHost(stage_[i]);
      cudaEventDestroy(stage_done_[i]);
    }
    cudaFree(workspace_);
    cudaFree(scratch_);
    cudaFree(widened_);
    lt_api().Destroy(lt_);
    cudaStreamDestroy(stream_);
  }
  const char* name() const override { return "cuda"; }
  cudaStream_t stream() const { return stream_; }
  cudaMemPool_t pool() const { return pool_; }

  // ---- memory and the queue (ops/backend.h): everything on the compute stream, in order ----
  bool host_memory() const override { return false; }
  void* mem_alloc(size_t bytes) override {
    if (bytes == 0) return nullptr;
    void* p = nullptr;
    CU_CHECK(cudaMallocFromPoolAsync(&p, bytes, pool_, stream_));
    if (reinterpret_cast<uintptr_t>(p) % 64 != 0) throw std::logic_error("CUDA backend: pool block not 64-byte aligned");
    return p;
  }
  // Stream-ordered: the block returns to the pool after every kernel queued before this call.
  void mem_free(void* p, size_t /*bytes*/) override {
    if (p) CU_CHECK(cudaFreeAsync(p, stream_));
  }
  void mem_zero(void* p, size_t bytes) override {
    if (bytes) CU_CHECK(cudaMemsetAsync(p, 0, bytes, stream_));
  }
  void copy(void* dst, const void* src, size_t bytes) override {
    if (bytes) CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_));
  }
  void copy_in(void* dst, const void* src, size_t bytes) override { stage_in(dst, src, bytes); }
  // dst holds the bytes after synchronize() (pinned dst: truly asynchronous; pageable: CUDA
  // waits for the stream before it returns, which the contract allows).
  void copy_out(void* dst, const void* src, size_t bytes) override {
    if (bytes) CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream_));
  }
  void synchronize() override { CU_CHECK(cudaStreamSynchronize(stream_)); }

  // ---- generic kernels over any float storage dtype ----
  void convert(void* dst, DType dt, const void* src, DType st, int64_t n) {
    REQUIRE_ARG(is_float_dtype(dt) && is_float_dtype(st),
                std::string("convert ") + dtype_name(st) + " -> " + dtype_name(dt) + ": not a float format");
    if (n <= 0) return;
    if (dt == st) return copy(dst, src, static_cast<size_t>(n) * dtype_size(dt));
    convert_k<<<blocks_for(n), kThreads, 0, stream_>>>(dst, dt, src, st, n);
    LAUNCH_CHECK();
  }
  void accumulate(void* dst, DType dt, const float* src, int64_t n) {
    REQUIRE_ARG(is_float_dtype(dt), std::string("accumulate into ") + dtype_name(dt));
    if (n <= 0) return;
    if (dt == DType::F32) return add_inplace(static_cast<float*>(dst), src, n);
    accumulate_k<<<blocks_for(n), kThreads, 0, stream_>>>(dst, dt, src, n);
    LAUNCH_CHECK();
  }
  double sum_squares_typed(const void* x, DType t, int64_t n) {
    REQUIRE_ARG(is_float_dtype(t), std::string("sum_squares of ") + dtype_name(t));
    if (n <= 0) return 0;
    if (t == DType::F32) return sum_squares(static_cast<const float*>(x), n);
    double* acc = static_cast<double*>(scratch_);
    CU_CHECK(cudaMemsetAsync(acc, 0, sizeof(double), stream_));
    sum_squares_typed_k<<<std::min(blocks_for(n), 1024), kThreads, 0, stream_>>>(acc, x, t, n);
    LAUNCH_CHECK();
    double h = 0;
    CU_CHECK(cudaMemcpyAsync(&h, acc, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    CU_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }
  void fill(void* x, DType t, float v, int64_t n) {
    REQUIRE_ARG(is_float_dtype(t), std::string("fill of ") + dtype_name(t));
    if (n <= 0) return;
    fill_k<<<blocks_for(n), kThreads, 0, stream_>>>(x, t, v, n);
    LAUNCH_CHECK();
  }

  void embedding_shard_forward(float* out, const int32_t* tokens, const float* wte, const float* wpe, int B, int T,
                               int C, int vstart, int Vlocal) {
    const int64_t N = static_cast<int64_t>(B) * T;
    if (N == 0) return;
    embedding_fwd_k<<<N, kThreads, 0, stream_>>>(out, tokens, wte, wpe, N, T, C, vstart, Vlocal);
    LAUNCH_CHECK();
  }
  void embedding_shard_backward(float* dwte, float* dwpe, const float* dout, const int32_t* tokens, int B, int T,
                                int C, int vstart, int Vlocal) {
    const int64_t N = static_cast<int64_t>(B) * T;
    if ((!dwte && !dwpe) || N == 0) return;
    embedding_bwd_k<<<N, kThreads, 0, stream_>>>(dwte, dwpe, dout, tokens, N, T, C, vstart, Vlocal);
    LAUNCH_CHECK();
  }

  void layernorm_forward(float* out, float* mean, float* rstd, const float* inp, const float* weight,
                         const float* bias, int N, int C, float eps) {
    if (N == 0) return;
    layernorm_fwd_k<<<N, kThreads, 0, stream_>>>(out, mean, rstd, inp, weight, bias, C, eps);
    LAUNCH_CHECK();
  }
  void layernorm_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                          const float* weight, const float* mean, const float* rstd, int N, int C) {
    if (N == 0) return;
    if (dinp) {
      layernorm_bwd_dx_k<<<N, kThreads, 0, stream_>>>(dinp, dout, inp, weight, mean, rstd, C);
      LAUNCH_CHECK();
    }
    if (dweight || dbias) {
      dim3 grid((C + kThreads - 1) / kThreads, (N + kRowsPerChunk - 1) / kRowsPerChunk);
      norm_bwd_dw_k<<<grid, kThreads, 0, stream_>>>(dweight, dbias, dout, inp, mean, rstd, N, C);
      LAUNCH_CHECK();
    }
  }
  void rmsnorm_forward(float* out, float* rstd, const float* inp, const float* weight, int N, int C,
                       float eps) {
    if (N == 0) return;
    rmsnorm_fwd_k<<<N, kThreads, 0, stream_>>>(out, rstd, inp, weight, C, eps);
    LAUNCH_CHECK();
  }
  void rmsnorm_backward(float* dinp, float* dweight, const float* dout, const float* inp, const float* weight,
                        const float* rstd, int N, int C) {
    if (N == 0) return;
    if (dinp) {
      rmsnorm_bwd_dx_k<<<N, kThreads, 0, stream_>>>(dinp, dout, inp, weight, rstd, C);
      LAUNCH_CHECK();
    }
    if (dweight) {
      dim3 grid((C + kThreads - 1) / kThreads, (N + kRowsPerChunk - 1) / kRowsPerChunk);
      norm_bwd_dw_k<<<grid, kThreads, 0, stream_>>>(dweight, nullptr, dout, inp, nullptr, rstd, N, C);
      LAUNCH_CHECK();
    }
  }

  // Row-major GEMMs as column-major cuBLASLt calls (a row-major (R,C) matrix is a column-major
  // (C,R) one): out (N,OC) = inp (N,C) @ W(OC,C)^T is out^T = op_T(W) inp^T, m=OC, n=N, k=C.
  void matmul_forward(float* out, const float* inp, const float* weight, const float* bias, int N, int C,
                      int OC) {
    gemm(DType::F32, true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f, bias,
         bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, nullptr);
  }
  void matmul_backward(float* dinp, float* dweight, float* dbias, const float* dout, const float* inp,
                       const float* weight, int N, int C, int OC) {
    backward_gemms(DType::F32, dinp, dweight, dout, inp, weight, N, C, OC);
    if (dbias) bias_backward<float>(dbias, dout, N, OC);
  }
  static bool narrow_gemm_ok(DType t) { return t == DType::BF16 || t == DType::F16; }
  void matmul_forward_narrow(float* out, const void* inp, const void* weight, const void* bias, DType t, int N, int C,
                        int OC) {
    REQUIRE_ARG(narrow_gemm_ok(t), "matmul16 needs bf16 or fp16");
    float* b32 = nullptr;
    if (bias) b32 = widen(bias, t, OC);
    gemm(t, true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f, b32,
         bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT, nullptr);
  }
  void matmul_backward_narrow(float* dinp, float* dweight, float* dbias, const void* dout, const void* inp,
                         const void* weight, DType t, int N, int C, int OC) {
    REQUIRE_ARG(narrow_gemm_ok(t), "matmul16 needs bf16 or fp16");
    backward_gemms(t, dinp, dweight, dout, inp, weight, N, C, OC);
    if (dbias) {
      if (t == DType::BF16) bias_backward<__nv_bfloat16>(dbias, dout, N, OC);
      else bias_backward<__half>(dbias, dout, N, OC);
    }
  }
  void matmul_bias_gelu(float* out, float* pre, const float* inp, const float* weight, const float* bias, int N,
                        int C, int OC) {
    gemm(DType::F32, true, false, OC, N, C, weight, C, inp, C, out, OC, 0.0f, bias, CUBLASLT_EPILOGUE_GELU_AUX_BIAS,
         pre);
  }

  void rope_forward(float* out, const float* inp, int B, int T, int C, Heads heads, float theta) {
    rope(out, inp, B, T, C, heads, theta, false);
  }
  void rope_backward(float* dinp, const float* dout, int B, int T, int C, Heads heads, float theta) {
    if (dinp) rope(dinp, dout, B, T, C, heads, theta, true);
  }

  void attention_forward(float* out, float* lse, const float* qkv, int B, int T, int C, Heads heads,
                         DropoutSpec drop) {
    check_attention(B, T, C, heads, drop);
    dim3 grid(T, B * heads.q);
    const size_t shm = attention_shared(attention_fwd_k, T, 1);
    attention_fwd_k<<<grid, kAttnThreads, shm, stream_>>>(out, lse, qkv, T, C, heads, drop.p, drop.key,
                                                           HeadCtr{drop.offset, drop.heads_total, drop.head_start});
    LAUNCH_CHECK();
  }
  // Grouped-query attention: the atomics already sum a group's dK and dV, so `work` is unused.
  void attention_backward(float* dqkv, const float* dout, const float* qkv, const float* lse, int B, int T, int C,
                          Heads heads, DropoutSpec drop, float* /*work*/) {
    if (!dqkv) return;
    check_attention(B, T, C, heads, drop);
    dim3 grid(T, B * heads.q);
    const size_t shm = attention_shared(attention_bwd_k, T, 2);
    attention_bwd_k<<<grid, kAttnThreads, shm, stream_>>>(dqkv, dout, qkv, lse, T, C, heads, drop.p, drop.key,
                                                          HeadCtr{drop.offset, drop.heads_total, drop.head_start});
    LAUNCH_CHECK();
  }
  // Dynamic shared memory of an attention kernel keeping `rows` rows of T floats, raising the
  // kernel's limit past the default 48 KiB when it needs more.
  template <typename Kernel>
  static size_t attention_shared(Kernel kernel, int T, int rows) {
    const size_t shm = sizeof(float) * static_cast<size_t>(T) * rows;
    if (shm > 48 * 1024)
      CU_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(shm)));
    return shm;
  }

  template <class Fwd, class Bwd, class F> void provide_activation() {
    provide<Fwd>(DType::F32, [this](const Fwd& q) {
      if (q.n == 0) return;
      activation_fwd_k<F><<<blocks_for(q.n), kThreads, 0, stream_>>>(static_cast<float*>(q.out), static_cast<const float*>(q.inp), q.n);
      LAUNCH_CHECK();
    });
    provide<Bwd>(DType::F32, [this](const Bwd& q) {
      if (!q.dinp || q.n == 0) return;
      activation_bwd_k<F><<<blocks_for(q.n), kThreads, 0, stream_>>>(static_cast<float*>(q.dinp), static_cast<const float*>(q.inp),
                                                                   static_cast<const float*>(q.dout), q.n);
      LAUNCH_CHECK();
    });
  }
  void linear_gelu_backward(float* dinp, float* dweight, float* dbias, float* dpre, const float* pre, const float* inp,
                            const float* weight, int N, int C, int OC) {
    const int64_t n = static_cast<int64_t>(N) * OC;
    if (n > 0) {
      gelu_bwd_inplace_k<<<blocks_for(n), kThreads, 0, stream_>>>(dpre, pre, n);
      LAUNCH_CHECK();
    }
    matmul_backward(dinp, dweight, dbias, dpre, inp, weight, N, C, OC);
  }
  void swiglu_forward(float* out, const float* inp, int N, int H) {
    const int64_t n = static_cast<int64_t>(N) * H;
    if (n == 0) return;
    swiglu_fwd_k<<<blocks_for(n), kThreads, 0, stream_>>>(out, inp, N, H);
    LAUNCH_CHECK();
  }
  void swiglu_backward(float* dinp, const float* dout, const float* inp, int N, int H) {
    const int64_t n = static_cast<int64_t>(N) * H;
    if (!dinp || n == 0) return;
    swiglu_bwd_k<<<blocks_for(n), kThreads, 0, stream_>>>(dinp, dout, inp, N, H);
    LAUNCH_CHECK();
  }
  void add_forward(float* out, const float* a, const float* b, int64_t n) {
    if (n == 0) return;
    add_k<<<blocks_for(n), kThreads, 0, stream_>>>(out, a, b, n);
    LAUNCH_CHECK();
  }
  void add_inplace(float* dst, const float* src, int64_t n) {
    if (!dst || n == 0) return;
    add_inplace_k<<<blocks_for(n), kThreads, 0, stream_>>>(dst, src, n);
    LAUNCH_CHECK();
  }
  void dropout_forward(float* out, const float* inp, int64_t n, DropoutSpec drop) {
    check_p(drop.p);
    if (n == 0) return;
    if (drop.p <= 0.0f) {
      if (out != inp) CU_CHECK(cudaMemcpyAsync(out, inp, sizeof(float) * n, cudaMemcpyDeviceToDevice, stream_));
      return;
    }
    dropout_fwd_k<<<blocks_for(n), kThreads, 0, stream_>>>(out, inp, n, drop.key, drop.offset, drop.p,
                                                            1.0f / (1.0f - drop.p));
    LAUNCH_CHECK();
  }
  void dropout_backward(float* dinp, const float* dout, int64_t n, DropoutSpec drop) {
    if (!dinp) return;
    check_p(drop.p);
    if (drop.p <= 0.0f) return add_inplace(dinp, dout, n);
    if (n == 0) return;
    dropout_bwd_k<<<blocks_for(n), kThreads, 0, stream_>>>(dinp, dout, n, drop.key, drop.offset, drop.p,
                                                            1.0f / (1.0f - drop.p));
    LAUNCH_CHECK();
  }

  void softmax_xent_forward(float* losses, float* probs, const float* logits, const int32_t* targets, int N, int V,
                            int Vreal) {
    REQUIRE_ARG(Vreal > 0 && Vreal <= V, "softmax_xent: need 0 < Vreal <= V, got Vreal=" + std::to_string(Vreal) +
                                             " V=" + std::to_string(V));
    if (N == 0) return;
    int* bad = reset_flag();
    softmax_xent_fwd_k<<<N, kThreads, 0, stream_>>>(losses, probs, logits, targets, V, Vreal, bad);
    LAUNCH_CHECK();
    if (int row = read_flag()) throw std::runtime_error("softmax_xent: target >= Vreal " + std::to_string(Vreal) +
                                                         " in row " + std::to_string(row - 1));
  }
  void softmax_xent_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V,
                             int Vreal) {
    if (!dlogits || N == 0) return;
    softmax_xent_bwd_k<<<N, kThreads, 0, stream_>>>(dlogits, probs, targets, dloss, V, Vreal, 0);
    LAUNCH_CHECK();
  }
  void xent_shard_max(float* rowmax, const float* logits, int N, int V, int Vreal) {
    check_shard(V, Vreal);
    if (N == 0) return;
    xent_shard_max_k<<<N, kThreads, 0, stream_>>>(rowmax, logits, V, Vreal);
    LAUNCH_CHECK();
  }
  void xent_shard_sumexp(float* sumexp, float* tlogit, const float* logits, const float* rowmax,
                         const int32_t* targets, int N, int V, int Vreal, int vstart) {
    check_shard(V, Vreal);
    if (N == 0) return;
    int* bad = reset_flag();
    xent_shard_sumexp_k<<<N, kThreads, 0, stream_>>>(sumexp, tlogit, logits, rowmax, targets, V, Vreal, vstart, bad);
    LAUNCH_CHECK();
    if (int row = read_flag())
      throw std::runtime_error("xent_shard: the target of row " + std::to_string(row - 1) +
                               " is a padding column of the shard starting at " + std::to_string(vstart));
  }
  void xent_shard_finish(float* losses, float* probs, const float* logits, const float* rowmax, const float* sumexp,
                         const float* tlogit, const int32_t* targets, int N, int V, int Vreal) {
    check_shard(V, Vreal);
    if (N == 0) return;
    xent_shard_finish_k<<<N, kThreads, 0, stream_>>>(losses, probs, logits, rowmax, sumexp, tlogit, targets, V, Vreal);
    LAUNCH_CHECK();
  }
  void xent_shard_backward(float* dlogits, const float* probs, const int32_t* targets, float dloss, int N, int V,
                           int Vreal, int vstart) {
    if (!dlogits || N == 0) return;
    check_shard(V, Vreal);
    softmax_xent_bwd_k<<<N, kThreads, 0, stream_>>>(dlogits, probs, targets, dloss, V, Vreal, vstart);
    LAUNCH_CHECK();
  }

  void adamw_update(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
                    float beta2, float eps, float weight_decay, int64_t t, float grad_scale) {
    REQUIRE_ARG(t >= 1, "adamw_update: step t must be >= 1, got " + std::to_string(t));
    if (n == 0) return;
    const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta1), static_cast<double>(t))));
    const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(beta2), static_cast<double>(t))));
    adamw_k<<<blocks_for(n), kThreads, 0, stream_>>>(param, grad, m, v, n, lr, beta1, beta2, eps, weight_decay, inv_bc1,
                                                      inv_bc2, grad_scale);
    LAUNCH_CHECK();
  }
  void adamw_update_typed(void* param, DType pt, const void* grad, DType gt, float* master, float* m, float* v,
                          int64_t n, const AdamwArgs& a) {
    REQUIRE_ARG(a.t >= 1, "adamw_update_typed: step t must be >= 1, got " + std::to_string(a.t));
    if (n == 0) return;
    if (pt == DType::F32 && gt == DType::F32 && !master) {
      adamw_update(static_cast<float*>(param), static_cast<const float*>(grad), m, v, n, a.lr, a.beta1, a.beta2, a.eps,
                   a.weight_decay, a.t, a.grad_scale);
      return;
    }
    const float inv_bc1 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(a.beta1), static_cast<double>(a.t))));
    const float inv_bc2 = static_cast<float>(1.0 / (1.0 - std::pow(static_cast<double>(a.beta2), static_cast<double>(a.t))));
    auto launch = [&](auto* p, auto* g) {
      adamw_typed_k<<<blocks_for(n), kThreads, 0, stream_>>>(p, g, master, m, v, n, a.lr, a.beta1, a.beta2, a.eps,
                                                             a.weight_decay, inv_bc1, inv_bc2, a.grad_scale);
    };
    auto with_grad = [&](auto* p) {
      if (gt == DType::F32) launch(p, static_cast<const float*>(grad));
      else if (gt == DType::BF16) launch(p, static_cast<const __nv_bfloat16*>(grad));
      else if (gt == DType::F16) launch(p, static_cast<const __half*>(grad));
      else REQUIRE_ARG(false, "adamw_update_typed: a gradient of a float dtype");
    };
    if (pt == DType::F32) with_grad(static_cast<float*>(param));
    else if (pt == DType::BF16) with_grad(static_cast<__nv_bfloat16*>(param));
    else if (pt == DType::F16) with_grad(static_cast<__half*>(param));
    else REQUIRE_ARG(false, "adamw_update_typed: a parameter of a float dtype");
    LAUNCH_CHECK();
  }
  double sum_squares(const float* x, int64_t n) {
    double* acc = static_cast<double*>(scratch_);
    CU_CHECK(cudaMemsetAsync(acc, 0, sizeof(double), stream_));
    if (n > 0) {
      sum_squares_k<<<std::min(blocks_for(n), 1024), kThreads, 0, stream_>>>(acc, x, n);
      LAUNCH_CHECK();
    }
    double h = 0.0;
    CU_CHECK(cudaMemcpyAsync(&h, acc, sizeof(double), cudaMemcpyDeviceToHost, stream_));
    CU_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }
  void scale(float* x, int64_t n, float s) {
    if (n == 0) return;
    scale_k<<<blocks_for(n), kThreads, 0, stream_>>>(x, n, s);
    LAUNCH_CHECK();
  }

  // Staging for checkpoints: page-locked host buffers, copied into
  // on a copy stream of its own so the training stream keeps running while a save drains.
  void* alloc_pinned(size_t bytes) override {
    void* p = nullptr;
    CU_CHECK(cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocDefault));
    return p;
  }
  void free_pinned(void* p, size_t) override { CU_CHECK(cudaFreeHost(p)); }
  // The copy stream waits for what the training stream queued so far; the training stream's
  // later kernels (the optimizer writing `src`) wait for the copy on the device, never the host.
  void stage_out(void* dst, const void* src, size_t bytes) override {
    if (!bytes) return;
    std::lock_guard<std::mutex> lock(side_mutex_);
    if (!copy_stream_) CU_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    cudaEvent_t before = nullptr, after = nullptr;
    CU_CHECK(cudaEventCreateWithFlags(&before, cudaEventDisableTiming));
    CU_CHECK(cudaEventCreateWithFlags(&after, cudaEventDisableTiming));
    CU_CHECK(cudaEventRecord(before, stream_));
    CU_CHECK(cudaStreamWaitEvent(copy_stream_, before, 0));
    CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, copy_stream_));
    CU_CHECK(cudaEventRecord(after, copy_stream_));
    CU_CHECK(cudaStreamWaitEvent(stream_, after, 0));
    cudaEventDestroy(before);  // released once recorded work completes
    cudaEventDestroy(after);
  }
  uint64_t stage_fence() override {
    std::lock_guard<std::mutex> lock(side_mutex_);
    if (!copy_stream_) CU_CHECK(cudaStreamCreateWithFlags(&copy_stream_, cudaStreamNonBlocking));
    cudaEvent_t e = nullptr;
    CU_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    CU_CHECK(cudaEventRecord(e, copy_stream_));
    fences_[++fence_next_] = e;
    return fence_next_;
  }
  void stage_wait(uint64_t fence) override {
    cudaEvent_t e = nullptr;
    {
      std::lock_guard<std::mutex> lock(side_mutex_);
      auto it = fences_.find(fence);
      if (it == fences_.end()) throw std::logic_error("cuda backend: stage_wait of an unknown fence");
      e = it->second;
      fences_.erase(it);
    }
    const cudaError_t rc = cudaEventSynchronize(e);
    cudaEventDestroy(e);
    CU_CHECK(rc);
  }

 private:
  std::mutex side_mutex_;  // the checkpoint staging's copy stream and fences
  cudaStream_t copy_stream_ = nullptr;
  std::map<uint64_t, cudaEvent_t> fences_;
  uint64_t fence_next_ = 0;
  static constexpr size_t kWorkspace = kGemmWorkspaceBytes;
  // copy_in's pinned staging slots: the host bytes are copied into a slot before the call
  // returns (so the caller may reuse its buffer at once, pageable or pinned), and the slot's
  // DMA runs on the stream; a slot is refilled after its previous DMA finished (its event).
  static constexpr int kStageSlots = 2;
  static constexpr size_t kStageBytes = 4u << 20;
  int device_ = 0;  // local_device(), set in the constructor before anything else
  cudaStream_t stream_ = nullptr;
  cudaMemPool_t pool_ = nullptr;
  void* stage_[kStageSlots] = {};
  cudaEvent_t stage_done_[kStageSlots] = {};
  int stage_next_ = 0;
  std::mutex stage_mutex_;
  void stage_in(void* dst, const void* src, size_t bytes) {
    std::lock_guard<std::mutex> lock(stage_mutex_);
    for (size_t off = 0; off < bytes; off += kStageBytes) {
      const size_t m = std::min(kStageBytes, bytes - off);
      const int slot = stage_next_;
      stage_next_ = (stage_next_ + 1) % kStageSlots;
      CU_CHECK(cudaEventSynchronize(stage_done_[slot]));
      std::memcpy(stage_[slot], static_cast<const char*>(src) + off, m);
      CU_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + off, stage_[slot], m, cudaMemcpyHostToDevice, stream_));
      CU_CHECK(cudaEventRecord(stage_done_[slot], stream_));
    }
  }
  cublasLtHandle_t lt_ = nullptr;
  void* workspace_ = nullptr;
  void* scratch_ = nullptr;  // 64 bytes: sum_squares' double, the loss kernels' error flag
  std::mutex widen_mutex_;
  float* widened_ = nullptr;  // 16-bit bias widened to fp32 (kWidenedBiasFloats, grown past it; Workspace account)
  size_t widened_n_ = 0;

  static void check_p(float p) {
    REQUIRE_ARG(p >= 0.0f && p < 1.0f, "dropout: p must be in [0, 1), got " + std::to_string(p));
  }
  static void check_shard(int V, int Vreal) {
    REQUIRE_ARG(V > 0 && Vreal >= 0 && Vreal <= V, "xent_shard: need 0 <= Vreal <= V, got Vreal=" +
                                                       std::to_string(Vreal) + " V=" + std::to_string(V));
  }
  static void check_attention(int B, int T, int C, Heads heads, const DropoutSpec& drop) {
    const int NH = heads.q;
    REQUIRE_ARG(B > 0 && T > 0 && C > 0 && NH > 0 && C % NH == 0 && heads.valid(), "attention: bad shape");
    REQUIRE_ARG(C / NH <= kMaxHS && C / NH <= kAttnThreads, "attention: head size above " + std::to_string(kMaxHS));
    REQUIRE_ARG(T <= kMaxAttnT, "attention: sequence above " + std::to_string(kMaxAttnT));
    check_p(drop.p);
    REQUIRE_ARG(drop.heads_total > 0 ? drop.head_start >= 0 && drop.head_start + NH <= drop.heads_total
                                     : drop.heads_total == 0 && drop.head_start == 0,
                "attention: head shard outside heads_total");
  }
  int* reset_flag() {
    int* flag = reinterpret_cast<int*>(static_cast<char*>(scratch_) + 32);
    CU_CHECK(cudaMemsetAsync(flag, 0, sizeof(int), stream_));
    return flag;
  }
  int read_flag() {
    int h = 0;
    CU_CHECK(cudaMemcpyAsync(&h, static_cast<char*>(scratch_) + 32, sizeof(int), cudaMemcpyDeviceToHost, stream_));
    CU_CHECK(cudaStreamSynchronize(stream_));
    return h;
  }
  float* widen(const void* src, DType t, int64_t n) {
    std::lock_guard<std::mutex> lock(widen_mutex_);
    if (widened_n_ < static_cast<size_t>(n)) {
      if (widened_) {
        CU_CHECK(cudaStreamSynchronize(stream_));
        CU_CHECK(cudaFree(widened_));
        MemoryTracker::instance().on_free(Account::Workspace, widened_n_ * sizeof(float));
      }
      CU_CHECK(cudaMalloc(&widened_, sizeof(float) * n));
      widened_n_ = static_cast<size_t>(n);
      MemoryTracker::instance().on_alloc(Account::Workspace, widened_n_ * sizeof(float));
    }
    if (t == DType::BF16) widen_k<<<blocks_for(n), kThreads, 0, stream_>>>(widened_, static_cast<const __nv_bfloat16*>(src), n);
    else widen_k<<<blocks_for(n), kThreads, 0, stream_>>>(widened_, static_cast<const __half*>(src), n);
    LAUNCH_CHECK();
    return widened_;
  }
  template <class T>
  void bias_backward(float* dbias, const void* dout, int N, int OC) {
    if (N == 0) return;
    dim3 grid((OC + kThreads - 1) / kThreads, (N + kRowsPerChunk - 1) / kRowsPerChunk);
    bias_bwd_k<T><<<grid, kThreads, 0, stream_>>>(dbias, static_cast<const T*>(dout), N, OC);
    LAUNCH_CHECK();
  }
  // dinp (N,C) += dout (N,OC) @ W (OC,C): dinp^T = W^T dout^T, m=C, n=N, k=OC, both op N.
  // dW (OC,C) += dout^T @ inp: dW^T = inp^T dout, m=C, n=OC, k=N, op(B) = T.
  void backward_gemms(DType t, float* dinp, float* dweight, const void* dout, const void* inp, const void* weight,
                      int N, int C, int OC) {
    if (dinp) gemm(t, false, false, C, N, OC, weight, C, dout, OC, dinp, C, 1.0f, nullptr, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
    if (dweight) gemm(t, false, true, C, OC, N, inp, C, dout, OC, dweight, C, 1.0f, nullptr, CUBLASLT_EPILOGUE_DEFAULT, nullptr);
  }
  // D (m,n) fp32 col-major = op(A) op(B) + beta D (+ bias[m] epilogue); A and B of dtype t,
  // fp32 compute (CUBLAS_COMPUTE_32F: no TF32 for fp32 operands, the CPU's arithmetic).
  void gemm(DType t, bool ta, bool tb, int m, int n, int k, const void* A, int lda, const void* B, int ldb, float* D,
            int ldd, float beta, const float* bias, cublasLtEpilogue_t epi, float* aux) {
    if (m == 0 || n == 0) return;
    if (k == 0) {
      if (beta == 0.0f) CU_CHECK(cudaMemset2DAsync(D, sizeof(float) * ldd, 0, sizeof(float) * m, n, stream_));
      return;
    }
    const cudaDataType_t ab = lt_type(t);
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, ld = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    LT_CHECK(lt_api().MatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t opa = ta ? CUBLAS_OP_T : CUBLAS_OP_N, opb = tb ? CUBLAS_OP_T : CUBLAS_OP_N;
    LT_CHECK(lt_api().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &opa, sizeof(opa)));
    LT_CHECK(lt_api().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &opb, sizeof(opb)));
    if (epi != CUBLASLT_EPILOGUE_DEFAULT) {
      LT_CHECK(lt_api().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof(epi)));
      LT_CHECK(lt_api().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
      cudaDataType_t bt = CUDA_R_32F;
      LT_CHECK(lt_api().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof(bt)));
      if (aux) {
        int64_t aux_ld = ldd;
        LT_CHECK(lt_api().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
        LT_CHECK(lt_api().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
        cudaDataType_t at = CUDA_R_32F;
        LT_CHECK(lt_api().MatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &at, sizeof(at)));
      }
    }
    LT_CHECK(lt_api().MatrixLayoutCreate(&la, ab, ta ? k : m, ta ? m : k, lda));
    LT_CHECK(lt_api().MatrixLayoutCreate(&lb, ab, tb ? n : k, tb ? k : n, ldb));
    LT_CHECK(lt_api().MatrixLayoutCreate(&ld, CUDA_R_32F, m, n, ldd));
    LT_CHECK(lt_api().MatmulPreferenceCreate(&pref));
    size_t ws = kWorkspace;
    LT_CHECK(lt_api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    // The heuristic assumes 256-byte aligned operands unless told: views into flat parameter
    // and gradient buffers are often less aligned, so pass each pointer's actual alignment.
    auto align_of = [](const void* ptr) {
      uint32_t a = 256;
      while (a > 1 && reinterpret_cast<uintptr_t>(ptr) % a) a >>= 1;
      return a;
    };
    const uint32_t aa = align_of(A), ab_ = align_of(B), ad = align_of(D);
    LT_CHECK(lt_api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa)));
    LT_CHECK(lt_api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab_, sizeof(ab_)));
    LT_CHECK(lt_api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ad, sizeof(ad)));
    LT_CHECK(lt_api().MatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ad, sizeof(ad)));
    cublasLtMatmulHeuristicResult_t heur{};
    int found = 0;
    LT_CHECK(lt_api().MatmulAlgoGetHeuristic(lt_, op, la, lb, ld, ld, pref, 1, &heur, &found));
    const float alpha = 1.0f;
    cublasStatus_t st = found ? lt_api().Matmul(lt_, op, &alpha, A, la, B, lb, &beta, D, ld, D, ld, &heur.algo,
                                               workspace_, kWorkspace, stream_)
                              : CUBLAS_STATUS_NOT_SUPPORTED;
    lt_api().MatmulPreferenceDestroy(pref);
    lt_api().MatrixLayoutDestroy(ld);
    lt_api().MatrixLayoutDestroy(lb);
    lt_api().MatrixLayoutDestroy(la);
    lt_api().MatmulDescDestroy(op);
    if (!found)
      throw std::runtime_error("CUDA backend: cuBLASLt has no algorithm for a " + std::string(dtype_name(t)) + " GEMM " +
                               std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k));
    LT_CHECK(st);
  }
  void rope(float* dst, const float* src, int B, int T, int C, Heads heads, float theta, bool inverse) {
    const int NH = heads.q;
    REQUIRE_ARG(NH > 0 && heads.kv > 0 && C % NH == 0 && (C / NH) % 2 == 0,
                "rope: head size C/NH must be even, got C=" + std::to_string(C) + " NH=" + std::to_string(NH));
    const int64_t N = static_cast<int64_t>(B) * T;
    if (N == 0) return;
    rope_k<<<blocks_for(N * C), kThreads, 0, stream_>>>(dst, src, N, T, C, NH, heads.kv, theta, inverse);
    LAUNCH_CHECK();
  }
};

CudaBackend* g_backend = nullptr;
std::once_flag g_once;

CudaBackend& backend_impl() {
  std::call_once(g_once, [] {
    std::string why;
    if (!device_available(&why)) throw std::runtime_error("no CUDA device was found: " + why);
    g_backend = new CudaBackend();  // lives until exit (CUDA tears down its own state)
  });
  return *g_backend;
}

}  // namespace

Backend& cuda_backend() { return backend_impl(); }

bool cublaslt_loadable(std::string* why) {
  try {
    lt_api();
    return true;
  } catch (const std::exception& e) {
    if (why) *why = e.what();
    return false;
  }
}

DeviceBuffer::DeviceBuffer(size_t bytes, Account account, bool zero) : bytes_(bytes), account_(account) {
  if (bytes == 0) return;
  CU_CHECK(cudaMalloc(&ptr_, bytes));
  if (zero) CU_CHECK(cudaMemset(ptr_, 0, bytes));
  MemoryTracker::instance().on_alloc(account, bytes);
}
DeviceBuffer::~DeviceBuffer() {
  if (!ptr_) return;
  cudaFree(ptr_);  // synchronizes with the device
  MemoryTracker::instance().on_free(account_, bytes_);
}
DeviceBuffer::DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_), account_(o.account_) {
  o.ptr_ = nullptr;
  o.bytes_ = 0;
}
DeviceBuffer& DeviceBuffer::operator=(DeviceBuffer&& o) noexcept {
  if (this != &o) {
    this->~DeviceBuffer();
    ptr_ = o.ptr_;
    bytes_ = o.bytes_;
    account_ = o.account_;
    o.ptr_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void copy_to_device(void* dst, const void* src, size_t bytes) {
  cudaStream_t s = backend_impl().stream();
  CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, s));
  CU_CHECK(cudaStreamSynchronize(s));
}
void copy_to_host(void* dst, const void* src, size_t bytes) {
  cudaStream_t s = backend_impl().stream();
  CU_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, s));
  CU_CHECK(cudaStreamSynchronize(s));
}
void* compute_stream() { return backend_impl().stream(); }
void synchronize() { CU_CHECK(cudaStreamSynchronize(backend_impl().stream())); }
void memory_info(size_t* free_bytes, size_t* total_bytes) { CU_CHECK(cudaMemGetInfo(free_bytes, total_bytes)); }
DeviceMemory device_memory() {
  DeviceMemory m;
  uint64_t used = 0, reserved = 0;
  CU_CHECK(cudaMemPoolGetAttribute(backend_impl().pool(), cudaMemPoolAttrUsedMemCurrent, &used));
  CU_CHECK(cudaMemPoolGetAttribute(backend_impl().pool(), cudaMemPoolAttrReservedMemCurrent, &reserved));
  m.pool_used = used;
  m.pool_reserved = reserved;
  CU_CHECK(cudaMemGetInfo(&m.free, &m.total));
  return m;
}

void* alloc_pinned(size_t bytes) {
  void* p = nullptr;
  CU_CHECK(cudaMallocHost(&p, bytes));
  return p;
}
void free_pinned(void* p) {
  if (p) cudaFreeHost(p);
}

void matmul_bias_gelu_forward(Backend& be, float* out, float* pre, const float* inp, const float* weight,
                              const float* bias, int N, int C, int OC) {
  auto* cb = dynamic_cast<CudaBackend*>(&be);
  REQUIRE_ARG(cb, "matmul_bias_gelu_forward needs the CUDA backend");
  cb->matmul_bias_gelu(out, pre, inp, weight, bias, N, C, OC);
}

void nvtx_push(const char* name) { nvtxRangePushA(name); }
void nvtx_pop() { nvtxRangePop(); }

}  // namespace ops::cuda
