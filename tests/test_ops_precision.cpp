// Every operator in bf16 and fp16 through the Executor, forward and backward (input and
// parameter gradients), against float64 references written here, with tolerances derived
// from the formats' unit roundoff and the reduction lengths.
//
// What the executor promises (ops/executor.h): a 16-bit operand is widened exactly to fp32,
// the OpDef computes in fp32, and a 16-bit output is stored as RNE(fp32 result); an
// activation's gradient is stored as RNE(fp32 kernel gradient) in its dtype. A 16-bit
// parameter's per-node gradient is NOT rounded to the parameter's dtype: it is computed in fp32
// and added into the bound gradient buffer in the buffer's own dtype, unrounded into an fp32
// buffer (grad_accum fp32, the default: a fused fp32 weight-gradient accumulation, as
// Megatron-LM's main_grad) and rounded once per addition into a 16-bit buffer. This test binds
// zeroed buffers, so (one node, one addition) an fp32 buffer must hold exactly the fp32 kernel
// gradient v (0 + v = v is exact in fp32) and a 16-bit buffer exactly RNE16(v). Every case runs
// with fp32 buffers; where it has 16-bit parameters, a second run per format binds 16-bit
// buffers in the parameter's dtype and checks their gradients (the rest of that run must be
// bit-identical to the first). Tensors the model keeps in fp32 (norm statistics, the
// logits and the loss, attention's log-sum-exp; runner/model/gpt.cpp) are fp32 here too, and
// 16-bit tensors that a backward reads (Case::saved; none since attention stopped keeping its
// probabilities: the flash-style kernel recomputes them) are read back rounded.
//
// Notation. u = unit roundoff of the storage format: 2^-8 (bf16), 2^-11 (fp16); u32 = 2^-24;
// eta = the absolute rounding error below the normal range: 2^-25 for fp16 (half its smallest
// subnormal), 0 for bf16 (fp32's exponent range). f = the float64 reference, y = the
// executor's result, x the raw (float) inputs, x^ = x rounded to the format.
// A_i = sum_j |df_i/dx_j| |x_j| (over every float operand j, the output gradient included
// for a backward): the first-order size of f_i's response to relative perturbations of the
// inputs; for a dot product sum a_k b_k it is 2 sum |a_k b_k|. It is computed by central
// differences of the float64 reference (exact to ~1e-9 relative, far below u).
//
// Three checks per output tensor, each per element:
//  (A) representability, exact: y == RNE16(fp32 kernel result on x^), bit for bit, where the
//      fp32 result is the same OpDef run by the executor over an all-fp32 graph on x^ (for
//      attention's backward, the kernels called directly with the probabilities rounded as
//      the executor stores them). An fp32 output (the lm_head variant, the loss) must equal
//      the fp32 run exactly, and so must a parameter gradient in an fp32 buffer: y == the
//      fp32 run's gradient, bit for bit, no rounding (the all-fp32 graph's buffers are fp32
//      and zeroed too); in a 16-bit buffer, y == RNE16(that gradient), one rounding.
//      Linear's GEMM may instead read the 16-bit operands as stored (oneDNN, where the
//      process's measured GEMM path chose it) and accumulate in another order: there y must
//      be RNE of an fp32 value within both evaluations' fp32 error of the fp32 run's, or (an
//      fp32 output, a parameter gradient in an fp32 buffer) that value itself, unrounded:
//      |y - y32| <= w (see Case::gemm_order_free).
//  (B) the operator's own error, reference on the rounded inputs x^ (input rounding excluded):
//        |y - f(x^)| <= u|f| + eta + (1+u) E32,   E32 = (K+8) u32 A + 64 u32 max|f|
//      u|f| + eta: the one output rounding (RNE: half an ulp; 0 for an fp32 output).
//      (K+8) u32 A: fp32 evaluation, K = the reductions' lengths along the output's path
//      (a K-term dot product in any order is exact for inputs perturbed by gamma_K ~ K u32
//      relative; the 8 covers the few pointwise fp32 operations after it and the fp32
//      rounding of constants such as 1/sqrt(HS) and 1/(1-p)).
//      64 u32 max|f|: the tensor-scale allowance for fp32 transcendental evaluation (exp,
//      sigmoid, tanh-GELU, sin/cos tables: a few ulp each, times argument-size condition
//      numbers <= ~10 here), 128x smaller than the fp16 output rounding.
//      A 16-bit tensor read back by the backward (attention probabilities) adds its rounding
//      through the backward's sensitivity: 1.1 (u P + eta Pz), P_i = sum_k |dg_i/dp_k||p_k|,
//      Pz_i = sum_k |dg_i/dp_k| (1.1: the second-order remainder, at most u x the curvature x
//      input scale, i.e. a few percent here).
//      A parameter gradient in an fp32 buffer has no output rounding: y = 0 + v = v, the fp32
//      kernel result, so |y - f(x^)| = |v - f(x^)| <= E32, i.e. (B) loses the term u|f| + eta
//      and the factor (1+u) becomes 1 (that factor bounds the rounding of v's own error:
//      |RNE(v) - f| <= |RNE(v) - v| + |v - f| <= u|v| + eta + |v - f|
//      <= u|f| + eta + (1+u)|v - f|). It is the bound above with u = eta = 0 (the buffer's
//      format, fp32):  |y - f(x^)| <= E32 (+ the read-back term, none for a parameter here).
//      In a 16-bit buffer, y = RNE(0 + v) = RNE(v): the full bound, u and eta of its format.
//  (C) the whole path against f(x) on the raw inputs: (B)'s bound plus the input rounding
//        1.1 (u A_r + eta Z_r),  A_r, Z_r as A over the operands stored in 16 bits
//      (u, eta of the storage format: the operands are 16-bit whatever the gradient buffer).
//      So a parameter gradient in an fp32 buffer: |y - f(x)| <= E32 + 1.1 (u A_r + eta Z_r).
// Negative controls (they must FAIL, proving the checks are tight enough):
//  - RNE replaced by truncation (round toward zero) of the same fp32 result (for attention's
//    backward, of the stored probabilities too, as a truncating executor would): fails (B),
//    for outputs, activation gradients and parameter gradients in 16-bit buffers;
//  - under fp16, the fp32 result rounded to bf16 instead (a wrong format / rounding step):
//    fails (B);
//  - a parameter gradient rounded to its 16-bit dtype before it reaches the fp32 buffer (the
//    executor's former per-node rounding): RNE16 of the fp32 run's gradient must fail (A)
//    and the fp32-buffer (B) bound;
//  - Linear: a kernel that accumulates its dot products in 16 bits: fails (B).
// Reported per op and dtype: the maximum error / bound ratio of (B) and (C) (printed): forward,
// activation gradients ("bwd"), parameter gradients in fp32 and in 16-bit buffers, and the
// controls' ratios.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <stdexcept>
#include <string>
#include <vector>

#include "ops/convert.h"
#include "ops/executor.h"
#include "ops/gemm_path.h"
#include "ops/node_graph.h"
#include "ops/ops.h"
#include "ops/rng.h"

namespace {

using ops::DType;
using ops::OpKind;
using Vec = std::vector<float>;
using DVec = std::vector<double>;
using Ins = std::vector<DVec>;

constexpr double kU32 = 0x1p-24;
constexpr double kSecondOrder = 1.1;
constexpr uint64_t kKey = 77;

double unit_roundoff(DType t) { return t == DType::BF16 ? 0x1p-8 : t == DType::F16 ? 0x1p-11 : 0.0; }
double underflow_abs(DType t) { return t == DType::F16 ? 0x1p-25 : 0.0; }
bool is16(DType t) { return t == DType::BF16 || t == DType::F16; }

uint16_t to16(float f, DType t) { return t == DType::BF16 ? ops::f32_to_bf16(f) : ops::f32_to_f16(f); }
float from16(uint16_t h, DType t) { return t == DType::BF16 ? ops::bf16_to_f32(h) : ops::f16_to_f32(h); }
float round16(float f, DType t) { return is16(t) ? from16(to16(f, t), t) : f; }
// Round toward zero (the negative control): RNE, stepped back one ulp if it rounded away.
float trunc16(float f, DType t) {
  uint16_t h = to16(f, t);
  if (std::fabs(from16(h, t)) > std::fabs(f) && (h & 0x7fff) != 0) --h;
  return from16(h, t);
}
uint32_t bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

Vec randn(size_t n, uint64_t seed, float scale, float offset = 0.0f) {
  Vec v(n);
  const uint64_t key = ops::rng_key(0x0b5, seed);
  for (size_t i = 0; i < n; ++i) v[i] = offset + scale * ops::rng_normal(key, i);
  return v;
}
int64_t numel(const std::vector<int64_t>& s) { return ops::numel_of(s); }
DVec to_d(const Vec& v) { return DVec(v.begin(), v.end()); }
Ins to_d(const std::vector<Vec>& v) {
  Ins r;
  for (auto& x : v) r.push_back(to_d(x));
  return r;
}

// ------------------------------------------------------------------ one-node graphs
struct Operand {
  std::string name;
  std::vector<int64_t> shape;
  float scale = 1.0f, offset = 0.0f;  // raw values: offset + scale * N(0,1)
};


struct Case {
  std::string name;
  std::vector<Operand> operands;           // float operands, in node order
  std::function<ops::Graph(DType)> build;  // the graph with activations / params in this dtype
  std::vector<int32_t> tokens, targets;
  bool loss = false;                       // SoftmaxXent: the output is the sum of the losses
  float dloss = 1.0f;
  std::function<DVec(const Ins&)> fwd;     // float64 reference of the stage output
  std::function<Ins(const Ins&)> saved;    // 16-bit tensors the backward reads (null: none)
  std::function<Ins(const Ins&, const DVec&, const Ins&)> bwd;  // gradient of every operand
  double K_fwd = 0;
  std::vector<double> K_bwd;               // per operand
  // Optional: the fp32 kernels' gradients for check (A) when the all-fp32 graph differs from
  // the 16-bit one (a 16-bit tensor read back by the backward), with that tensor rounded by
  // `rnd` (RNE for (A); truncation for the negative control).
  std::function<std::vector<Vec>(const std::vector<Vec>&, const Vec&, DType, float (*rnd)(float, DType))> direct_bwd;
  // Linear: the GEMM may run on the widened operands (sgemm) or on the 16-bit ones as stored
  // (oneDNN, where the process's measured GEMM path chose it), each accumulating in fp32 in its
  // own order. Then (A) is: y = RNE(v) for some v within both evaluations' fp32 error of the
  // all-fp32 graph's result, i.e. RNE(y32 - w) <= y <= RNE(y32 + w) (RNE is monotone),
  // w = 2 (K+8) u32 A; and an fp32 output (or a parameter gradient in an fp32 buffer) within w
  // of y32, unrounded. Applied where gemm_path(dtype) is oneDNN; on the sgemm path both graphs
  // call sgemm on the same fp32 values and (A) is bit for bit.
  bool gemm_order_free = false;
  // Optional negative control: a broken 16-bit kernel's forward output, which must fail (B).
  std::function<Vec(const std::vector<Vec>&, DType)> broken_fwd;
};

// ------------------------------------------------------------------ running the executor
struct Run {
  Vec y;                   // the stage output widened (or {sum of losses})
  DType ydt = DType::F32;  // its stored dtype
  std::vector<Vec> grads;  // per operand, widened
  std::vector<DType> gdt;  // the dtype each gradient is stored in (a parameter's: its buffer's; F32: none)
};

std::vector<uint8_t> narrow(const Vec& v, DType t) {
  std::vector<uint8_t> b(v.size() * (is16(t) ? 2 : 4));
  if (is16(t)) ops::from_f32(b.data(), t, v.data(), static_cast<int64_t>(v.size()));
  else std::memcpy(b.data(), v.data(), b.size());
  return b;
}
Vec widen(const void* p, DType t, size_t n) {
  Vec v(n);
  if (is16(t)) {
    const auto* h = static_cast<const uint16_t*>(p);
    for (size_t i = 0; i < n; ++i) v[i] = from16(h[i], t);
  } else {
    std::memcpy(v.data(), p, n * 4);
  }
  return v;
}

// Forward (train) + backward of the case's graph in dtype `act` on the given operand values
// (representable in their tensors' dtypes) and output gradient. Parameter gradients go into
// zeroed fp32 buffers, or (grad16) a 16-bit parameter's into a zeroed buffer in its dtype.
Run run(const Case& c, DType act, const std::vector<Vec>& in, const Vec& dout, bool grad16 = false) {
  ops::Graph g = c.build(act);
  for (int p : g.params) {  // the gradient buffers' format, as the model builder records it
    ops::TensorDesc& d = g.tensors[static_cast<size_t>(p)];
    d.grad_dtype = grad16 && is16(d.dtype) ? d.dtype : DType::F32;
  }
  ops::Executor ex(g, ops::cpu_backend());
  std::vector<ops::Tensor> vals, grads;
  vals.reserve(g.params.size());
  grads.reserve(g.params.size());
  const size_t p0 = g.stage_input >= 0 ? 1 : 0;
  REQUIRE(in.size() == p0 + g.params.size());
  for (size_t k = 0; k < g.params.size(); ++k) {
    const ops::TensorDesc& d = g.tensors[static_cast<size_t>(g.params[k])];
    vals.emplace_back(d.shape, d.dtype, ops::Account::Parameters);
    const auto b = narrow(in[p0 + k], d.dtype);
    std::memcpy(vals.back().raw(), b.data(), b.size());
    const DType gt = grad16 && is16(d.dtype) ? d.dtype : DType::F32;
    grads.push_back(ops::Tensor::zeros(d.shape, gt, ops::Account::Gradients));
    ex.bind_param(g.params[k], &vals.back(), &grads.back());
  }
  std::vector<uint8_t> sin, sout, dsin, dsout;
  Run r;
  if (g.stage_input >= 0) {
    const ops::TensorDesc& d = g.tensors[static_cast<size_t>(g.stage_input)];
    sin = narrow(in[0], d.dtype);
    dsin.assign(sin.size(), 0);
  }
  if (g.stage_output >= 0) {
    const ops::TensorDesc& d = g.tensors[static_cast<size_t>(g.stage_output)];
    sout.assign(d.nbytes(), 0);
    dsout = narrow(dout, d.dtype);
    r.ydt = d.dtype;
  }
  const auto ls = ex.forward(c.tokens.empty() ? nullptr : c.tokens.data(),
                             c.targets.empty() ? nullptr : c.targets.data(), true, kKey, 0,
                             sin.empty() ? nullptr : sin.data(), sout.empty() ? nullptr : sout.data());
  ex.backward(c.dloss, dsout.empty() ? nullptr : dsout.data(), dsin.empty() ? nullptr : dsin.data());
  if (c.loss) r.y = {static_cast<float>(ls.sum)};
  else r.y = widen(sout.data(), r.ydt, static_cast<size_t>(numel(g.tensors[static_cast<size_t>(g.stage_output)].shape)));
  if (g.stage_input >= 0) {
    const ops::TensorDesc& d = g.tensors[static_cast<size_t>(g.stage_input)];
    r.grads.push_back(widen(dsin.data(), d.dtype, static_cast<size_t>(numel(d.shape))));
    r.gdt.push_back(d.dtype);
  }
  for (size_t k = 0; k < g.params.size(); ++k) {
    r.grads.push_back(widen(grads[k].raw(), grads[k].dtype(), static_cast<size_t>(grads[k].numel())));
    r.gdt.push_back(grads[k].dtype());
  }
  return r;
}

// ------------------------------------------------------------------ sensitivities
// For f: operands -> flattened outputs, per output i: A[i] = sum_j |df_i/dx_j||x_j| over all
// coordinates, Ar[i] and Zr[i] = sum_j |df_i/dx_j||x_j| and sum_j |df_i/dx_j| over the
// operands with rounded[k]. Central differences in double, h = 1e-6 max(|x_j|, 1e-3).
struct Sens {
  DVec A, Ar, Zr;
};
Sens sensitivity(const std::function<DVec(const Ins&)>& f, Ins x, const std::vector<bool>& rounded) {
  const size_t m = f(x).size();
  Sens s{DVec(m, 0.0), DVec(m, 0.0), DVec(m, 0.0)};
  for (size_t k = 0; k < x.size(); ++k) {
    for (size_t j = 0; j < x[k].size(); ++j) {
      const double x0 = x[k][j];
      if (x0 == 0.0) continue;  // zero is exact in every format and scales nothing
      const double h = 1e-6 * std::max(std::fabs(x0), 1e-3);
      x[k][j] = x0 + h;
      const DVec fp = f(x);
      x[k][j] = x0 - h;
      const DVec fm = f(x);
      x[k][j] = x0;
      for (size_t i = 0; i < m; ++i) {
        const double d = std::fabs(fp[i] - fm[i]) / (2 * h);
        s.A[i] += d * std::fabs(x0);
        if (rounded[k]) {
          s.Ar[i] += d * std::fabs(x0);
          s.Zr[i] += d;
        }
      }
    }
  }
  return s;
}

DVec flatten(const Ins& v) {
  DVec r;
  for (auto& x : v) r.insert(r.end(), x.begin(), x.end());
  return r;
}

// ------------------------------------------------------------------ the checks
struct Worst {
  double ratio = 0;
  size_t index = 0;
  double err = 0, bound = 0;
};
// max_i |got_i - want_i| / bound_i
Worst worst(const Vec& got, const DVec& want, const DVec& bound) {
  Worst w;
  for (size_t i = 0; i < got.size(); ++i) {
    const double e = std::fabs(static_cast<double>(got[i]) - want[i]);
    const double r = bound[i] > 0 ? e / bound[i] : (e > 0 ? INFINITY : 0.0);
    if (r > w.ratio) w = {r, i, e, bound[i]};
  }
  return w;
}

// (B)'s bound for one tensor: output rounding u_out (0: an fp32 tensor), fp32 evaluation with
// reduction length K, plus `extra` (a 16-bit tensor read back, already in absolute terms).
DVec bound_b(const DVec& f, const DVec& A, double K, DType out_dt, const DVec* extra) {
  const double u = unit_roundoff(out_dt), eta = underflow_abs(out_dt);
  double fmax = 0;
  for (double v : f) fmax = std::max(fmax, std::fabs(v));
  DVec b(f.size());
  for (size_t i = 0; i < f.size(); ++i) {
    const double e32 = (K + 8) * kU32 * A[i] + 64 * kU32 * fmax + (extra ? (*extra)[i] : 0.0);
    b[i] = u * std::fabs(f[i]) + eta + (1 + u) * e32;
  }
  return b;
}

size_t not_representable(const Vec& v, DType t) {
  size_t n = 0;
  for (float x : v) n += round16(x, t) != x;
  return n;
}

// Check (A): elements of y that are not RNE(y32) in t (bit for bit; t = F32: y32 itself, no
// rounding), or with an order-free GEMM (A != null: sensitivities from offset `off`, reduction
// length K) not within [RNE(y32 - w), RNE(y32 + w)] (t = F32: |y - y32| <= w, in double),
// w = 2 (K+8) u32 A.
size_t mismatches(const Vec& y, const Vec& y32, DType t, const DVec* A, double K, size_t off) {
  size_t m = 0;
  for (size_t i = 0; i < y.size(); ++i) {
    if (!A) {
      m += bits(y[i]) != bits(round16(y32[i], t));
      continue;
    }
    const double w = 2 * (K + 8) * kU32 * (*A)[off + i];
    if (!is16(t)) {
      m += !(std::fabs(static_cast<double>(y[i]) - static_cast<double>(y32[i])) <= w);
      continue;
    }
    const float lo = round16(static_cast<float>(y32[i] - w), t), hi = round16(static_cast<float>(y32[i] + w), t);
    m += !(lo <= y[i] && y[i] <= hi);
  }
  return m;
}

struct Report {
  double fwd_b = 0, fwd_c = 0, bwd_b = 0, bwd_c = 0;
  double pbwd_b = 0, pbwd_c = 0;  // parameter gradients in fp32 buffers (bwd_*: activations')
  double g16_b = 0, g16_c = 0;    // parameter gradients in 16-bit buffers
  bool has_g16 = false;
  double trunc_min = INFINITY, bf16_min = INFINITY, broken = 0;  // controls' ratios (must be > 1)
  double round_min = INFINITY;  // parameter gradient rounded to 16 bits, under the fp32-buffer (B)
  size_t round_mism_min = SIZE_MAX;  // ... and its (A) mismatches (must be > 0)
};

void note(double& m, const Worst& w) { m = std::max(m, w.ratio); }

// Runs the case in bf16 and fp16 and applies checks (A), (B), (C) and the controls.
void check_case(const Case& c) {
  const size_t nops = c.operands.size();
  std::vector<Vec> raw;
  for (size_t k = 0; k < nops; ++k)
    raw.push_back(randn(static_cast<size_t>(numel(c.operands[k].shape)), 10 + k, c.operands[k].scale,
                        c.operands[k].offset));
  // Which operands (and the output gradient) a 16-bit graph stores in 16 bits.
  const ops::Graph g16 = c.build(DType::BF16);
  std::vector<bool> rounded;
  if (g16.stage_input >= 0) rounded.push_back(is16(g16.tensors[static_cast<size_t>(g16.stage_input)].dtype));
  for (int p : g16.params) rounded.push_back(is16(g16.tensors[static_cast<size_t>(p)].dtype));
  REQUIRE(rounded.size() == nops);
  const bool dout16 = g16.stage_output >= 0 && is16(g16.tensors[static_cast<size_t>(g16.stage_output)].dtype);
  const size_t ny = c.fwd(to_d(raw)).size();
  const Vec draw = c.loss ? Vec{} : randn(ny, 99, 1.0f);

  // Sensitivities at the raw inputs (the same for both formats).
  const Sens sf = sensitivity(c.fwd, to_d(raw), rounded);
  auto bwd_all = [&](const Ins& xd) {  // operands..., dout -> all gradients, flattened
    Ins x(xd.begin(), xd.begin() + static_cast<long>(nops));
    const DVec d = c.loss ? DVec{} : xd.back();
    return flatten(c.bwd(x, d, c.saved ? c.saved(x) : Ins{}));
  };
  Ins xd = to_d(raw);
  std::vector<bool> rounded_d = rounded;
  if (!c.loss) {
    xd.push_back(to_d(draw));
    rounded_d.push_back(dout16);
  }
  const Sens sb = sensitivity(bwd_all, xd, rounded_d);
  Sens ss;  // the backward's sensitivity to the saved 16-bit tensors
  if (c.saved) {
    const Ins x = to_d(raw);
    const Ins sv = c.saved(x);
    ss = sensitivity([&](const Ins& s) { return flatten(c.bwd(x, c.loss ? DVec{} : to_d(draw), s)); }, sv,
                     std::vector<bool>(sv.size(), true));
  }

  for (DType dt : {DType::BF16, DType::F16}) {
    const char* dn = ops::dtype_name(dt);
    CAPTURE(dn);
    const double u = unit_roundoff(dt), eta = underflow_abs(dt);
    // Linear on oneDNN's path: (A) order-free; on the sgemm path, bit for bit.
    const bool order_free = c.gemm_order_free && ops::gemm_path(dt) == ops::GemmPath::OneDnn;
    std::vector<Vec> xh = raw;
    for (size_t k = 0; k < nops; ++k)
      if (rounded[k])
        for (float& v : xh[k]) v = round16(v, dt);
    Vec dh = draw;
    if (dout16)
      for (float& v : dh) v = round16(v, dt);

    const Run r = run(c, dt, xh, dh);
    const Run r32 = run(c, DType::F32, xh, dh);
    std::vector<Vec> g32 = r32.grads;
    if (c.direct_bwd) g32 = c.direct_bwd(xh, dh, dt, round16);
    Report rep;

    // ---- forward
    {
      INFO("forward output");
      // (A) stored == RNE(fp32 result), bit for bit.
      CHECK(mismatches(r.y, r32.y, r.ydt, order_free ? &sf.A : nullptr, c.K_fwd, 0) == 0);
      // (B)
      const DVec fh = c.fwd(to_d(xh));
      const DVec bb = bound_b(fh, sf.A, c.K_fwd, r.ydt, nullptr);
      const Worst wb = worst(r.y, fh, bb);
      INFO("(B) worst element " << wb.index << ": |err| " << wb.err << " vs bound " << wb.bound);
      CHECK(wb.ratio <= 1.0);
      note(rep.fwd_b, wb);
      // (C)
      const DVec f = c.fwd(to_d(raw));
      DVec bc = bb;
      for (size_t i = 0; i < bc.size(); ++i) bc[i] += kSecondOrder * (u * sf.Ar[i] + eta * sf.Zr[i]);
      const Worst wc = worst(r.y, f, bc);
      INFO("(C) worst element " << wc.index << ": |err| " << wc.err << " vs bound " << wc.bound);
      CHECK(wc.ratio <= 1.0);
      note(rep.fwd_c, wc);
      // Controls: truncation and (fp16) bf16 rounding of the same fp32 result must fail (B).
      if (is16(r.ydt) && not_representable(r32.y, dt) >= 32) {
        Vec t(r32.y.size());
        for (size_t i = 0; i < t.size(); ++i) t[i] = trunc16(r32.y[i], dt);
        const double tr = worst(t, fh, bb).ratio;
        INFO("control: truncation instead of RNE, ratio " << tr);
        CHECK(tr > 1.0);
        rep.trunc_min = std::min(rep.trunc_min, tr);
        if (dt == DType::F16) {
          for (size_t i = 0; i < t.size(); ++i) t[i] = round16(r32.y[i], DType::BF16);
          const double br = worst(t, fh, bb).ratio;
          INFO("control: bf16 rounding under the fp16 bound, ratio " << br);
          CHECK(br > 1.0);
          rep.bf16_min = std::min(rep.bf16_min, br);
        }
      }
      if (c.broken_fwd) {
        const double br = worst(c.broken_fwd(xh, dt), fh, bb).ratio;
        INFO("control: 16-bit accumulation, ratio " << br);
        CHECK(br > 1.0);
        rep.broken = br;
      }
    }

    // ---- backward
    const Ins gh = c.bwd(to_d(xh), c.loss ? DVec{} : to_d(dh), c.saved ? c.saved(to_d(xh)) : Ins{});
    const Ins gr = c.bwd(to_d(raw), c.loss ? DVec{} : to_d(draw), c.saved ? c.saved(to_d(raw)) : Ins{});
    // Operand k's gradient as run `rr` stored it (dtype rr.gdt[k]: an activation's, or the
    // parameter's buffer's): (A), (B), (C) and, if 16-bit, the truncation control. Returns
    // (B)'s bound, for the callers' controls.
    auto check_grad = [&](const Run& rr, size_t k, size_t off, double& mb, double& mc) {
      const size_t n = gh[k].size();
      REQUIRE(rr.grads[k].size() == n);
      CAPTURE(ops::dtype_name(rr.gdt[k]));
      // (A) the stored gradient is the fp32 kernel gradient in the dtype it is stored in:
      // RNE16 for an activation or a 16-bit buffer, the value itself for an fp32 buffer.
      CHECK(mismatches(rr.grads[k], g32[k], rr.gdt[k], order_free ? &sb.A : nullptr, c.K_bwd[k], off) == 0);
      // (B): bound_b with the stored dtype's u, eta (fp32 buffer: 0, no output rounding).
      auto slice = [&](const DVec& v) { return DVec(v.begin() + static_cast<long>(off), v.begin() + static_cast<long>(off + n)); };
      DVec extra(n, 0.0);
      if (c.saved)
        for (size_t i = 0; i < n; ++i) extra[i] = kSecondOrder * (u * ss.Ar[off + i] + eta * ss.Zr[off + i]);
      const DVec bb = bound_b(gh[k], slice(sb.A), c.K_bwd[k], rr.gdt[k], &extra);
      const Worst wb = worst(rr.grads[k], gh[k], bb);
      INFO("(B) worst element " << wb.index << ": |err| " << wb.err << " vs bound " << wb.bound);
      CHECK(wb.ratio <= 1.0);
      note(mb, wb);
      // (C): plus the 16-bit operands' input rounding (u, eta of the storage format dt).
      DVec bc = bb;
      for (size_t i = 0; i < n; ++i) bc[i] += kSecondOrder * (u * sb.Ar[off + i] + eta * sb.Zr[off + i]);
      const Worst wc = worst(rr.grads[k], gr[k], bc);
      INFO("(C) worst element " << wc.index << ": |err| " << wc.err << " vs bound " << wc.bound);
      CHECK(wc.ratio <= 1.0);
      note(mc, wc);
      // Control: truncation of the same fp32 gradient must fail (B).
      if (is16(rr.gdt[k]) && not_representable(g32[k], dt) >= 32) {
        // A truncating executor truncates every stored tensor, the saved ones included.
        const Vec base = c.direct_bwd ? c.direct_bwd(xh, dh, dt, trunc16)[k] : g32[k];
        Vec t(n);
        for (size_t i = 0; i < n; ++i) t[i] = trunc16(base[i], dt);
        const double tr = worst(t, gh[k], bb).ratio;
        INFO("control: truncation instead of RNE, ratio " << tr);
        CHECK(tr > 1.0);
        rep.trunc_min = std::min(rep.trunc_min, tr);
      }
      return bb;
    };
    const size_t p0 = g16.stage_input >= 0 ? 1 : 0;  // operands from p0 on are parameters
    std::vector<size_t> offs;
    size_t off = 0;
    for (size_t k = 0; k < nops; ++k) {
      INFO("gradient of " << c.operands[k].name << " (fp32 gradient buffers)");
      offs.push_back(off);
      const DVec bb = check_grad(r, k, off, k >= p0 ? rep.pbwd_b : rep.bwd_b, k >= p0 ? rep.pbwd_c : rep.bwd_c);
      // A 16-bit parameter's gradient reaches its fp32 buffer unrounded.
      if (k >= p0) REQUIRE(r.gdt[k] == DType::F32);
      // Control: the gradient rounded to the parameter's 16-bit dtype before the fp32 buffer (the
      // former per-node rounding) must fail the exactness check (A) and the fp32-buffer (B) bound.
      if (k >= p0 && rounded[k] && not_representable(g32[k], dt) >= 32) {
        Vec t(gh[k].size());
        for (size_t i = 0; i < t.size(); ++i) t[i] = round16(g32[k][i], dt);
        const size_t mism = mismatches(t, g32[k], DType::F32, order_free ? &sb.A : nullptr, c.K_bwd[k], off);
        const double rr = worst(t, gh[k], bb).ratio;
        INFO("control: parameter gradient rounded to " << dn << " before the fp32 buffer: (A) mismatches " << mism
                                                       << ", (B) ratio " << rr);
        CHECK(mism > 0);
        CHECK(rr > 1.0);
        rep.round_min = std::min(rep.round_min, rr);
        rep.round_mism_min = std::min(rep.round_mism_min, mism);
      }
      off += gh[k].size();
    }
    // 16-bit gradient buffers: each 16-bit parameter's gradient bound to a zeroed buffer in its
    // own dtype must be RNE16(fp32 kernel gradient), one rounding (A), within the full (B)/(C)
    // bounds of that format; everything else must be bit-identical to the fp32-buffer run.
    bool any16 = false;
    for (size_t k = p0; k < nops; ++k) any16 = any16 || rounded[k];
    if (any16) {
      const Run r16 = run(c, dt, xh, dh, true);
      {
        INFO("16-bit gradient buffers: forward output and activation gradients unchanged");
        CHECK(r16.y.size() == r.y.size());
        size_t diff = 0;
        for (size_t i = 0; i < std::min(r16.y.size(), r.y.size()); ++i) diff += bits(r16.y[i]) != bits(r.y[i]);
        for (size_t k = 0; k < p0; ++k)
          for (size_t i = 0; i < r.grads[k].size(); ++i) diff += bits(r16.grads[k][i]) != bits(r.grads[k][i]);
        CHECK(diff == 0);
      }
      rep.has_g16 = true;
      for (size_t k = p0; k < nops; ++k) {
        if (!rounded[k]) continue;
        INFO("gradient of " << c.operands[k].name << " (" << dn << " gradient buffer)");
        REQUIRE(r16.gdt[k] == dt);
        check_grad(r16, k, offs[k], rep.g16_b, rep.g16_c);
      }
    }
    std::printf("  %-26s %-5s max err/bound: fwd (B) %.3f (C) %.3f | bwd (B) %.3f (C) %.3f", c.name.c_str(), dn,
                rep.fwd_b, rep.fwd_c, rep.bwd_b, rep.bwd_c);
    if (p0 < nops) std::printf(" | param fp32 buf (B) %.3f (C) %.3f", rep.pbwd_b, rep.pbwd_c);
    if (rep.has_g16) std::printf(" | param %s buf (B) %.3f (C) %.3f", dn, rep.g16_b, rep.g16_c);
    if (c.gemm_order_free) std::printf(" | gemm %s", order_free ? "onednn (order-free A)" : "sgemm (exact A)");
    std::printf(" | controls: trunc %.2f", rep.trunc_min);
    if (dt == DType::F16 && std::isfinite(rep.bf16_min)) std::printf(", bf16-under-fp16 %.2f", rep.bf16_min);
    if (rep.broken > 0) std::printf(", 16-bit accumulation %.2f", rep.broken);
    if (std::isfinite(rep.round_min))
      std::printf(", param grad rounded before fp32 buffer %.2f (%zu not exact)", rep.round_min, rep.round_mism_min);
    std::printf("\n");
  }
}

// ------------------------------------------------------------------ float64 references
// Linear: y (N,OC) = x (N,IC) W(OC,IC)^T + b.
DVec ref_linear(const Ins& in, int N, int IC, int OC) {
  const DVec &x = in[0], &W = in[1];
  DVec y(static_cast<size_t>(N) * OC);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      double s = in.size() > 2 ? in[2][o] : 0.0;
      for (int i = 0; i < IC; ++i) s += x[n * IC + i] * W[o * IC + i];
      y[n * OC + o] = s;
    }
  return y;
}
Ins ref_linear_bwd(const Ins& in, const DVec& dy, int N, int IC, int OC) {
  const DVec &x = in[0], &W = in[1];
  Ins g{DVec(x.size()), DVec(W.size())};
  if (in.size() > 2) g.emplace_back(static_cast<size_t>(OC), 0.0);
  for (int n = 0; n < N; ++n)
    for (int o = 0; o < OC; ++o) {
      const double d = dy[n * OC + o];
      for (int i = 0; i < IC; ++i) {
        g[0][n * IC + i] += d * W[o * IC + i];
        g[1][o * IC + i] += d * x[n * IC + i];
      }
      if (in.size() > 2) g[2][o] += d;
    }
  return g;
}

// LayerNorm / RMSNorm over rows of C.
DVec ref_norm(const Ins& in, int N, int C, double eps, bool rms) {
  const DVec& x = in[0];
  DVec y(x.size());
  for (int n = 0; n < N; ++n) {
    const double* r = &x[static_cast<size_t>(n) * C];
    double m = 0, v = 0;
    if (!rms) {
      for (int i = 0; i < C; ++i) m += r[i];
      m /= C;
    }
    for (int i = 0; i < C; ++i) v += (r[i] - m) * (r[i] - m);
    const double rstd = 1.0 / std::sqrt(v / C + eps);
    for (int i = 0; i < C; ++i)
      y[n * C + i] = (r[i] - m) * rstd * in[1][i] + (in.size() > 2 ? in[2][i] : 0.0);
  }
  return y;
}
Ins ref_norm_bwd(const Ins& in, const DVec& dy, int N, int C, double eps, bool rms) {
  const DVec& x = in[0];
  Ins g;
  for (auto& v : in) g.emplace_back(v.size(), 0.0);
  std::vector<double> xh(static_cast<size_t>(C)), dxh(static_cast<size_t>(C));
  for (int n = 0; n < N; ++n) {
    const double* r = &x[static_cast<size_t>(n) * C];
    double m = 0, v = 0;
    if (!rms) {
      for (int i = 0; i < C; ++i) m += r[i];
      m /= C;
    }
    for (int i = 0; i < C; ++i) v += (r[i] - m) * (r[i] - m);
    const double rstd = 1.0 / std::sqrt(v / C + eps);
    double a = 0, b = 0;
    for (int i = 0; i < C; ++i) {
      xh[i] = (r[i] - m) * rstd;
      dxh[i] = dy[n * C + i] * in[1][i];
      a += dxh[i];
      b += dxh[i] * xh[i];
      g[1][i] += dy[n * C + i] * xh[i];
      if (in.size() > 2) g[2][i] += dy[n * C + i];
    }
    a /= C;
    b /= C;
    for (int i = 0; i < C; ++i) g[0][n * C + i] = rstd * (dxh[i] - (rms ? 0.0 : a) - xh[i] * b);
  }
  return g;
}

// Rope on the q and k thirds of (B*T, 3C), "rotate half", angle t theta^(-2i/HS).
DVec ref_rope(const DVec& x, int N, int T, int C, int NH, double theta, bool inverse) {
  const int HS = C / NH, half = HS / 2;
  DVec y = x;
  for (int r = 0; r < N; ++r) {
    const int t = r % T;
    for (int part = 0; part < 2; ++part)
      for (int h = 0; h < NH; ++h)
        for (int i = 0; i < half; ++i) {
          const double a = t * std::pow(theta, -2.0 * i / HS), cs = std::cos(a), sn = inverse ? -std::sin(a) : std::sin(a);
          const size_t b = static_cast<size_t>(r) * 3 * C + static_cast<size_t>(part) * C + static_cast<size_t>(h) * HS;
          const double x1 = x[b + i], x2 = x[b + i + half];
          y[b + i] = x1 * cs - x2 * sn;
          y[b + i + half] = x2 * cs + x1 * sn;
        }
  }
  return y;
}

// Causal attention over packed qkv (B*T, 3C), scale 1/sqrt(HS), no dropout.
DVec ref_probs(const DVec& qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const double sc = 1.0 / std::sqrt(static_cast<double>(HS));
  DVec P(static_cast<size_t>(B) * NH * T * T, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        double* p = &P[((static_cast<size_t>(b) * NH + h) * T + t) * T];
        double mx = -INFINITY;
        for (int s = 0; s <= t; ++s) {
          double d = 0;
          for (int k = 0; k < HS; ++k)
            d += qkv[(static_cast<size_t>(b) * T + t) * 3 * C + h * HS + k] * qkv[(static_cast<size_t>(b) * T + s) * 3 * C + C + h * HS + k];
          p[s] = sc * d;
          mx = std::max(mx, p[s]);
        }
        double z = 0;
        for (int s = 0; s <= t; ++s) z += (p[s] = std::exp(p[s] - mx));
        for (int s = 0; s <= t; ++s) p[s] /= z;
      }
  return P;
}
DVec ref_attention(const DVec& qkv, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const DVec P = ref_probs(qkv, B, T, C, NH);
  DVec y(static_cast<size_t>(B) * T * C, 0.0);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t)
        for (int s = 0; s <= t; ++s) {
          const double p = P[((static_cast<size_t>(b) * NH + h) * T + t) * T + s];
          for (int k = 0; k < HS; ++k)
            y[(static_cast<size_t>(b) * T + t) * C + h * HS + k] += p * qkv[(static_cast<size_t>(b) * T + s) * 3 * C + 2 * C + h * HS + k];
        }
  return y;
}
DVec ref_attention_bwd(const DVec& qkv, const DVec& dy, const DVec& P, int B, int T, int C, int NH) {
  const int HS = C / NH;
  const double sc = 1.0 / std::sqrt(static_cast<double>(HS));
  DVec g(qkv.size(), 0.0);
  std::vector<double> dp(static_cast<size_t>(T));
  auto q = [&](int b, int t, int k) { return static_cast<size_t>(b * T + t) * 3 * C + k; };
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < NH; ++h)
      for (int t = 0; t < T; ++t) {
        const double* p = &P[((static_cast<size_t>(b) * NH + h) * T + t) * T];
        double cdot = 0;
        for (int s = 0; s <= t; ++s) {
          double d = 0;
          for (int k = 0; k < HS; ++k) {
            const double dyk = dy[(static_cast<size_t>(b) * T + t) * C + h * HS + k];
            d += dyk * qkv[q(b, s, 2 * C + h * HS + k)];
            g[q(b, s, 2 * C + h * HS + k)] += p[s] * dyk;
          }
          dp[s] = d;
          cdot += p[s] * d;
        }
        for (int s = 0; s <= t; ++s) {
          const double ds = p[s] * (dp[s] - cdot) * sc;
          for (int k = 0; k < HS; ++k) {
            g[q(b, t, h * HS + k)] += ds * qkv[q(b, s, C + h * HS + k)];
            g[q(b, s, C + h * HS + k)] += ds * qkv[q(b, t, h * HS + k)];
          }
        }
      }
  return g;
}

constexpr double kGeluC = 0.7978845608028654, kGeluA = 0.044715;
double gelu(double x) { return 0.5 * x * (1 + std::tanh(kGeluC * (x + kGeluA * x * x * x))); }
double gelu_grad(double x) {
  const double t = std::tanh(kGeluC * (x + kGeluA * x * x * x));
  return 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * kGeluC * (1 + 3 * kGeluA * x * x);
}
double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// ------------------------------------------------------------------ the cases
constexpr int64_t kB = 3, kT = 9, kN = kB * kT;  // 27 rows

Case linear_case(bool bias, bool fp32_out) {
  const int IC = 45, OC = 29, N = static_cast<int>(kN);
  Case c;
  c.name = std::string("linear") + (bias ? "" : " (no bias)") + (fp32_out ? " (fp32 out)" : "");
  c.operands = {{"x", {kN, IC}}, {"W", {OC, IC}, 0.2f}};
  if (bias) c.operands.push_back({"b", {OC}, 0.2f});
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::Linear, kB, kT, "op");
    b.x({kN, IC}, t).param("W", {OC, IC}, t);
    if (bias) b.param("b", {OC}, t);
    return b.out("y", {kN, OC}, fp32_out ? DType::F32 : t).done().g;  // fp32_out: the lm_head
  };
  c.fwd = [=](const Ins& in) { return ref_linear(in, N, IC, OC); };
  c.bwd = [=](const Ins& in, const DVec& dy, const Ins&) { return ref_linear_bwd(in, dy, N, IC, OC); };
  // y: IC products + bias; dx: OC terms; dW, db: N terms.
  c.K_fwd = IC + 1;
  c.K_bwd = {double(OC), double(N), double(N)};
  c.gemm_order_free = true;
  if (bias && !fp32_out)
    c.broken_fwd = [=](const std::vector<Vec>& in, DType t) {  // dot products accumulated in 16 bits
      Vec y(static_cast<size_t>(N) * OC);
      for (int n = 0; n < N; ++n)
        for (int o = 0; o < OC; ++o) {
          float s = in[2][o];
          for (int i = 0; i < IC; ++i) s = round16(s + in[0][n * IC + i] * in[1][o * IC + i], t);
          y[n * OC + o] = s;
        }
      return y;
    };
  return c;
}

Case norm_case(bool rms, bool bias) {
  const int C = 45, N = static_cast<int>(kN);
  const float eps = rms ? 1e-6f : 1e-5f;
  Case c;
  c.name = rms ? "rmsnorm" : bias ? "layernorm" : "layernorm (no bias)";
  // LayerNorm inputs off-centre (mean 1.5), so that the mean subtraction matters.
  c.operands = {{"x", {kN, C}, 1.0f, rms ? 0.0f : 1.5f}, {"w", {C}, 0.3f, 1.0f}};
  if (bias) c.operands.push_back({"b", {C}, 0.3f});
  c.build = [=](DType t) {
    ops::NodeGraph b(rms ? OpKind::RMSNorm : OpKind::LayerNorm, kB, kT, "op");
    b.x({kN, C}, t).param("w", {C}, t);
    if (bias) b.param("b", {C}, t);
    b.out("y", {kN, C}, t);
    if (!rms) b.out("mean", {kN}, DType::F32);  // the statistics stay fp32, as in the model
    b.out("rstd", {kN}, DType::F32);
    b.n.eps = eps;
    return b.done().g;
  };
  c.fwd = [=](const Ins& in) { return ref_norm(in, N, C, eps, rms); };
  c.bwd = [=](const Ins& in, const DVec& dy, const Ins&) { return ref_norm_bwd(in, dy, N, C, eps, rms); };
  // y: mean and variance over C (2C); dx: the saved statistics (2C) and two means over C
  // (2C); dw, db: N rows, each term built from the saved statistics (2C).
  c.K_fwd = 2 * C;
  c.K_bwd = {4.0 * C, N + 2.0 * C, N + 2.0 * C};
  return c;
}

Case rope_case() {
  const int C = 20, NH = 2, N = static_cast<int>(kN);  // HS = 10
  const float theta = 10000.0f;
  Case c;
  c.name = "rope";
  c.operands = {{"qkv", {kN, 3 * C}}};
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::Rope, kB, kT, "op");
    b.x({kN, 3 * C}, t).out("y", {kN, 3 * C}, t);
    b.n.heads = NH;
    b.n.theta = theta;
    return b.done().g;
  };
  c.fwd = [=](const Ins& in) { return ref_rope(in[0], N, static_cast<int>(kT), C, NH, theta, false); };
  c.bwd = [=](const Ins&, const DVec& dy, const Ins&) { return Ins{ref_rope(dy, N, static_cast<int>(kT), C, NH, theta, true)}; };
  c.K_fwd = 2;  // two products and a sum
  c.K_bwd = {2};
  return c;
}

Case attention_case() {
  const int B = 2, T = 9, C = 20, NH = 2, N = B * T;  // HS = 10
  Case c;
  c.name = "attention";
  c.operands = {{"qkv", {N, 3 * C}, 1.5f}};
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::Attention, B, T, "op");
    // The saved log-sum-exp is fp32 whatever the act dtype, like the norm statistics
    // (the model keeps no (T,T) probabilities; runner/model/gpt.cpp).
    b.x({N, 3 * C}, t).out("y", {N, C}, t).out("lse", {B, NH, T}, DType::F32);
    b.n.heads = NH;
    b.n.site = 3;
    return b.done().g;
  };
  c.fwd = [=](const Ins& in) { return ref_attention(in[0], B, T, C, NH); };
  c.bwd = [=](const Ins& in, const DVec& dy, const Ins&) {
    return Ins{ref_attention_bwd(in[0], dy, ref_probs(in[0], B, T, C, NH), B, T, C, NH)};
  };
  // y: scores over HS, softmax sum over T, P V over T; dqkv: dP over HS, the softmax
  // Jacobian's row sum over T, dQ and dK over T, on top of the probabilities, which the
  // backward recomputes from q and k exactly as the forward computed them.
  c.K_fwd = (C / NH) + 2.0 * T;
  c.K_bwd = {2.0 * (C / NH) + 4.0 * T};
  return c;
}

Case gelu_case() {
  const int H = 45;
  Case c;
  c.name = "gelu";
  c.operands = {{"x", {kN, H}, 2.0f}};
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::Gelu, kB, kT, "op");
    return b.x({kN, H}, t).out("y", {kN, H}, t).done().g;
  };
  c.fwd = [](const Ins& in) {
    DVec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = gelu(in[0][i]);
    return y;
  };
  c.bwd = [](const Ins& in, const DVec& dy, const Ins&) {
    DVec g(in[0].size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = dy[i] * gelu_grad(in[0][i]);
    return Ins{g};
  };
  c.K_fwd = 0;  // pointwise: the transcendental allowance only
  c.K_bwd = {0};
  return c;
}

Case relu2_case() {
  const int H = 45;
  Case c;
  c.name = "relu2";
  c.operands = {{"x", {kN, H}, 2.0f}};
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::Relu2, kB, kT, "op");
    return b.x({kN, H}, t).out("y", {kN, H}, t).done().g;
  };
  c.fwd = [](const Ins& in) {
    DVec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] > 0 ? in[0][i] * in[0][i] : 0.0;
    return y;
  };
  c.bwd = [](const Ins& in, const DVec& dy, const Ins&) {
    DVec g(in[0].size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = in[0][i] > 0 ? dy[i] * 2.0 * in[0][i] : 0.0;
    return Ins{g};
  };
  c.K_fwd = 0;  // pointwise: a product or two, no reduction
  c.K_bwd = {0};
  return c;
}

Case swiglu_case() {
  const int H = 23, N = static_cast<int>(kN);
  Case c;
  c.name = "swiglu";
  c.operands = {{"x", {kN, 2 * H}, 2.0f}};
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::SwiGLU, kB, kT, "op");
    return b.x({kN, 2 * H}, t).out("y", {kN, H}, t).done().g;
  };
  c.fwd = [=](const Ins& in) {
    DVec y(static_cast<size_t>(N) * H);
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < H; ++j) {
        const double g = in[0][n * 2 * H + j], up = in[0][n * 2 * H + H + j];
        y[n * H + j] = g * sigmoid(g) * up;
      }
    return y;
  };
  c.bwd = [=](const Ins& in, const DVec& dy, const Ins&) {
    DVec d(in[0].size());
    for (int n = 0; n < N; ++n)
      for (int j = 0; j < H; ++j) {
        const double g = in[0][n * 2 * H + j], up = in[0][n * 2 * H + H + j], s = sigmoid(g), e = dy[n * H + j];
        d[n * 2 * H + j] = e * up * s * (1 + g * (1 - s));
        d[n * 2 * H + H + j] = e * g * s;
      }
    return Ins{d};
  };
  c.K_fwd = 0;
  c.K_bwd = {0};
  return c;
}

Case add_case() {
  const int C = 45;
  Case c;
  c.name = "add";
  // The second operand stands in for the residual stream as a (16-bit) parameter: a one-node
  // graph has one float activation input.
  c.operands = {{"a", {kN, C}}, {"b", {kN, C}, 0.5f}};
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::Add, kB, kT, "op");
    return b.x({kN, C}, t).param("b", {kN, C}, t).out("y", {kN, C}, t).done().g;
  };
  c.fwd = [](const Ins& in) {
    DVec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] + in[1][i];
    return y;
  };
  c.bwd = [](const Ins&, const DVec& dy, const Ins&) { return Ins{dy, dy}; };
  c.K_fwd = 1;
  c.K_bwd = {0, 0};  // dout copied: bit-exact, (A) and (B) both say so
  return c;
}

Case dropout_case() {
  const int C = 45;
  const float p = 0.3f;  // 1/(1-p) is not a power of two: the scaling rounds
  const uint32_t site = 5;
  Case c;
  c.name = "dropout";
  c.operands = {{"x", {kN, C}}};
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::Dropout, kB, kT, "op");
    b.x({kN, C}, t).out("y", {kN, C}, t);
    b.n.dropout = p;
    b.n.site = site;
    return b.done().g;
  };
  // The mask is the operator's definition: element i kept iff rng_uniform(rng_key(step key,
  // site), i) >= p (sample offset 0), scaled by 1/(1-p).
  auto mask = [=](size_t n) {
    DVec m(n);
    const uint64_t key = ops::rng_key(kKey, site);
    for (size_t i = 0; i < n; ++i) m[i] = ops::rng_uniform(key, i) >= p ? 1.0 / (1.0 - static_cast<double>(p)) : 0.0;
    return m;
  };
  c.fwd = [=](const Ins& in) {
    const DVec m = mask(in[0].size());
    DVec y(in[0].size());
    for (size_t i = 0; i < y.size(); ++i) y[i] = in[0][i] * m[i];
    return y;
  };
  c.bwd = [=](const Ins& in, const DVec& dy, const Ins&) {
    const DVec m = mask(in[0].size());
    DVec g(dy.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = dy[i] * m[i];
    return Ins{g};
  };
  c.K_fwd = 2;  // the fp32 scale 1/(1-p) and the product
  c.K_bwd = {2};
  return c;
}

Case embedding_case(bool wpe) {
  const int V = 13, C = 45, N = static_cast<int>(kN), T = static_cast<int>(kT);
  Case c;
  c.name = wpe ? "embedding (wte + wpe)" : "embedding (wte)";
  c.operands = {{"wte", {V, C}}};
  if (wpe) c.operands.push_back({"wpe", {kT, C}, 0.5f});
  const uint64_t key = ops::rng_key(0x70c, 1);
  for (int i = 0; i < N; ++i) c.tokens.push_back(static_cast<int32_t>(ops::rng_u32(key, i) % V));  // 27 tokens over 13 ids: repeats
  c.build = [=](DType t) {
    ops::NodeGraph b(OpKind::Embedding, kB, kT, "op");
    b.tokens().param("wte", {V, C}, t);
    if (wpe) b.param("wpe", {kT, C}, t);
    return b.out("y", {kN, C}, t).done().g;
  };
  const std::vector<int32_t> tok = c.tokens;
  c.fwd = [=](const Ins& in) {
    DVec y(static_cast<size_t>(N) * C);
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < C; ++i) y[n * C + i] = in[0][tok[n] * C + i] + (wpe ? in[1][(n % T) * C + i] : 0.0);
    return y;
  };
  c.bwd = [=](const Ins& in, const DVec& dy, const Ins&) {
    Ins g;
    for (auto& v : in) g.emplace_back(v.size(), 0.0);
    for (int n = 0; n < N; ++n)
      for (int i = 0; i < C; ++i) {
        g[0][tok[n] * C + i] += dy[n * C + i];
        if (wpe) g[1][(n % T) * C + i] += dy[n * C + i];
      }
    return g;
  };
  int most = 0;  // dwte: the largest number of positions sharing a token
  for (int v = 0; v < V; ++v) most = std::max(most, static_cast<int>(std::count(tok.begin(), tok.end(), v)));
  c.K_fwd = 2;
  c.K_bwd = {double(most), double(kB)};
  return c;
}

Case softmax_xent_case() {
  const int V = 41, Vr = 37, N = static_cast<int>(kN);
  Case c;
  c.name = "softmax_xent";
  c.loss = true;
  c.dloss = 1.0f / 26;
  c.operands = {{"logits", {kN, V}, 2.0f}};
  const uint64_t key = ops::rng_key(0x7a9, 1);
  for (int i = 0; i < N; ++i) c.targets.push_back(static_cast<int32_t>(ops::rng_u32(key, i) % Vr));
  c.targets[4] = -1;  // an ignored position
  c.build = [=](DType) {
    // The logits are fp32 in every precision (runner/model/gpt.cpp; the executor refuses
    // 16-bit logits, checked below): the loss has no 16-bit operand.
    ops::NodeGraph b(OpKind::SoftmaxXent, kB, kT, "op");
    b.x({kN, V}, DType::F32).targets().out("losses", {kN}, DType::F32);
    b.n.inplace = true;
    b.n.vocab_real = Vr;
    return b.done().g;
  };
  const std::vector<int32_t> tgt = c.targets;
  auto probs_row = [=](const DVec& z, int n, DVec& p) {
    double mx = -INFINITY, s = 0;
    for (int j = 0; j < Vr; ++j) mx = std::max(mx, z[n * V + j]);
    for (int j = 0; j < Vr; ++j) s += (p[j] = std::exp(z[n * V + j] - mx));
    for (int j = 0; j < Vr; ++j) p[j] /= s;
    return std::log(s) + mx;
  };
  c.fwd = [=](const Ins& in) {
    DVec p(static_cast<size_t>(Vr));
    double L = 0;
    for (int n = 0; n < N; ++n) {
      if (tgt[n] < 0) continue;
      L += probs_row(in[0], n, p) - in[0][n * V + tgt[n]];
    }
    return DVec{L};
  };
  const double dl = c.dloss;
  c.bwd = [=](const Ins& in, const DVec&, const Ins&) {
    DVec g(in[0].size(), 0.0), p(static_cast<size_t>(Vr));
    for (int n = 0; n < N; ++n) {
      if (tgt[n] < 0) continue;
      probs_row(in[0], n, p);
      for (int j = 0; j < Vr; ++j) g[n * V + j] = (p[j] - (j == tgt[n] ? 1.0 : 0.0)) * dl;
    }
    return Ins{g};
  };
  c.K_fwd = V + N;  // per row: the max and exp sum over V; then the N row losses summed
  c.K_bwd = {double(V)};
  return c;
}

}  // namespace

// One test case per operator kind, so that a defect is reported (and, if ever needed, marked
// doctest::may_fail) per kind.
TEST_CASE("16-bit precision: linear (bf16, fp16) against float64") {
  check_case(linear_case(true, false));
  check_case(linear_case(false, false));
  check_case(linear_case(true, true));  // the lm_head: 16-bit inputs, fp32 logits
}
TEST_CASE("16-bit precision: layernorm (bf16, fp16) against float64") {
  check_case(norm_case(false, true));
  check_case(norm_case(false, false));
}
TEST_CASE("16-bit precision: rmsnorm (bf16, fp16) against float64") { check_case(norm_case(true, false)); }
TEST_CASE("16-bit precision: rope (bf16, fp16) against float64") { check_case(rope_case()); }
TEST_CASE("16-bit precision: attention (bf16, fp16) against float64") { check_case(attention_case()); }
TEST_CASE("16-bit precision: gelu (bf16, fp16) against float64") { check_case(gelu_case()); }
TEST_CASE("16-bit precision: relu2 (bf16, fp16) against float64") { check_case(relu2_case()); }
TEST_CASE("16-bit precision: swiglu (bf16, fp16) against float64") { check_case(swiglu_case()); }
TEST_CASE("16-bit precision: add (bf16, fp16) against float64") { check_case(add_case()); }
TEST_CASE("16-bit precision: dropout (bf16, fp16) against float64") { check_case(dropout_case()); }
TEST_CASE("16-bit precision: embedding (bf16, fp16) against float64") {
  check_case(embedding_case(true));
  check_case(embedding_case(false));
}
TEST_CASE("16-bit precision: softmax_xent (fp32 logits in a 16-bit model) against float64") {
  check_case(softmax_xent_case());
  // The executor's promise: the loss reads fp32 logits; 16-bit ones are refused.
  for (DType t : {DType::BF16, DType::F16}) {
    ops::NodeGraph b(OpKind::SoftmaxXent, kB, kT, "op");
    b.x({kN, 41}, t).targets().out("losses", {kN}, DType::F32);
    b.n.inplace = true;
    b.n.vocab_real = 37;
    const ops::Graph g = b.done().g;
    ops::Executor ex(g, ops::cpu_backend());
    std::vector<int32_t> tgt(static_cast<size_t>(kN), 0);
    std::vector<uint16_t> logits(static_cast<size_t>(kN) * 41, 0);
    ex.forward(nullptr, tgt.data(), true, kKey, 0, logits.data());
    CHECK_THROWS_AS(ex.backward(1.0f), std::logic_error);
  }
}

TEST_CASE("16-bit precision: every operator kind has a case above") {
  // Kinds covered by the test cases of this file; a new OpKind fails here until it has one.
  const OpKind covered[] = {OpKind::Embedding, OpKind::LayerNorm, OpKind::RMSNorm, OpKind::Linear,
                            OpKind::Rope,      OpKind::Attention, OpKind::Gelu,    OpKind::SwiGLU,
                            OpKind::Add,       OpKind::Dropout,   OpKind::SoftmaxXent, OpKind::Relu2};
  // Kinds that exist in fp32 only: their OpDef refuses 16-bit tensors, and the model builder
  // emits them only with fp32 activations. LinearGelu is linear + gelu fused; its
  // results equal those of the two cases above bit for bit (tests/test_ops_fused.cpp, which
  // also checks the refusal).
  const OpKind fp32_only[] = {OpKind::LinearGelu};
  // Fused kinds that run in 16 bits as the composition of kinds above: AddLayerNorm and
  // AddRMSNorm are the residual add and the norm of its rounded sum, bit for bit
  // the Add and LayerNorm / RMSNorm cases' kernels in bf16 and fp16 (tests/test_ops_fused.cpp).
  const OpKind composed[] = {OpKind::AddLayerNorm, OpKind::AddRMSNorm};
  CHECK(sizeof(covered) / sizeof(covered[0]) + sizeof(fp32_only) / sizeof(fp32_only[0]) +
            sizeof(composed) / sizeof(composed[0]) ==
        static_cast<size_t>(ops::kOpKinds));
}
