// The model's layout over the process grid (see layout.h).
#include "runner/model/layout.h"

#include <algorithm>

#include "runner/errors.h"

namespace runner {

ops::TensorDesc LogicalParam::shard(int64_t tp_rank) const {
  ops::TensorDesc d = desc;
  if (d.shard.dim >= 0) d.shard.index = static_cast<int>(tp_rank);
  return d;
}

ModelLayout::ModelLayout(const GptSpec& whole, std::vector<int64_t> stage_layers, int64_t chunks)
    : whole_(whole), stage_layers_(std::move(stage_layers)), chunks_(std::max<int64_t>(1, chunks)) {
  RUNNER_CHECK(!stage_layers_.empty(), "a layout needs at least one pipeline stage");
  for (int v = 0; v < vstages(); ++v) graphs_.push_back(build_gpt_graph(spec(v)));
  stage_params_.resize(static_cast<size_t>(pp()));
  for (int s = 0; s < pp(); ++s) {
    for (int64_t k = 0; k < chunks_; ++k) {
      const ops::Graph& g = graph(static_cast<int>(k * pp() + s));
      for (int id : g.params) {
        const ops::TensorDesc& d = g.tensors[static_cast<size_t>(id)];
        int i = find(d.name);
        if (i < 0) {
          LogicalParam p;
          p.name = d.name;
          p.full_shape = d.full_shape;
          p.logical_shape = d.full_shape;
          p.vocab_rows = gpt_vocab_param(d.name);
          if (p.vocab_rows) p.logical_shape[0] = vocab();
          p.desc = d;
          params_.push_back(std::move(p));
          i = static_cast<int>(params_.size()) - 1;
          param_count_ += ops::numel_of(d.full_shape);
        }
        auto& sp = stage_params_[static_cast<size_t>(s)];
        if (std::find(sp.begin(), sp.end(), i) != sp.end()) continue;
        sp.push_back(i);
        auto& st = params_[static_cast<size_t>(i)].stages;
        if (std::find(st.begin(), st.end(), s) == st.end()) st.push_back(s);
      }
    }
  }
}

GptSpec ModelLayout::spec(int vstage, int64_t tp_rank) const {
  GptSpec s = whole_;
  s.tp_rank = tp_rank;
  const int P = pp();
  int64_t first = 0;
  for (int u = 0; u < vstage; ++u) first += stage_layers_[static_cast<size_t>(u % P)] / chunks_;
  s.first_layer = first;
  s.last_layer = first + stage_layers_[static_cast<size_t>(vstage % P)] / chunks_;
  s.first_stage = vstage == 0;
  s.last_stage = vstage == vstages() - 1;
  return s;
}

std::vector<ops::TensorDesc> ModelLayout::rank_params(int stage, int64_t tp_rank) const {
  std::vector<ops::TensorDesc> out;
  for (int i : stage_params(stage)) out.push_back(params_[static_cast<size_t>(i)].shard(tp_rank));
  return out;
}

int ModelLayout::find(const std::string& name) const {
  for (size_t i = 0; i < params_.size(); ++i)
    if (params_[i].name == name) return static_cast<int>(i);
  return -1;
}

}  // namespace runner
