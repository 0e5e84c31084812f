// The process grid's arithmetic (Megatron order) and the one-rank communicator; no MPI.
// The multi-rank behaviour is in tests/mpi/test_mpi_comm.cpp.
#include <doctest/doctest.h>

#include <cstdlib>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm.h"
#include "parallel/grid.h"

using namespace parallel;

TEST_CASE("coords_of and world_rank_of round-trip for every rank") {
  for (GridShape g : {GridShape{2, 2, 2}, GridShape{3, 1, 2}, GridShape{1, 4, 1}, GridShape{2, 3, 4},
                      GridShape{1, 1, 1}, GridShape{4, 1, 1}, GridShape{1, 1, 3}}) {
    CAPTURE(g.dp);
    CAPTURE(g.tp);
    CAPTURE(g.pp);
    std::vector<int> seen(size_t(g.world()), 0);
    for (int r = 0; r < g.world(); ++r) {
      Coords c = coords_of(g, r);
      CHECK(c.dp >= 0);
      CHECK(c.dp < g.dp);
      CHECK(c.tp >= 0);
      CHECK(c.tp < g.tp);
      CHECK(c.pp >= 0);
      CHECK(c.pp < g.pp);
      CHECK(world_rank_of(g, c) == r);
      // tp fastest, then dp, then pp.
      CHECK(r == (c.pp * g.dp + c.dp) * g.tp + c.tp);
    }
    // world_rank_of is a bijection from coordinates onto ranks.
    for (int p = 0; p < g.pp; ++p)
      for (int d = 0; d < g.dp; ++d)
        for (int t = 0; t < g.tp; ++t) ++seen[size_t(world_rank_of(g, Coords{d, t, p}))];
    for (int s : seen) CHECK(s == 1);
  }
}

TEST_CASE("Megatron order: tensor-parallel groups are consecutive ranks") {
  GridShape g{2, 2, 2};  // dp2 x tp2 x pp2
  auto c = coords_of(g, 0);
  CHECK((c.dp == 0 && c.tp == 0 && c.pp == 0));
  c = coords_of(g, 1);
  CHECK((c.dp == 0 && c.tp == 1 && c.pp == 0));
  c = coords_of(g, 2);
  CHECK((c.dp == 1 && c.tp == 0 && c.pp == 0));
  c = coords_of(g, 5);
  CHECK((c.dp == 0 && c.tp == 1 && c.pp == 1));
  c = coords_of(g, 7);
  CHECK((c.dp == 1 && c.tp == 1 && c.pp == 1));
  // Pipeline neighbours are dp*tp ranks apart.
  CHECK(world_rank_of(g, Coords{1, 0, 1}) - world_rank_of(g, Coords{1, 0, 0}) == 4);

  GridShape h{3, 1, 2};  // dp3 x pp2: data-parallel replicas consecutive
  c = coords_of(h, 4);
  CHECK((c.dp == 1 && c.tp == 0 && c.pp == 1));
  CHECK(world_rank_of(h, Coords{2, 0, 0}) == 2);
  CHECK(world_rank_of(h, Coords{0, 0, 1}) == 3);

  GridShape t{1, 4, 1};  // pure tensor parallel
  for (int r = 0; r < 4; ++r) CHECK(coords_of(t, r).tp == r);

  GridShape m{2, 4, 3};  // (pp*dp + dp)*tp + tp
  CHECK(world_rank_of(m, Coords{1, 3, 2}) == (2 * 2 + 1) * 4 + 3);
  c = coords_of(m, 13);  // 13 = (1*2 + 1)*4 + 1
  CHECK((c.dp == 1 && c.tp == 1 && c.pp == 1));
}

TEST_CASE("coordinates outside the grid are refused") {
  GridShape g{2, 2, 1};
  CHECK_THROWS(coords_of(g, 4));
  CHECK_THROWS(coords_of(g, -1));
  CHECK_THROWS(world_rank_of(g, Coords{2, 0, 0}));
  CHECK_THROWS(world_rank_of(g, Coords{0, 0, 1}));
  CHECK_THROWS(coords_of(GridShape{0, 1, 1}, 0));
}

TEST_CASE("Grid over the one-rank communicator") {
  Grid grid(self_comm(), GridShape{1, 1, 1});
  CHECK(grid.rank() == 0);
  CHECK(grid.world_size() == 1);
  CHECK(grid.coords().dp == 0);
  CHECK(grid.coords().tp == 0);
  CHECK(grid.coords().pp == 0);
  CHECK(grid.first_stage());
  CHECK(grid.last_stage());
  CHECK(grid.prev_stage_rank() == -1);
  CHECK(grid.next_stage_rank() == -1);
  CHECK(grid.name() == "dp0.tp0.pp0");
  CHECK(grid.embed() == nullptr);
  for (Communicator* c : {&grid.world(), &grid.dp(), &grid.tp(), &grid.pp()}) {
    CHECK(c->rank() == 0);
    CHECK(c->size() == 1);
  }
  float x[3] = {1.5f, -2.f, 3.f};
  grid.tp().allreduce_sum(x, 3);
  grid.dp().allreduce_max(x, 3);
  CHECK(x[0] == 1.5f);
  CHECK(x[1] == -2.f);
}

TEST_CASE("Grid refuses a world size that does not match the shape") {
  CHECK_THROWS_AS(Grid(self_comm(), GridShape{2, 1, 1}), std::invalid_argument);
  CHECK_THROWS_AS(Grid(self_comm(), GridShape{1, 2, 2}), std::invalid_argument);
  CHECK_THROWS_AS(Grid(nullptr, GridShape{1, 1, 1}), std::invalid_argument);
}

TEST_CASE("SelfComm: collectives are no-ops, point-to-point throws") {
  auto c = self_comm();
  CHECK(c->rank() == 0);
  CHECK(c->size() == 1);
  double d[2] = {0.1, 0.2};
  c->allreduce_sum(d, 2);
  CHECK(d[0] == 0.1);
  int64_t i[2] = {5, -7};
  c->allreduce_sum(i, 2);
  c->allreduce_min(i, 2);
  c->allreduce_max(i, 2);
  CHECK(i[0] == 5);
  CHECK(i[1] == -7);

  float in[4] = {1, 2, 3, 4}, out[4] = {};
  auto r = c->ireduce_scatter_sum(in, out, 4);
  CHECK(r->test());
  r->wait();
  CHECK(out[3] == 4.f);
  auto g = c->iallgather_inplace(in, 4);
  g->wait();
  c->allgather_inplace(in, 4);
  CHECK(in[2] == 3.f);
  auto a = c->iallreduce_sum(in, 4);
  CHECK(a->test());
  char b[4] = {'a', 'b', 'c', 'd'};
  c->broadcast(b, 4, 0);
  CHECK(b[1] == 'b');
  c->barrier();
  CHECK_THROWS(c->send(b, 4, 0, 0));
  CHECK_THROWS(c->recv(b, 4, 0, 0));
  CHECK_THROWS(c->isend(b, 4, 0, 0));
  CHECK_THROWS(c->irecv(b, 4, 0, 0));
  auto s = c->split(3, 1);
  CHECK(s->size() == 1);
  CHECK(s->rank() == 0);
  CHECK_FALSE(mpi_initialized());
}

TEST_CASE("mpi_launched reads the launcher's environment") {
  const char* vars[] = {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS",
                        "SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS"};
  std::vector<std::pair<std::string, std::string>> saved;
  for (const char* v : vars) {
    if (const char* s = std::getenv(v)) saved.emplace_back(v, s);
    unsetenv(v);
  }
  CHECK_FALSE(mpi_launched());
  setenv("SLURM_PROCID", "0", 1);  // an sbatch script, not an srun step
  CHECK_FALSE(mpi_launched());
  setenv("SLURM_NTASKS", "4", 1);
  CHECK(mpi_launched());
  unsetenv("SLURM_NTASKS");
  setenv("SLURM_STEP_NUM_TASKS", "4", 1);
  CHECK(mpi_launched());
  unsetenv("SLURM_STEP_NUM_TASKS");
  unsetenv("SLURM_PROCID");
  for (const char* v : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK", "MPI_LOCALNRANKS"}) {
    CAPTURE(v);
    setenv(v, "2", 1);
    CHECK(mpi_launched());
    unsetenv(v);
  }
  for (auto& [k, v] : saved) setenv(k.c_str(), v.c_str(), 1);
}
