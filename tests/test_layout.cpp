// The model layout the plan derives once (runner/model/layout.h), and its readers.
//
// 1. The logical parameter table agrees with the graphs every rank would build: for every
//    (virtual stage, tensor-parallel rank), each graph parameter is the table's shard of it,
//    in the rank's order; shapes, shards, owning and writing stages, vocabulary cuts.
// 2. The plan's ledger and the trainer run the same schedule (Plan::schedule).
// 3. No checkpoint path builds a graph: saving (sharded and gathered), loading into a rank's
//    state and the saver's save and the chooser's resume, counted with runner::graphs_built().
#include <doctest/doctest.h>

#include <algorithm>
#include <filesystem>
#include <set>
#include <string>

#include "parallel/comm.h"
#include "parallel/grid.h"
#include "runner/checkpoint/resume.h"
#include "runner/checkpoint/saver.h"
#include "runner/checkpoint/state_shards.h"
#include "runner/model/layout.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner/train/optimizer.h"
#include "tests/support/recipes.h"
#include "tests/support/temp_dir.h"

namespace fs = std::filesystem;
using namespace runner;

namespace {

Plan plan_of(const std::vector<std::string>& sets, int64_t world) {
  return make_plan(load_recipe_text(test_support::kLayoutRecipe, "layout.yaml", sets), world);
}

bool same_desc(const ops::TensorDesc& a, const ops::TensorDesc& b) {
  return a.name == b.name && a.shape == b.shape && a.full_shape == b.full_shape && a.dtype == b.dtype &&
         a.shard.dim == b.shard.dim && a.shard.parts == b.shard.parts && a.shard.index == b.shard.index &&
         a.shard.blocks == b.shard.blocks && a.shard.sizes == b.shard.sizes && a.shard.replicated == b.shard.replicated &&
         a.decay == b.decay && a.seq_partial == b.seq_partial && a.layer == b.layer;
}

struct Layout {
  std::vector<std::string> sets;
  int64_t world;
};

}  // namespace

TEST_CASE("the layout's parameter table is what every rank's graphs hold") {
  const Layout cases[] = {
      {{}, 1},
      {{"parallel.tp=2"}, 2},
      {{"parallel.tp=2", "parallel.sequence_parallel=true"}, 2},
      {{"parallel.pp=2"}, 2},
      {{"parallel.tp=2", "parallel.pp=2", "model.tie_embeddings=false"}, 4},
      {{"model.n_layers=4", "parallel.pp=2", "parallel.schedule=interleaved", "parallel.virtual_stages=2", "batch.micro=1"}, 2},
      // Grouped-query attention: key-value heads split over tp, and replicated (multi-query).
      {{"model.n_kv_heads=2", "parallel.tp=2", "parallel.pp=2"}, 4},
      {{"model.n_kv_heads=1", "parallel.tp=2"}, 2},
  };
  for (const auto& c : cases) {
    std::string name;
    for (auto& s : c.sets) name += s + " ";
    CAPTURE(name);
    const Plan p = plan_of(c.sets, c.world);
    const ModelLayout& lay = *p.layout;
    REQUIRE(lay.pp() == p.pp);
    REQUIRE(lay.vstages() == p.pp * p.chunks);
    // The unsharded one-stage model: the table has exactly its parameters, with its shapes.
    GptSpec whole = lay.spec(0);
    whole.tp = 1;
    whole.first_layer = 0;
    whole.last_layer = -1;
    whole.first_stage = whole.last_stage = true;
    whole.sequence_parallel = false;
    const ops::Graph full = build_gpt_graph(whole);
    std::set<std::string> full_names;
    int64_t full_count = 0;
    for (int id : full.params) {
      const ops::TensorDesc& d = full.tensors[static_cast<size_t>(id)];
      if (!full_names.insert(d.name).second) continue;
      full_count += ops::numel_of(d.shape);
      const int k = lay.find(d.name);
      REQUIRE(k >= 0);
      CHECK(lay.params()[static_cast<size_t>(k)].full_shape == d.shape);
    }
    CHECK(full_names.size() == lay.params().size());
    CHECK(lay.param_count() == full_count);
    CHECK(p.param_count == full_count);
    for (const LogicalParam& lp : lay.params()) {
      CAPTURE(lp.name);
      CHECK(lp.vocab_rows == gpt_vocab_param(lp.name));
      CHECK(lp.logical_shape[0] == (lp.vocab_rows ? 63 : lp.full_shape[0]));  // the layout recipe's vocabulary
      CHECK(lp.tied() == (p.pp > 1 && lp.name == "wte" && p.recipe.model.tie_embeddings));
      CHECK(std::is_sorted(lp.stages.begin(), lp.stages.end()));
    }
    // Every (virtual stage, tp rank) graph, built as the trainer builds it, holds the table's shards.
    for (int s = 0; s < lay.pp(); ++s) {
      for (int64_t t = 0; t < p.tp; ++t) {
        std::vector<ops::TensorDesc> from_graphs;
        std::set<std::string> seen;
        for (int64_t k = 0; k < lay.chunks(); ++k) {
          const ops::Graph g = build_gpt_graph(lay.spec(static_cast<int>(k * lay.pp() + s), t));
          for (int id : g.params)
            if (seen.insert(g.tensors[static_cast<size_t>(id)].name).second) from_graphs.push_back(g.tensors[static_cast<size_t>(id)]);
        }
        const std::vector<ops::TensorDesc> table = lay.rank_params(s, t);
        REQUIRE(table.size() == from_graphs.size());
        for (size_t i = 0; i < table.size(); ++i) {
          CAPTURE(table[i].name);
          CHECK(same_desc(table[i], from_graphs[i]));
          const LogicalParam& lp = lay.params()[static_cast<size_t>(lay.find(table[i].name))];
          CHECK(std::count(lp.stages.begin(), lp.stages.end(), s) == 1);
        }
      }
    }
    // The table's order: stage by stage, a parameter with the first stage holding it.
    int last_writer = 0;
    for (const LogicalParam& lp : lay.params()) {
      CHECK(lp.writer_stage() >= last_writer);
      last_writer = lp.writer_stage();
    }
  }
}

TEST_CASE("the ledger replays the schedule the trainer runs") {
  for (const char* sched : {"1f1b", "gpipe"}) {
    CAPTURE(sched);
    const Plan p = plan_of({"model.n_layers=4", "parallel.pp=4", std::string("parallel.schedule=") + sched, "batch.micro=1"}, 4);
    REQUIRE(p.accum == 8);
    for (int s = 0; s < p.pp; ++s) {
      const int in_flight = parallel::max_in_flight(p.schedule(s));
      CHECK(p.stages[static_cast<size_t>(s)].micro_in_flight == in_flight);
      CHECK(in_flight == (std::string(sched) == "gpipe" ? 8 : 4 - s));
    }
  }
  const Plan one = plan_of({}, 1);
  CHECK(parallel::max_in_flight(one.schedule(0)) == 1);
  CHECK(one.stages[0].micro_in_flight == 1);
}

TEST_CASE("no checkpoint path builds a graph") {
  const test_support::TempDir scratch("test_layout");
  const fs::path& dir = scratch.path;
  const Plan plan = plan_of({"parallel.tp=1"}, 1);
  const ModelLayout& lay = *plan.layout;
  parallel::Grid grid(parallel::self_comm(), {1, 1, 1});
  TrainState st;
  st.params = init_params(lay.rank_params(0, 0), plan.recipe.model, 5);
  for (size_t i = 0; i < st.params.values.size(); ++i) {
    st.adam_m.push_back(ops::Tensor::zeros(moment_shape(st.params, i), ops::DType::F32, ops::Account::Optimizer));
    st.adam_v.push_back(ops::Tensor::zeros(moment_shape(st.params, i), ops::DType::F32, ops::Account::Optimizer));
    st.adam_m.back().data<float>()[0] = static_cast<float>(i);
  }
  st.step = 3;
  st.recipe_yaml = recipe_to_yaml(plan.recipe);
  const int64_t before = graphs_built();

  write_sharded(lay, grid, (dir / "sharded").string(), st, {});
  TrainState logical = gather_logical_state(lay, grid, st);
  REQUIRE(logical.params.names.size() == lay.params().size());
  TrainState t = logical_template(lay, 0, 0, 1);
  load_checkpoint_file((dir / "sharded" / "step_00000003.h5").string(), t, true);
  TrainState back;
  back.params = init_params(lay.rank_params(0, 0), plan.recipe.model, 99);  // other values
  load_local_from_logical(lay, 0, 0, t, back);
  for (size_t i = 0; i < st.params.values.size(); ++i) {
    CAPTURE(st.params.names[i]);
    REQUIRE(back.params.values[i].numel() == st.params.values[i].numel());
    CHECK(std::equal(st.params.values[i].data<float>(), st.params.values[i].data<float>() + st.params.values[i].numel(),
                     back.params.values[i].data<float>()));
    CHECK(back.adam_m[i].data<float>()[0] == static_cast<float>(i));
  }
  // The saver: a save on its path; then the resume point chosen and loaded.
  CheckpointSaver saver(plan, grid, (dir / "saver").string(), nullptr);
  st.step = 4;
  saver.save(st, true);
  std::optional<ResumePoint> point = choose_resume_point((dir / "saver").string(), -1, false);
  REQUIRE(point);
  CHECK(point->step == 4);
  CHECK(load_resume_point(*point, plan, grid, back) == 4);
  CHECK(graphs_built() == before);
  fs::remove_all(dir);
}
