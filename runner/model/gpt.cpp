// The gpt family: a pre-norm decoder (GPT-2 with layernorm + gelu + learned positions,
// LLaMA-style with rmsnorm + swiglu + rope) expanded into one graph per rank.
#include "runner/model/gpt.h"

#include "ops/convert.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <optional>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "ops/gemm_path.h"
#include "ops/kv_cache.h"
#include "ops/ops.h"
#include "ops/rng.h"

namespace runner {

using ops::DType;
using ops::Graph;
using ops::Module;
using ops::Node;
using ops::OpKind;
using ops::ShardSpec;

int64_t padded_vocab(int64_t vocab, int64_t multiple) {
  if (multiple <= 1) return vocab;
  return (vocab + multiple - 1) / multiple * multiple;
}

bool kv_replicated(const ModelConfig& m, int64_t tp) { return tp > 1 && m.kv_heads() % tp != 0; }

int64_t rank_kv_heads(const ModelConfig& m, int64_t tp) {
  return kv_replicated(m, tp) ? m.kv_heads() : m.kv_heads() / std::max<int64_t>(1, tp);
}

ops::DType kv_cache_dtype(KvFormat f) {
  switch (f) {
    case KvFormat::fp32: return ops::DType::F32;
    case KvFormat::bf16: return ops::DType::BF16;
    case KvFormat::fp16: return ops::DType::F16;
    case KvFormat::int8: return ops::DType::I8;
  }
  return ops::DType::F32;
}

int64_t kv_cache_position_bytes(const ModelConfig& m, int64_t tp, KvFormat f) {
  const int64_t nkv = rank_kv_heads(m, tp);
  return static_cast<int64_t>(ops::KvCache::bytes_for(1, 1, 1, nkv * (m.d_model / m.n_heads), nkv, kv_cache_dtype(f)));
}

std::vector<ops::ModuleSet> recompute_sets(const RecomputeConfig& rc, int64_t n_layers) {
  std::vector<ops::ModuleSet> sets(static_cast<size_t>(n_layers));
  if (rc.mode == RecomputeMode::none) return sets;
  ops::ModuleSet mods;
  if (rc.mode == RecomputeMode::full) mods = ops::layer_modules();
  else for (RecomputeModule m : rc.modules) mods |= ops::ModuleSet{m};
  mods = ops::with_parts(mods);
  if (rc.layers.empty()) {
    for (auto& s : sets) s = mods;
  } else {
    for (int64_t l : rc.layers)
      if (l >= 0 && l < n_layers) sets[static_cast<size_t>(l)] = mods;
  }
  return sets;
}

namespace {

// The MLP activation's operator: the OpDef named as the recipe's word (kActivationFacts).
OpKind activation_kind(Activation a) {
  const std::optional<OpKind> k = ops::op_kind_named(to_string(a));
  if (!k) throw std::logic_error("model.activation " + to_string(a) + " has no operator of that name (ops/op_pointwise.cpp)");
  return *k;
}

// The parameters indexed by vocabulary id (gpt_vocab_param).
constexpr const char* kEmbedding = "wte";
constexpr const char* kHead = "lm_head.weight";

struct Builder {
  const GptSpec& s;
  Graph g;
  int64_t C, H, V, NH, t, N;
  int64_t NKV, HS;  // key-value heads (grouped-query attention) and head size
  int64_t Ns;  // rows of the sequence-sharded regions (N, or N/t under sequence parallelism)
  bool sp;
  DType act;

  explicit Builder(const GptSpec& spec) : s(spec) {
    const ModelConfig& m = s.model;
    t = s.tp;
    C = m.d_model;
    H = m.mlp_hidden();
    V = s.vocab_padded ? s.vocab_padded : padded_vocab(m.vocab_size, t);
    NH = m.n_heads;
    NKV = m.kv_heads();
    HS = C / NH;
    g.B = s.B;
    g.T = s.decode ? 1 : (s.T ? s.T : m.seq_len);
    g.decode = s.decode;
    N = g.B * g.T;
    sp = s.sequence_parallel && t > 1;
    Ns = sp ? N / t : N;
    if (sp) {
      g.sp_parts = static_cast<int>(t);
      g.sp_index = static_cast<int>(s.tp_rank);
    }
    act = s.act_dtype;
  }

  bool recomputes(int layer, Module module) const {
    if (layer < 0 || layer >= static_cast<int>(s.recompute.size())) return false;
    return s.recompute[static_cast<size_t>(layer)].has(module);
  }

  int node(OpKind k, const std::string& name, std::vector<int> in, std::vector<int> out, int layer,
           Module module) {
    Node n;
    n.kind = k;
    n.name = name;
    n.in = std::move(in);
    n.out = std::move(out);
    n.layer = layer;
    n.module = module;
    n.recompute = recomputes(layer, module);
    n.eps = static_cast<float>(s.model.norm_eps);
    n.heads = static_cast<int>(NH / t);
    n.theta = static_cast<float>(s.model.rope_theta);
    n.kv_heads = static_cast<int>(rank_kv_heads(s.model, t));
    n.kv_group = static_cast<int>(NH / NKV);
    n.kv_first = kv_replicated(s.model, t) ? static_cast<int>(s.tp_rank * (NH / t)) : 0;
    return g.add_node(std::move(n));
  }

  // The fused attention input projection's weight ((NH + 2 NKV) HS, C) or bias: rows
  // [q | k | v], each block split over tp, except k and v when tp does not divide NKV
  // (replicated on every rank; ShardSpec::replicated).
  int qkv_param(const std::string& name, bool bias, int layer) {
    ShardSpec sh{t > 1 ? 0 : -1, static_cast<int>(t), static_cast<int>(s.tp_rank), 3};
    sh.sizes = {NH * HS, NKV * HS, NKV * HS};
    if (kv_replicated(s.model, t)) sh.replicated = 0b110;
    const int64_t full = (NH + 2 * NKV) * HS, rows = sh.shard_len(full);
    if (bias) return g.add_param(name, {rows}, layer, false, sh, {full});
    return g.add_param(name, {rows, C}, layer, true, sh, {full, C});
  }

  // A column-parallel weight (OC, IC): output rows split across tp ranks.
  int col_weight(const std::string& name, int64_t OC, int64_t IC, int layer, int blocks = 1) {
    ShardSpec sh{t > 1 ? 0 : -1, static_cast<int>(t), static_cast<int>(s.tp_rank), blocks};
    return g.add_param(name, {OC / t, IC}, layer, true, sh, {OC, IC});
  }
  int col_bias(const std::string& name, int64_t OC, int layer, int blocks = 1) {
    ShardSpec sh{t > 1 ? 0 : -1, static_cast<int>(t), static_cast<int>(s.tp_rank), blocks};
    return g.add_param(name, {OC / t}, layer, false, sh, {OC});
  }
  // A row-parallel weight (OC, IC): input columns split across tp ranks.
  int row_weight(const std::string& name, int64_t OC, int64_t IC, int layer) {
    ShardSpec sh{t > 1 ? 1 : -1, static_cast<int>(t), static_cast<int>(s.tp_rank), 1};
    return g.add_param(name, {OC, IC / t}, layer, true, sh, {OC, IC});
  }

  // Pre-norm: returns the normalised activation.
  // A replicated parameter used on sequence shards: its gradient is partial per tp rank.
  int seq_param(const std::string& name, int64_t n, int layer) {
    int id = g.add_param(name, {n}, layer, false);
    g.tensors[id].seq_partial = sp;
    return id;
  }

  int norm(const std::string& prefix, int x, int layer, Module module) {
    const ModelConfig& m = s.model;
    int w = seq_param(prefix + ".weight", C, layer);
    int y = g.add_activation(prefix + ".out", {Ns, C}, layer, act);
    if (m.norm == Norm::rmsnorm) {
      int rstd = g.add_activation(prefix + ".rstd", {Ns}, layer, DType::F32);
      node(OpKind::RMSNorm, prefix, {x, w}, {y, rstd}, layer, module);
    } else {
      std::vector<int> in{x, w};
      if (m.bias) in.push_back(seq_param(prefix + ".bias", C, layer));
      int mean = g.add_activation(prefix + ".mean", {Ns}, layer, DType::F32);
      int rstd = g.add_activation(prefix + ".rstd", {Ns}, layer, DType::F32);
      node(OpKind::LayerNorm, prefix, in, {y, mean, rstd}, layer, module);
    }
    return y;
  }

  // kind: 'c' column-parallel (gathers a sequence-sharded input under sp), 'r' row-parallel
  // (scatters its output to sequence shards under sp), 'n' neither.
  int linear(const std::string& prefix, int x, int w, int b, int64_t out_cols, int layer, Module module,
             char kind = 'n') {
    std::vector<int> in{x, w};
    if (b >= 0) in.push_back(b);
    int y = g.add_activation(prefix + ".out", {sp && kind == 'r' ? Ns : N, out_cols}, layer, act);
    int id = node(OpKind::Linear, prefix, in, {y}, layer, module);
    g.nodes[id].gather_input = sp && kind == 'c';
    g.nodes[id].scatter_output = sp && kind == 'r';
    if (t > 1 && kind == 'c') g.nodes[id].tp = ops::TpMode::Column;
    if (t > 1 && kind == 'r') g.nodes[id].tp = ops::TpMode::Row;
    return y;
  }

  // The fc Linear and its GELU as one LinearGelu node (ops/op_fused.cpp), where the
  // recipe allows it (model.fuse) and the graph does: fp32 activations (a 16-bit pre-activation
  // is rounded before the unfused GELU reads it, and the 16-bit GEMMs are the Linear's) and no
  // sequence parallelism (its gathers are the Linear's).
  bool fuse_fc_gelu() const {
    return s.model.fuse && s.model.activation == Activation::gelu && act == DType::F32 && !sp;
  }
  // h = gelu(x W^T + b): the unfused pair's tensors under their names (fc.out is the kept
  // pre-activation), one node.
  int fc_gelu(const std::string& prefix, int x, int w, int b, int layer) {
    std::vector<int> in{x, w};
    if (b >= 0) in.push_back(b);
    int pre = g.add_activation(prefix + ".fc.out", {N, H / t}, layer, act);
    int h = g.add_activation(prefix + ".act.out", {N, H / t}, layer, act);
    int id = node(OpKind::LinearGelu, prefix + ".fc_gelu", in, {h, pre}, layer, Module::mlp);
    if (t > 1) g.nodes[id].tp = ops::TpMode::Column;
    return h;
  }

  int dropout(const std::string& prefix, int x, int layer, Module module, uint32_t site) {
    if (s.model.dropout <= 0.0) return x;
    int y = g.add_activation(prefix + ".out", g.tensors[x].shape, layer, act);
    int id = node(OpKind::Dropout, prefix, {x}, {y}, layer, module);
    g.nodes[id].seq_shard = sp;
    g.nodes[id].dropout = static_cast<float>(s.model.dropout);
    g.nodes[id].site = site;
    return y;
  }

  int add(const std::string& name, int a, int b, int layer) {
    int y = g.add_activation(name + ".out", {Ns, C}, layer, act);
    node(OpKind::Add, name, {a, b}, {y}, layer, Module::residual);
    return y;
  }

  // The block's first residual add and the norm that reads its sum as one node,
  // AddLayerNorm or AddRMSNorm (ops/op_fused.cpp), where the recipe allows it (model.fuse) and
  // the graph does: no tensor or sequence parallelism (the norm's rows and partial weight
  // gradients differ there); 16-bit activations only on the 16-bit-native path (the executor's
  // widened path would hand the kernel an unrounded fp32 sum; ops::native16_enabled, not on a
  // GPU plan, not in a decode graph); and only where the layer's recompute set treats the
  // residual and norm modules alike (a set recomputing the norm alone must keep the sum and
  // recompute the norm from it, which one node cannot do). Within the layer only: the second
  // add with the next layer's first norm (or ln_f) would be a node of two layers, which a
  // pipeline stage cut, a per-layer recompute segment and the per-layer activation accounting
  // (recompute auto's probe layer, TensorDesc::layer) would each have to split again.
  bool fuse_add_norm(int layer) const {
    if (!s.model.fuse || sp || t > 1) return false;
    if (act != DType::F32 && (s.decode || !ops::native16_enabled() || ops::gemm_paths_device_now())) return false;
    return recomputes(layer, Module::residual) == recomputes(layer, Module::norm);
  }
  // sum = a + b and y = norm(sum): the unfused Add's and norm's tensors under their names and
  // in their creation order (so tensor and parameter ids match the unfused graph's), one node
  // tagged Module::norm (the node is recomputed with the layer's norms, which fuse_add_norm
  // made the same as its residual adds). Returns {sum, y}.
  std::pair<int, int> add_norm(const std::string& add_name, const std::string& prefix, int a, int b, int layer) {
    const ModelConfig& m = s.model;
    int sum = g.add_activation(add_name + ".out", {Ns, C}, layer, act);
    int w = seq_param(prefix + ".weight", C, layer);
    int y = g.add_activation(prefix + ".out", {Ns, C}, layer, act);
    if (m.norm == Norm::rmsnorm) {
      int rstd = g.add_activation(prefix + ".rstd", {Ns}, layer, DType::F32);
      node(OpKind::AddRMSNorm, add_name + "_" + prefix.substr(prefix.rfind('.') + 1), {a, b, w}, {sum, y, rstd},
           layer, Module::norm);
    } else {
      std::vector<int> in{a, b, w};
      if (m.bias) in.push_back(seq_param(prefix + ".bias", C, layer));
      int mean = g.add_activation(prefix + ".mean", {Ns}, layer, DType::F32);
      int rstd = g.add_activation(prefix + ".rstd", {Ns}, layer, DType::F32);
      node(OpKind::AddLayerNorm, add_name + "_" + prefix.substr(prefix.rfind('.') + 1), in, {sum, y, mean, rstd},
           layer, Module::norm);
    }
    return {sum, y};
  }

  int block(int x, int l) {
    const ModelConfig& m = s.model;
    std::string p = "h." + std::to_string(l);
    uint32_t site = static_cast<uint32_t>(l + 1) * 8;
    // Attention.
    int a = norm(p + ".ln1", x, l, Module::norm);
    int wqkv = qkv_param(p + ".attn.qkv.weight", false, l);
    int bqkv = m.bias ? qkv_param(p + ".attn.qkv.bias", true, l) : -1;
    const int64_t W = g.tensors[static_cast<size_t>(wqkv)].shape[0];  // this rank's [q | k | v] rows
    int qkv = linear(p + ".attn.qkv", a, wqkv, bqkv, W, l, Module::attention, 'c');
    if (m.position == Position::rope && !s.decode) {  // decode: the cached attention rotates at each row's position
      int r = g.add_activation(p + ".attn.rope.out", {N, W}, l, act);
      node(OpKind::Rope, p + ".attn.rope", {qkv}, {r}, l, Module::attention);
      qkv = r;
    }
    int y = g.add_activation(p + ".attn.core.out", {N, C / t}, l, act);
    std::vector<int> core_out{y};
    // Saved for the backward: each query row's log-sum-exp in fp32, not the (T, T)
    // probabilities (flash-style attention, ops/backend.h).
    if (!s.decode) core_out.push_back(g.add_activation(p + ".attn.core.lse", {g.B, NH / t, g.T}, l, DType::F32));
    int core = node(OpKind::Attention, p + ".attn.core", {qkv}, core_out, l, Module::attention_core);
    g.nodes[core].rope = s.decode && m.position == Position::rope;
    g.nodes[core].dropout = static_cast<float>(m.dropout);
    g.nodes[core].site = site + 1;
    g.nodes[core].heads_total = static_cast<int>(NH);
    g.nodes[core].head_start = static_cast<int>(s.tp_rank * (NH / t));
    int wo = row_weight(p + ".attn.proj.weight", C, C, l);
    int bo = m.bias ? seq_param(p + ".attn.proj.bias", C, l) : -1;
    int o = linear(p + ".attn.proj", y, wo, bo, C, l, Module::attention, 'r');
    o = dropout(p + ".attn.drop", o, l, Module::attention, site + 2);
    int x1, mm;
    if (fuse_add_norm(l)) {
      std::tie(x1, mm) = add_norm(p + ".res1", p + ".ln2", x, o, l);
    } else {
      x1 = add(p + ".res1", x, o, l);
      mm = norm(p + ".ln2", x1, l, Module::norm);
    }
    // MLP.
    bool glu = activation_facts(m.activation).gated;
    int64_t fc_out = glu ? 2 * H : H;
    int wfc = col_weight(p + ".mlp.fc.weight", fc_out, C, l, glu ? 2 : 1);
    int bfc = m.bias ? col_bias(p + ".mlp.fc.bias", fc_out, l, glu ? 2 : 1) : -1;
    int h;
    if (fuse_fc_gelu()) {
      h = fc_gelu(p + ".mlp", mm, wfc, bfc, l);
    } else {
      int u = linear(p + ".mlp.fc", mm, wfc, bfc, fc_out / t, l, Module::mlp, 'c');
      h = g.add_activation(p + ".mlp.act.out", {N, H / t}, l, act);
      node(activation_kind(m.activation), p + ".mlp.act", {u}, {h}, l, Module::mlp);
    }
    int wp = row_weight(p + ".mlp.proj.weight", C, H, l);
    int bp = m.bias ? seq_param(p + ".mlp.proj.bias", C, l) : -1;
    int o2 = linear(p + ".mlp.proj", h, wp, bp, C, l, Module::mlp, 'r');
    o2 = dropout(p + ".mlp.drop", o2, l, Module::mlp, site + 3);
    return add(p + ".res2", x1, o2, l);
  }

  Graph build() {
    const ModelConfig& m = s.model;
    int64_t last = s.last_layer < 0 ? m.n_layers : s.last_layer;
    int x;
    int wte = -1;
    if (s.first_stage) {
      g.tokens = g.add_input("tokens", {g.B, g.T}, DType::I32);
      ShardSpec sh{t > 1 ? 0 : -1, static_cast<int>(t), static_cast<int>(s.tp_rank), 1};
      wte = g.add_param(kEmbedding, {V / t, C}, -1, true, sh, {V, C});
      std::vector<int> in{g.tokens, wte};
      if (m.position == Position::learned) in.push_back(g.add_param("wpe", {m.seq_len, C}, -1, true));
      x = g.add_activation("embed.out", {Ns, C}, -1, act);
      int e = node(OpKind::Embedding, "embed", in, {x}, -1, Module::embed);
      if (t > 1) {
        g.nodes[e].tp = ops::TpMode::VocabEmbed;
        g.nodes[e].vocab_start = s.tp_rank * (V / t);
        g.nodes[e].scatter_output = sp;
      }
      x = dropout("embed.drop", x, -1, Module::embed, 1);
    } else {
      x = g.add_activation("stage.in", {Ns, C}, static_cast<int>(s.first_layer), act);
      g.stage_input = x;
    }
    for (int64_t l = s.first_layer; l < last; ++l) x = block(x, static_cast<int>(l));
    if (s.last_stage) {
      int xf = norm("ln_f", x, -1, Module::head);
      int wlm = wte;
      if (!m.tie_embeddings || wlm < 0) {
        ShardSpec sh{t > 1 ? 0 : -1, static_cast<int>(t), static_cast<int>(s.tp_rank), 1};
        wlm = g.add_param(m.tie_embeddings ? kEmbedding : kHead, {V / t, C}, -1, true, sh, {V, C});
      }
      const size_t head = g.nodes.size();  // linear() adds one node: the lm_head
      g.logits = linear("lm_head", xf, wlm, -1, V / t, -1, Module::head, 'c');
      g.tensors[g.logits].dtype = DType::F32;  // the loss is always computed in fp32
      g.nodes[head].dout16 = s.logits_grad16 && act != DType::F32;
      g.targets = g.add_input("targets", {g.B, g.T}, DType::I32);
      g.losses = g.add_activation("loss.per_position", {N}, -1, DType::F32);
      int xe = node(OpKind::SoftmaxXent, "loss", {g.logits, g.targets}, {g.losses}, -1, Module::loss);
      g.nodes[xe].inplace = true;
      g.nodes[xe].vocab_real = m.vocab_size;
      if (t > 1) {  // this shard's real columns: the padding sits at the end of the last shards
        int64_t start = s.tp_rank * (V / t);
        g.nodes[xe].tp = ops::TpMode::VocabXent;
        g.nodes[xe].vocab_start = start;
        g.nodes[xe].vocab_real = std::clamp<int64_t>(m.vocab_size - start, 0, V / t);
      }
    } else {
      g.stage_output = x;
    }
    // The compute copy of every weight is in the compute format (the optimizer's fp32 masters,
    // when the recipe keeps them, live outside the graph: runner/train/optimizer.h).
    for (int id : g.params) {
      g.tensors[static_cast<size_t>(id)].dtype = act;
      g.tensors[static_cast<size_t>(id)].grad_dtype = s.grad_dtype;
    }
    g.finalize();
    return std::move(g);
  }
};

}  // namespace

namespace {
std::atomic<int64_t> g_graphs_built{0};
}  // namespace

Graph build_gpt_graph(const GptSpec& spec) {
  g_graphs_built.fetch_add(1, std::memory_order_relaxed);
  return Builder(spec).build();
}

int64_t graphs_built() { return g_graphs_built.load(std::memory_order_relaxed); }

bool gpt_vocab_param(const std::string& name) { return name == kEmbedding || name == kHead; }

int64_t ParamSet::numel() const {
  int64_t n = 0;
  for (auto& v : values) n += v.numel();
  return n;
}

int ParamSet::index(const std::string& name) const {
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<int>(i);
  return -1;
}

int64_t shard_to_full_index(const ops::TensorDesc& d, int64_t i) {
  if (d.shard.dim < 0 || d.shard.parts <= 1) return i;
  const auto& S = d.shape;
  const auto& F = d.full_shape;
  int nd = static_cast<int>(S.size());
  int64_t full = 0, rem = i;
  std::vector<int64_t> idx(nd);
  for (int k = nd - 1; k >= 0; --k) { idx[k] = rem % S[k]; rem /= S[k]; }
  int dd = d.shard.dim;
  idx[dd] = d.shard.full_at(idx[dd], F[dd]);
  for (int k = 0; k < nd; ++k) full = full * F[k] + idx[k];
  return full;
}

std::vector<std::pair<int64_t, int64_t>> replicated_ranges(const ops::TensorDesc& d) {
  std::vector<std::pair<int64_t, int64_t>> out;
  if (!d.shard.split() || d.shard.replicated == 0) return out;
  RUNNER_CHECK(d.shard.dim == 0, "parameter " + d.name + ": replicated blocks are only supported along dimension 0");
  const int64_t row = d.shape.empty() || d.shape[0] == 0 ? 0 : ops::numel_of(d.shape) / d.shape[0];
  for (const ops::ShardSpec::Run& r : d.shard.runs(d.full_shape[0]))
    if (r.replicated) out.emplace_back(r.shard * row, (r.shard + r.len) * row);
  return out;
}

ParamSet init_params(const Graph& g, const ModelConfig& m, uint64_t seed) {
  std::vector<ops::TensorDesc> descs;
  for (int id : g.params) descs.push_back(g.tensors[static_cast<size_t>(id)]);
  return init_params(descs, m, seed);
}

void init_param_values(const ops::TensorDesc& d, const ModelConfig& m, uint64_t seed, float* p) {
  const int64_t n = ops::numel_of(d.shape);
  auto ends_with = [&](const std::string& suf) {
    return d.name.size() >= suf.size() && d.name.compare(d.name.size() - suf.size(), suf.size(), suf) == 0;
  };
  const bool is_norm = d.name.find(".ln") != std::string::npos || d.name.rfind("ln_f", 0) == 0;
  if (ends_with(".bias")) {
    std::fill(p, p + n, 0.0f);
  } else if (is_norm) {
    std::fill(p, p + n, 1.0f);
  } else {
    const double proj_std = m.init_std / std::sqrt(2.0 * static_cast<double>(m.n_layers));
    const double std = (ends_with("attn.proj.weight") || ends_with("mlp.proj.weight")) ? proj_std : m.init_std;
    const uint64_t key = ops::rng_key(seed, ops::hash_name(d.name.c_str()));
    for (int64_t i = 0; i < n; ++i)
      p[i] = static_cast<float>(std * ops::rng_normal(key, static_cast<uint64_t>(shard_to_full_index(d, i))));
  }
}

// The values are computed on the host and cross into the parameter's memory once (on a
// device, host code never writes a tensor's storage itself).
ParamSet init_params(const std::vector<ops::TensorDesc>& params, const ModelConfig& m, uint64_t seed) {
  ParamSet ps;
  std::vector<float> tmp;
  std::vector<uint16_t> tmp16;
  for (const ops::TensorDesc& d : params) {
    if (ps.index(d.name) >= 0) continue;  // tied weights appear once
    ops::Tensor v(d.shape, d.dtype, ops::Account::Parameters, false);  // every byte written below
    ops::Tensor gr(d.shape, d.grad_dtype, ops::Account::Gradients);
    tmp.resize(static_cast<size_t>(v.numel()));
    init_param_values(d, m, seed, tmp.data());
    if (d.dtype == ops::DType::F32) {
      v.write_from_host(tmp.data());
    } else {  // the compute copy: the fp32 initial values rounded to nearest even
      tmp16.resize(tmp.size());
      ops::from_f32(tmp16.data(), d.dtype, tmp.data(), v.numel());
      v.write_from_host(tmp16.data());
    }
    ps.names.push_back(d.name);
    ps.values.push_back(std::move(v));
    ps.grads.push_back(std::move(gr));
    ps.decay.push_back(d.decay);
  }
  return ps;
}

}  // namespace runner

namespace runner {
void bind_params(ops::Executor& ex, const ops::Graph& g, ParamSet& ps) {
  for (int id : g.params) {
    int i = ps.index(g.tensors[id].name);
    RUNNER_CHECK(i >= 0, "parameter " + g.tensors[id].name + " missing from the parameter set");
    ex.bind_param(id, &ps.values[static_cast<size_t>(i)], &ps.grads[static_cast<size_t>(i)]);
  }
}
}  // namespace runner

namespace runner {

HfStyle hf_style(const ModelConfig& m) {
  // GPT-2's MLP is ungated: its activation_function names any ungated activation (its
  // Hugging Face name, kActivationFacts); Llama's is the gated silu, our swiglu.
  const bool ln = m.norm == Norm::layernorm,
             ungated = !activation_facts(m.activation).gated,
             swiglu = m.activation == Activation::swiglu, learned = m.position == Position::learned;
  if (ln && ungated && learned) {
    if (!m.bias) throw std::invalid_argument("Hugging Face GPT-2 has biases in every linear layer and layernorm; this model has bias: false");
    return HfStyle::gpt2;
  }
  if (!ln && swiglu && !learned) return HfStyle::llama;
  throw std::invalid_argument(std::string("neither GPT-2 (layernorm, an ungated activation, learned positions) nor Llama (rmsnorm, swiglu, "
                                          "rope) matches norm: ") + to_string(m.norm) + ", activation: " +
                              to_string(m.activation) + ", position: " + to_string(m.position));
}

const char* to_string(HfStyle s) { return s == HfStyle::gpt2 ? "gpt2" : "llama"; }

std::vector<HfTensor> hf_tensors(const ModelConfig& m, HfStyle style) {
  std::vector<HfTensor> out;
  const int64_t C = m.d_model, H = m.mlp_hidden();
  auto add = [&](std::string name, std::string source, int64_t begin = 0, int64_t rows = -1, bool tr = false) {
    out.push_back({std::move(name), std::move(source), begin, rows, tr});
  };
  if (style == HfStyle::gpt2) {
    add("transformer.wte.weight", kEmbedding);
    add("transformer.wpe.weight", "wpe");
    for (int64_t l = 0; l < m.n_layers; ++l) {
      const std::string p = "h." + std::to_string(l), q = "transformer.h." + std::to_string(l);
      add(q + ".ln_1.weight", p + ".ln1.weight");
      add(q + ".ln_1.bias", p + ".ln1.bias");
      add(q + ".attn.c_attn.weight", p + ".attn.qkv.weight", 0, -1, true);
      add(q + ".attn.c_attn.bias", p + ".attn.qkv.bias");
      add(q + ".attn.c_proj.weight", p + ".attn.proj.weight", 0, -1, true);
      add(q + ".attn.c_proj.bias", p + ".attn.proj.bias");
      add(q + ".ln_2.weight", p + ".ln2.weight");
      add(q + ".ln_2.bias", p + ".ln2.bias");
      add(q + ".mlp.c_fc.weight", p + ".mlp.fc.weight", 0, -1, true);
      add(q + ".mlp.c_fc.bias", p + ".mlp.fc.bias");
      add(q + ".mlp.c_proj.weight", p + ".mlp.proj.weight", 0, -1, true);
      add(q + ".mlp.c_proj.bias", p + ".mlp.proj.bias");
    }
    add("transformer.ln_f.weight", "ln_f.weight");
    add("transformer.ln_f.bias", "ln_f.bias");
    if (!m.tie_embeddings) add("lm_head.weight", kHead);
    return out;
  }
  add("model.embed_tokens.weight", kEmbedding);
  for (int64_t l = 0; l < m.n_layers; ++l) {
    const std::string p = "h." + std::to_string(l), q = "model.layers." + std::to_string(l);
    add(q + ".input_layernorm.weight", p + ".ln1.weight");
    // [q: n_heads*HS | k: kv*HS | v: kv*HS] (grouped-query attention: fewer k and v rows).
    const int64_t Ckv = m.kv_heads() * (C / m.n_heads);
    const char* qkv[3] = {".self_attn.q_proj", ".self_attn.k_proj", ".self_attn.v_proj"};
    const int64_t begin[3] = {0, C, C + Ckv}, rows[3] = {C, Ckv, Ckv};
    for (int k = 0; k < 3; ++k) {
      add(q + qkv[k] + ".weight", p + ".attn.qkv.weight", begin[k], rows[k]);
      if (m.bias) add(q + qkv[k] + ".bias", p + ".attn.qkv.bias", begin[k], rows[k]);
    }
    add(q + ".self_attn.o_proj.weight", p + ".attn.proj.weight");
    if (m.bias) add(q + ".self_attn.o_proj.bias", p + ".attn.proj.bias");
    add(q + ".post_attention_layernorm.weight", p + ".ln2.weight");
    add(q + ".mlp.gate_proj.weight", p + ".mlp.fc.weight", 0, H);  // [gate | up] (the swiglu kernel)
    add(q + ".mlp.up_proj.weight", p + ".mlp.fc.weight", H, H);
    if (m.bias) {
      add(q + ".mlp.gate_proj.bias", p + ".mlp.fc.bias", 0, H);
      add(q + ".mlp.up_proj.bias", p + ".mlp.fc.bias", H, H);
    }
    add(q + ".mlp.down_proj.weight", p + ".mlp.proj.weight");
    if (m.bias) add(q + ".mlp.down_proj.bias", p + ".mlp.proj.bias");
  }
  add("model.norm.weight", "ln_f.weight");
  if (!m.tie_embeddings) add("lm_head.weight", kHead);
  return out;
}

}  // namespace runner
