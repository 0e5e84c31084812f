// Tensor-parallel layers across real ranks, each against its unsharded counterpart. Run under
// MPI with 4 ranks (CMake registers it so):
//   mpirun -n 4 --oversubscribe test_mpi_layers
// Every rank builds the unsharded graph (tp = 1, run locally) and its own shard graph (tp rank
// = grid.tp().rank(), run with grid.tp() as the executor's ReduceGroup), feeds both the same
// input and the same upstream gradient, and compares the layer output, d(input) and every
// parameter gradient (shard element i against the full tensor's element
// runner::shard_to_full_index(i)). Grids: dp=2 x tp=2 (two tp groups, each with its own data)
// and dp=1 x tp=4.
//
// Cases:
//   1. column-parallel Linear (blocks 1, 2 and 3; with and without bias);
//   2. row-parallel Linear (bias replicated, added once);
//   3. the Megatron MLP (Column -> Gelu -> Row, and Column -> SwiGLU -> Row) and the attention
//      block (Column qkv, blocks = 3 -> [Rope] -> Attention over a head shard with dropout ->
//      Row proj);
//   4. a whole 1-layer GPT (GPT-2 style, tied embeddings; LLaMA style, untied) with a padded
//      vocabulary and ignored targets: vocabulary-parallel embedding and cross-entropy, logits
//      shards, per-position losses and every parameter gradient.
//
// Tolerance: everything is fp32. A sharded layer computes the same products as the unsharded
// one but sums them in another order (the Row all-reduce adds per-rank partial sums, the Column
// backward adds per-rank partial d(input), the vocabulary-parallel cross-entropy reduces max and
// sum-exp across shards), and the BLAS may block a smaller GEMM differently. With the short
// reductions used here (K <= 128 terms) each result differs by a few ulps of the largest terms,
// i.e. ~1e-7..1e-6 relative; we require max|shard - full| <= 1e-5 * max|full| over each
// compared tensor (relative to the tensor's max norm, so gradient entries near zero do not
// blow up a per-element relative error). A real sharding bug (wrong slice, missing or double
// reduction, bias added t times, a different dropout mask) gives errors of order 1.
//
// As in test_mpi_comm: checks never stop a test case early (CHECK, not REQUIRE), so one rank's
// failure cannot leave the others waiting in a collective; at the end the ranks sum their
// failure counts and all of them exit nonzero if any failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "mpi_doctest.h"
#include "ops/backend.h"
#include "ops/executor.h"
#include "ops/graph.h"
#include "ops/rng.h"
#include "parallel/comm.h"
#include "parallel/grid.h"
#include "runner/model/gpt.h"
#include "tests/support/models.h"

using ops::DType;
using ops::OpKind;
using ops::ShardSpec;
using ops::TensorDesc;
using ops::TpMode;

namespace {

int g_rank = -1;
constexpr double kTol = 1e-5;  // see the header comment

using Vec = std::vector<float>;

// The two grids over the 4 world ranks.
const parallel::GridShape kGrids[] = {{2, 2, 1}, {1, 4, 1}};

Vec randn(int64_t n, uint64_t key, float scale) {
  Vec v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = scale * ops::rng_normal(key, uint64_t(i));
  return v;
}

// max|a - ref| / max|ref|; +inf on a size mismatch or a non-finite value; NaN-safe.
double rel_err(const float* a, const float* ref, int64_t n, double* ref_max = nullptr) {
  double d = 0, m = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(a[i]) || !std::isfinite(ref[i])) return std::numeric_limits<double>::infinity();
    d = std::max(d, std::fabs(double(a[i]) - double(ref[i])));
    m = std::max(m, std::fabs(double(ref[i])));
  }
  if (ref_max) *ref_max = m;
  if (m == 0) return d == 0 ? 0 : std::numeric_limits<double>::infinity();
  return d / m;
}

// Compares `a` with `ref` (same size) and reports the name and error on failure. `nonzero`:
// the reference must not be all zeros (a vacuous comparison would hide a missing gradient).
void check_close(const std::string& what, const Vec& a, const Vec& ref, bool nonzero = true) {
  INFO("rank " << g_rank << ": " << what);
  CHECK(a.size() == ref.size());
  if (a.size() != ref.size()) return;
  double m = 0;
  const double e = rel_err(a.data(), ref.data(), int64_t(a.size()), &m);
  INFO("max|diff|/max|ref| = " << e << ", max|ref| = " << m);
  CHECK(e <= kTol);
  if (nonzero) CHECK(m > 0);
}

// A descriptor for a sharded activation or parameter, so runner::shard_to_full_index maps
// its elements (the same arithmetic for activations split along a column dimension).
TensorDesc desc(std::vector<int64_t> shape, std::vector<int64_t> full, ShardSpec sh) {
  TensorDesc d;
  d.shape = std::move(shape);
  d.full_shape = std::move(full);
  d.shard = sh;
  return d;
}

// The shard-shaped slice of a full tensor: out[i] = full[shard_to_full_index(d, i)].
Vec take(const TensorDesc& d, const Vec& full) {
  const int64_t n = ops::numel_of(d.shape);
  Vec out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t j = runner::shard_to_full_index(d, i);
    out[size_t(i)] = j >= 0 && j < int64_t(full.size()) ? full[size_t(j)] : std::numeric_limits<float>::quiet_NaN();
  }
  return out;
}

// A parameter's value: a function of (name, full element index), so every shard holds exactly
// the slice of the unsharded tensor. Norm weights sit near 1, everything else (biases too, so
// that a bias added t times shows) is normal(0, 0.2).
float param_value(const TensorDesc& d, int64_t full_index) {
  const uint64_t key = ops::rng_key(2024, ops::hash_name(d.name.c_str()));
  const float z = ops::rng_normal(key, uint64_t(full_index));
  const bool is_norm = d.name.find(".ln") != std::string::npos || d.name.rfind("ln_f", 0) == 0;
  return is_norm ? 1.0f + 0.1f * z : 0.2f * z;
}

// A graph with its parameters (filled by param_value) and an executor.
struct Bound {
  ops::Graph g;
  std::vector<ops::Tensor> vals, grads;  // by position in g.params
  std::unique_ptr<ops::Executor> ex;

  Bound(ops::Graph graph, ops::ReduceGroup* group) : g(std::move(graph)) {
    ex = std::make_unique<ops::Executor>(g, ops::cpu_backend());
    vals.reserve(g.params.size());
    grads.reserve(g.params.size());
    for (int id : g.params) {
      const TensorDesc& d = g.tensors[size_t(id)];
      // Tied weights (one tensor id listed once, but maybe a second id with the same name).
      vals.emplace_back(d.shape, DType::F32, ops::Account::Parameters);
      grads.emplace_back(d.shape, DType::F32, ops::Account::Gradients);
      float* p = vals.back().data<float>();
      for (int64_t i = 0; i < vals.back().numel(); ++i) p[i] = param_value(d, runner::shard_to_full_index(d, i));
    }
    for (size_t k = 0; k < g.params.size(); ++k) {
      // A name seen before binds the first tensor of that name (shared gradient).
      size_t first = k;
      for (size_t j = 0; j < k; ++j)
        if (g.tensors[size_t(g.params[j])].name == g.tensors[size_t(g.params[k])].name) { first = j; break; }
      ex->bind_param(g.params[k], &vals[first], &grads[first]);
    }
    if (group) ex->set_group(group);
  }

  // Gradient of the named parameter (first tensor of that name).
  Vec grad(const std::string& name) const {
    for (size_t k = 0; k < g.params.size(); ++k)
      if (g.tensors[size_t(g.params[k])].name == name) {
        const float* p = grads[k].data<float>();
        return Vec(p, p + grads[k].numel());
      }
    return {};
  }
  const TensorDesc* param_desc(const std::string& name) const {
    for (int id : g.params)
      if (g.tensors[size_t(id)].name == name) return &g.tensors[size_t(id)];
    return nullptr;
  }
};

// ================================================================== single-layer graphs

enum class Layer { Column, Row, Mlp, Attention };

struct LayerCase {
  std::string name;
  Layer layer;
  int64_t B = 2, T = 8;
  int64_t C = 32;        // input width (Column, Mlp, Attention), output width (Row, Mlp, Attention)
  int64_t OC = 48;       // Column: output width; Row: output width
  int64_t IC = 64;       // Row: input width
  int blocks = 1;        // Column: the weight's output dimension is `blocks` separately split blocks
  bool bias = true;
  bool swiglu = false;   // Mlp
  int64_t H = 64;        // Mlp hidden width
  int64_t NH = 4;        // Attention heads
  bool rope = false;     // Attention
  float dropout = 0.2f;  // Attention probabilities
  uint32_t site = 77;
};

// The input and output widths of the layer as a whole, unsharded.
int64_t in_width(const LayerCase& c) { return c.layer == Layer::Row ? c.IC : c.C; }
int64_t out_width(const LayerCase& c) {
  return c.layer == Layer::Column ? c.OC : c.layer == Layer::Row ? c.OC : c.C;
}

// A column-split activation (N, cols/t) of the full (N, cols).
TensorDesc col_desc(int64_t N, int64_t cols, int t, int r, int blocks = 1) {
  return desc({N, cols / t}, {N, cols}, ShardSpec{t > 1 ? 1 : -1, t, r, blocks, {}, 0});
}

// The layer of case `c` as tp rank r of t (t == 1: the unsharded reference).
ops::Graph build_layer(const LayerCase& c, int t, int r) {
  ops::Graph g;
  g.B = c.B;
  g.T = c.T;
  const int64_t N = c.B * c.T;
  auto col_w = [&](const std::string& name, int64_t OC, int64_t IC, int blocks) {
    return g.add_param(name, {OC / t, IC}, 0, true, ShardSpec{t > 1 ? 0 : -1, t, r, blocks, {}, 0}, {OC, IC});
  };
  auto col_b = [&](const std::string& name, int64_t OC, int blocks) {
    return g.add_param(name, {OC / t}, 0, false, ShardSpec{t > 1 ? 0 : -1, t, r, blocks, {}, 0}, {OC});
  };
  auto row_w = [&](const std::string& name, int64_t OC, int64_t IC) {
    return g.add_param(name, {OC, IC / t}, 0, true, ShardSpec{t > 1 ? 1 : -1, t, r, 1, {}, 0}, {OC, IC});
  };
  auto linear = [&](const std::string& name, int x, int w, int b, int64_t out_cols, TpMode mode) {
    int y = g.add_activation(name + ".out", {N, out_cols}, 0);
    ops::Node n;
    n.kind = OpKind::Linear;
    n.name = name;
    n.in = {x, w};
    if (b >= 0) n.in.push_back(b);
    n.out = {y};
    n.layer = 0;
    n.module = ops::Module::attention;
    n.tp = t > 1 ? mode : TpMode::None;
    g.add_node(std::move(n));
    return y;
  };
  int x = g.add_activation("in", {N, in_width(c) / (c.layer == Layer::Row ? t : 1)}, 0);
  g.stage_input = x;
  int y = -1;
  switch (c.layer) {
    case Layer::Column: {
      int w = col_w("lin.weight", c.OC, c.C, c.blocks);
      int b = c.bias ? col_b("lin.bias", c.OC, c.blocks) : -1;
      y = linear("lin", x, w, b, c.OC / t, TpMode::Column);
      break;
    }
    case Layer::Row: {
      int w = row_w("lin.weight", c.OC, c.IC);
      int b = c.bias ? g.add_param("lin.bias", {c.OC}, 0, false) : -1;
      y = linear("lin", x, w, b, c.OC, TpMode::Row);
      break;
    }
    case Layer::Mlp: {
      const int64_t fc_out = c.swiglu ? 2 * c.H : c.H;
      const int blocks = c.swiglu ? 2 : 1;
      int w1 = col_w("mlp.fc.weight", fc_out, c.C, blocks);
      int b1 = c.bias ? col_b("mlp.fc.bias", fc_out, blocks) : -1;
      int u = linear("mlp.fc", x, w1, b1, fc_out / t, TpMode::Column);
      int h = g.add_activation("mlp.act.out", {N, c.H / t}, 0);
      ops::Node a;
      a.kind = c.swiglu ? OpKind::SwiGLU : OpKind::Gelu;
      a.name = "mlp.act";
      a.in = {u};
      a.out = {h};
      a.layer = 0;
      a.module = ops::Module::mlp;
      g.add_node(std::move(a));
      int w2 = row_w("mlp.proj.weight", c.C, c.H);
      int b2 = c.bias ? g.add_param("mlp.proj.bias", {c.C}, 0, false) : -1;
      y = linear("mlp.proj", h, w2, b2, c.C, TpMode::Row);
      break;
    }
    case Layer::Attention: {
      const int heads = static_cast<int>(c.NH / t);
      int wq = col_w("attn.qkv.weight", 3 * c.C, c.C, 3);
      int bq = c.bias ? col_b("attn.qkv.bias", 3 * c.C, 3) : -1;
      int qkv = linear("attn.qkv", x, wq, bq, 3 * c.C / t, TpMode::Column);
      if (c.rope) {
        int rr = g.add_activation("attn.rope.out", {N, 3 * c.C / t}, 0);
        ops::Node n;
        n.kind = OpKind::Rope;
        n.name = "attn.rope";
        n.in = {qkv};
        n.out = {rr};
        n.layer = 0;
        n.module = ops::Module::attention;
        n.heads = heads;
        n.theta = 10000.0f;
        g.add_node(std::move(n));
        qkv = rr;
      }
      int ao = g.add_activation("attn.core.out", {N, c.C / t}, 0);
      int probs = g.add_activation("attn.core.lse", {c.B, c.NH / t, c.T}, 0, ops::DType::F32);
      ops::Node n;
      n.kind = OpKind::Attention;
      n.name = "attn.core";
      n.in = {qkv};
      n.out = {ao, probs};
      n.layer = 0;
      n.module = ops::Module::attention_core;
      n.heads = heads;
      n.heads_total = static_cast<int>(c.NH);
      n.head_start = r * heads;
      n.dropout = c.dropout;
      n.site = c.site;
      g.add_node(std::move(n));
      int wo = row_w("attn.proj.weight", c.C, c.C);
      int bo = c.bias ? g.add_param("attn.proj.bias", {c.C}, 0, false) : -1;
      y = linear("attn.proj", ao, wo, bo, c.C, TpMode::Row);
      break;
    }
  }
  g.stage_output = y;
  g.finalize();
  return g;
}

// One forward + backward of a single-layer graph: input -> output, d(output) -> d(input).
struct LayerResult {
  Vec out, din;
};
LayerResult run_layer(Bound& b, const Vec& in, const Vec& dout, uint64_t key, int64_t sample_offset) {
  const ops::Graph& g = b.g;
  LayerResult r;
  r.out.assign(size_t(ops::numel_of(g.tensors[size_t(g.stage_output)].shape)), std::nanf(""));
  r.din.assign(size_t(ops::numel_of(g.tensors[size_t(g.stage_input)].shape)), std::nanf(""));
  CHECK(in.size() == r.din.size());
  CHECK(dout.size() == r.out.size());
  b.ex->forward(nullptr, nullptr, true, key, sample_offset, in.data(), r.out.data());
  b.ex->backward(1.0f, dout.data(), r.din.data());
  return r;
}

void check_layer(const LayerCase& c, parallel::Grid& grid) {
  parallel::Communicator& tp = grid.tp();
  const int t = tp.size(), r = tp.rank();
  CAPTURE(c.name);
  CAPTURE(t);
  CAPTURE(r);
  // Shapes this test needs to divide evenly.
  const bool ok = c.OC % (t * c.blocks) == 0 && c.IC % t == 0 && c.H % t == 0 && c.NH % t == 0 &&
                  c.C % c.NH == 0;
  CHECK(ok);
  if (!ok) return;
  const int64_t N = c.B * c.T, IW = in_width(c), OW = out_width(c);
  // Inputs differ across the dp groups of the 2x2 grid (and from case to case).
  const uint64_t seed = ops::rng_key(11, ops::hash_name(c.name.c_str()), uint64_t(grid.coords().dp), uint64_t(t));
  const Vec x = randn(N * IW, ops::rng_key(seed, 1), 1.0f);
  const Vec dy = randn(N * OW, ops::rng_key(seed, 2), 1.0f);
  const uint64_t key = ops::rng_key(seed, 3);
  const int64_t sample_offset = 3;  // a micro-batch inside a bigger batch: dropout counters move

  Bound full(build_layer(c, 1, 0), nullptr);
  Bound shard(build_layer(c, t, r), &tp);
  const LayerResult fr = run_layer(full, x, dy, key, sample_offset);

  // The shard's input and d(output): a column slice where the layer takes or gives one.
  const TensorDesc in_d = c.layer == Layer::Row ? col_desc(N, IW, t, r) : desc({N, IW}, {N, IW}, {});
  const TensorDesc out_d = c.layer == Layer::Column ? col_desc(N, OW, t, r, c.blocks) : desc({N, OW}, {N, OW}, {});
  const LayerResult sr = run_layer(shard, take(in_d, x), take(out_d, dy), key, sample_offset);

  check_close(c.name + ": output", sr.out, take(out_d, fr.out));
  check_close(c.name + ": d(input)", sr.din, take(in_d, fr.din));
  CHECK(shard.g.params.size() == full.g.params.size());
  for (int id : shard.g.params) {
    const TensorDesc& d = shard.g.tensors[size_t(id)];
    const Vec fg = full.grad(d.name);
    CHECK_MESSAGE(!fg.empty(), d.name);
    if (fg.empty()) continue;
    const TensorDesc* fd = full.param_desc(d.name);
    CHECK(fd->shape == d.full_shape);
    check_close(c.name + ": grad " + d.name, shard.grad(d.name), take(d, fg));
  }
  // The outputs of the tp ranks must be consistent with each other too: a replicated output is
  // bit-identical on every member (the all-reduce gives every member the same bits).
  if (c.layer != Layer::Column) {
    Vec all(size_t(int64_t(sr.out.size()) * t));
    std::copy(sr.out.begin(), sr.out.end(), all.begin() + int64_t(sr.out.size()) * r);
    tp.allgather_inplace(all.data(), int64_t(sr.out.size()));
    bool same = true;
    for (int q = 0; q < t; ++q) same &= std::equal(sr.out.begin(), sr.out.end(), all.begin() + int64_t(sr.out.size()) * q);
    CHECK_MESSAGE(same, c.name << ": replicated output differs across tp ranks");
  }
}

void for_each_grid(const std::vector<LayerCase>& cases) {
  for (const auto& shape : kGrids) {
    parallel::Grid grid(parallel::mpi_world(), shape);
    for (const auto& c : cases) check_layer(c, grid);
  }
}

// ================================================================== whole model

std::vector<int32_t> ids(int64_t n, uint64_t key, int64_t V) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = static_cast<int32_t>(ops::rng_u32(key, uint64_t(i)) % uint64_t(V));
  return v;
}

void check_model(const runner::ModelConfig& m, const std::string& label, parallel::Grid& grid) {
  parallel::Communicator& tp = grid.tp();
  const int t = tp.size(), r = tp.rank();
  CAPTURE(label);
  CAPTURE(t);
  CAPTURE(r);
  const int64_t B = 2, T = m.seq_len, N = B * T;
  const int64_t Vpad = runner::padded_vocab(m.vocab_size, t);

  runner::GptSpec fs;
  fs.model = m;
  fs.B = B;
  fs.vocab_padded = Vpad;  // the same logical (padded) table as the shards: full_shape matches
  runner::GptSpec ss = fs;
  ss.tp = t;
  ss.tp_rank = r;
  Bound full(runner::build_gpt_graph(fs), nullptr);
  Bound shard(runner::build_gpt_graph(ss), &tp);
  CHECK(shard.g.tensors[size_t(shard.g.logits)].shape == std::vector<int64_t>{N, Vpad / t});

  const uint64_t seed = ops::rng_key(5, ops::hash_name(label.c_str()), uint64_t(grid.coords().dp), uint64_t(t));
  std::vector<int32_t> tokens = ids(N, ops::rng_key(seed, 1), m.vocab_size);
  std::vector<int32_t> targets = ids(N, ops::rng_key(seed, 2), m.vocab_size);
  // Ids at both ends of the vocabulary (the last real id sits in the last shard, next to the
  // padding), and ignored positions.
  tokens[0] = 0;
  tokens[1] = int32_t(m.vocab_size - 1);
  targets[0] = int32_t(m.vocab_size - 1);
  targets[1] = 0;
  targets[2] = -1;
  targets[size_t(N - 1)] = -1;

  // Logits (inference): this rank's vocabulary columns of the full logits, padding included.
  {
    const ops::Tensor& fl = full.ex->forward_logits(tokens.data());
    const Vec flv(fl.data<float>(), fl.data<float>() + fl.numel());
    const ops::Tensor& sl = shard.ex->forward_logits(tokens.data());
    const Vec slv(sl.data<float>(), sl.data<float>() + sl.numel());
    check_close(label + ": logits", slv, take(col_desc(N, Vpad, t, r), flv));
  }
  // Per-position losses (inference): one forward per position with every other target ignored.
  {
    Vec fl(static_cast<size_t>(N)), sl(static_cast<size_t>(N));
    std::vector<int32_t> one(size_t(N), -1);
    int64_t counted = 0;
    for (int64_t k = 0; k < N; ++k) {
      one.assign(size_t(N), -1);
      one[size_t(k)] = targets[size_t(k)];
      const auto a = full.ex->forward(tokens.data(), one.data(), false);
      const auto b = shard.ex->forward(tokens.data(), one.data(), false);
      CHECK(a.count == b.count);
      counted += b.count;
      fl[size_t(k)] = float(a.sum);
      sl[size_t(k)] = float(b.sum);
    }
    CHECK(counted == N - 2);
    check_close(label + ": per-position loss", sl, fl);
  }
  // Training step: loss with dropout, then every parameter gradient.
  const uint64_t key = ops::rng_key(seed, 3);
  const auto fls = full.ex->forward(tokens.data(), targets.data(), true, key, 0);
  const auto sls = shard.ex->forward(tokens.data(), targets.data(), true, key, 0);
  CHECK(sls.count == fls.count);
  CHECK(fls.count == N - 2);
  {
    INFO("rank " << g_rank << " " << label << ": loss " << sls.sum << " vs " << fls.sum);
    CHECK(std::fabs(sls.sum - fls.sum) <= kTol * std::fabs(fls.sum));
  }
  full.ex->backward(1.0f / float(fls.count));
  shard.ex->backward(1.0f / float(sls.count));
  size_t compared = 0;
  for (size_t k = 0; k < shard.g.params.size(); ++k) {
    const TensorDesc& d = shard.g.tensors[size_t(shard.g.params[k])];
    bool seen = false;  // tied weights: compare once
    for (size_t j = 0; j < k; ++j) seen |= shard.g.tensors[size_t(shard.g.params[j])].name == d.name;
    if (seen) continue;
    const Vec fg = full.grad(d.name);
    CHECK_MESSAGE(!fg.empty(), d.name);
    if (fg.empty()) continue;
    CHECK(full.param_desc(d.name)->shape == d.full_shape);
    check_close(label + ": grad " + d.name, shard.grad(d.name), take(d, fg));
    ++compared;
  }
  size_t full_unique = 0;
  for (size_t k = 0; k < full.g.params.size(); ++k) {
    bool seen = false;
    for (size_t j = 0; j < k; ++j) seen |= full.g.tensors[size_t(full.g.params[j])].name == full.g.tensors[size_t(full.g.params[k])].name;
    full_unique += !seen;
  }
  CHECK(compared == full_unique);
}

runner::ModelConfig tiny_model(bool llama, int64_t vocab) {
  runner::ModelConfig m = test_support::small_model(vocab, 8, 32, 4, 1);
  m.mlp_ratio = 2.0;
  m.dropout = 0.1;
  if (llama) test_support::make_llama(m);
  return m;
}

}  // namespace

TEST_CASE("column-parallel Linear == the unsharded Linear (output slice, d(input) all-reduced, grads)") {
  std::vector<LayerCase> cases;
  LayerCase c;
  c.layer = Layer::Column;
  c.name = "column";
  c.OC = 48;
  cases.push_back(c);
  c.name = "column no bias";
  c.bias = false;
  cases.push_back(c);
  c.name = "column blocks=3 (qkv)";
  c.bias = true;
  c.OC = 3 * 32;
  c.blocks = 3;
  cases.push_back(c);
  c.name = "column blocks=2 (swiglu fc)";
  c.OC = 2 * 32;
  c.blocks = 2;
  cases.push_back(c);
  for_each_grid(cases);
}

TEST_CASE("row-parallel Linear == the unsharded Linear (output all-reduced, bias once, d(input) slice)") {
  std::vector<LayerCase> cases;
  LayerCase c;
  c.layer = Layer::Row;
  c.name = "row";
  c.IC = 64;
  c.OC = 40;
  cases.push_back(c);
  c.name = "row no bias";
  c.bias = false;
  cases.push_back(c);
  for_each_grid(cases);
}

TEST_CASE("Megatron MLP (Column -> act -> Row) == the unsharded MLP") {
  std::vector<LayerCase> cases;
  LayerCase c;
  c.layer = Layer::Mlp;
  c.name = "mlp gelu";
  cases.push_back(c);
  c.name = "mlp swiglu";
  c.swiglu = true;
  c.bias = false;
  cases.push_back(c);
  for_each_grid(cases);
}

TEST_CASE("attention block (Column qkv -> head-shard attention with dropout -> Row proj) == unsharded") {
  std::vector<LayerCase> cases;
  LayerCase c;
  c.layer = Layer::Attention;
  c.name = "attention";
  cases.push_back(c);
  c.name = "attention rope no bias";
  c.rope = true;
  c.bias = false;
  cases.push_back(c);
  c.name = "attention no dropout";
  c.rope = false;
  c.bias = true;
  c.dropout = 0.0f;
  cases.push_back(c);
  for_each_grid(cases);
}

TEST_CASE("1-layer GPT: vocabulary-parallel embedding and cross-entropy, padded vocabulary, ignored targets") {
  for (const auto& shape : kGrids) {
    parallel::Grid grid(parallel::mpi_world(), shape);
    // 61: padded to 62 (tp 2) and 64 (tp 4: the last shard has 13 real columns and 3 padding).
    check_model(tiny_model(false, 61), "gpt2 V=61", grid);
    check_model(tiny_model(true, 61), "llama V=61", grid);
  }
}

int main(int argc, char** argv) {
  parallel::init_mpi(&argc, &argv);
  const int rc = mpi_doctest::run(argc, argv, "test_mpi_layers", &g_rank);
  parallel::finalize_mpi();
  return rc;
}
