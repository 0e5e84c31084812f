// MpiComm and Grid across real ranks. Run under MPI with 4 ranks (CMake registers it so):
//   mpirun -n 4 --oversubscribe test_mpi_comm
// Every rank runs the same test cases in the same order, so the collectives match. Checks
// never stop a test case early (CHECK, not REQUIRE), so one rank's failure cannot leave the
// others waiting in a collective; at the end the ranks sum their failure counts and all of
// them exit nonzero if any failed.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <string>
#include <vector>

#include "mpi_doctest.h"
#include "parallel/comm.h"
#include "parallel/grid.h"

// Test hook in parallel/comm.cpp: the largest count one MPI call gets (0 restores INT_MAX).
namespace parallel::testing {
void set_mpi_max_count(int64_t n);
}

using namespace parallel;

namespace {

int g_rank = -1;
constexpr int kRanks = 4;

#define RANK_INFO() INFO("rank " << g_rank)

// True when `bytes` bytes at `p` are the same on every member of `c` (gathers them all).
bool same_on_all(Communicator& c, const void* p, size_t bytes) {
  const int64_t nf = int64_t((bytes + sizeof(float) - 1) / sizeof(float));
  std::vector<float> all(size_t(nf * c.size()), 0.f);
  std::memcpy(all.data() + size_t(nf * c.rank()), p, bytes);
  c.allgather_inplace(all.data(), nf);
  for (int r = 0; r < c.size(); ++r)
    if (std::memcmp(all.data() + size_t(nf * r), p, bytes) != 0) return false;
  return true;
}

// Values whose sum depends on the order of additions.
std::vector<float> awkward_floats(int rank, int64_t n) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[size_t(i)] = 0.1f * float(rank) + 1e-7f + 1e-7f * float(i) + (i % 3 ? 1.f / 3.f : 1e8f) * (rank % 2 ? 1 : -1);
  return x;
}

struct ChunkLimit {
  explicit ChunkLimit(int64_t n) { testing::set_mpi_max_count(n); }
  ~ChunkLimit() { testing::set_mpi_max_count(0); }
};

// The checks shared by the normal and the chunked runs (buffers chosen so results are exact).
void check_collectives(Communicator& c, int64_t n) {
  const int r = c.rank(), p = c.size();
  const double rsum = p * (p - 1) / 2.0;  // sum of ranks
  {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(r + i);
    c.allreduce_sum(x.data(), n);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += x[size_t(i)] != float(rsum + double(p * i));
    CHECK(bad == 0);
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(i % 2 ? r : -r) - float(i);
    c.allreduce_max(x.data(), n);
    bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += x[size_t(i)] != (i % 2 ? float(p - 1) : 0.f) - float(i);
    CHECK(bad == 0);
  }
  {
    std::vector<double> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = 0.5 * r + double(i);
    c.allreduce_sum(x.data(), n);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += x[size_t(i)] != 0.5 * rsum + double(p * i);
    CHECK(bad == 0);
  }
  {
    const int64_t big = int64_t(1) << 40;
    std::vector<int64_t> s(static_cast<size_t>(n)), mn(static_cast<size_t>(n)), mx(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) s[size_t(i)] = mn[size_t(i)] = mx[size_t(i)] = big * r - i * (r % 2 ? 1 : -1);
    c.allreduce_sum(s.data(), n);
    c.allreduce_min(mn.data(), n);
    c.allreduce_max(mx.data(), n);
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) {
      int64_t sum = 0, lo = INT64_MAX, hi = INT64_MIN;
      for (int q = 0; q < p; ++q) {
        const int64_t v = big * q - i * (q % 2 ? 1 : -1);
        sum += v;
        lo = std::min(lo, v);
        hi = std::max(hi, v);
      }
      bad += s[size_t(i)] != sum;
      bad += mn[size_t(i)] != lo;
      bad += mx[size_t(i)] != hi;
    }
    CHECK(bad == 0);
  }
  {
    std::vector<float> x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(2 * r + i);
    auto req = c.iallreduce_sum(x.data(), n);
    req->wait();
    CHECK(req->test());
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += x[size_t(i)] != float(2 * rsum + double(p * i));
    CHECK(bad == 0);
  }
  {
    // Rank r's block b holds 100r + 10b + i; block `rank` of the sum is 100*rsum + p*(10r + i).
    std::vector<float> in(size_t(n * p)), out(size_t(n), -1.f);
    for (int b = 0; b < p; ++b)
      for (int64_t i = 0; i < n; ++i) in[size_t(b * n + i)] = float(100 * r + 10 * b + i);
    c.ireduce_scatter_sum(in.data(), out.data(), n)->wait();
    int bad = 0;
    for (int64_t i = 0; i < n; ++i) bad += out[size_t(i)] != float(100 * rsum + double(p * (10 * r + i)));
    CHECK(bad == 0);
  }
  for (int blocking = 0; blocking < 2; ++blocking) {
    CAPTURE(blocking);
    std::vector<float> buf(size_t(n * p), -1.f);
    for (int64_t i = 0; i < n; ++i) buf[size_t(r * n + i)] = float(1000 * r + i);
    if (blocking)
      c.allgather_inplace(buf.data(), n);
    else
      c.iallgather_inplace(buf.data(), n)->wait();
    int bad = 0;
    for (int b = 0; b < p; ++b)
      for (int64_t i = 0; i < n; ++i) bad += buf[size_t(b * n + i)] != float(1000 * b + i);
    CHECK(bad == 0);
  }
  {
    const int root = p - 1;
    std::vector<char> bytes(size_t(4 * n + 3));
    for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = char(r == root ? 'a' + i % 26 : 0);
    c.broadcast(bytes.data(), bytes.size(), root);
    int bad = 0;
    for (size_t i = 0; i < bytes.size(); ++i) bad += bytes[i] != char('a' + i % 26);
    CHECK(bad == 0);
  }
  if (p > 1) {
    // Ring, blocking: even ranks send first, odd ranks receive first (no rendezvous deadlock).
    const int next = (r + 1) % p, prev = (r + p - 1) % p;
    std::vector<int32_t> out(size_t(n + 5)), in(size_t(n + 5), -1);
    for (size_t i = 0; i < out.size(); ++i) out[i] = int32_t(r * 100000 + int(i));
    const size_t bytes = out.size() * sizeof(int32_t);
    if (r % 2 == 0) {
      c.send(out.data(), bytes, next, 7);
      c.recv(in.data(), bytes, prev, 7);
    } else {
      c.recv(in.data(), bytes, prev, 7);
      c.send(out.data(), bytes, next, 7);
    }
    int bad = 0;
    for (size_t i = 0; i < in.size(); ++i) bad += in[i] != int32_t(prev * 100000 + int(i));
    CHECK(bad == 0);

    // Non-blocking, two tags received in the opposite order to the sends.
    std::vector<int32_t> a(in.size(), -1), b(in.size(), -1), out2(out);
    for (auto& v : out2) v = -v;
    auto rb = c.irecv(b.data(), bytes, prev, 2);
    auto ra = c.irecv(a.data(), bytes, prev, 1);
    auto s1 = c.isend(out.data(), bytes, next, 1);
    auto s2 = c.isend(out2.data(), bytes, next, 2);
    while (!ra->test()) {
    }
    rb->wait();
    s1->wait();
    s2.reset();  // destroying an unfinished request waits for it
    bad = 0;
    for (size_t i = 0; i < in.size(); ++i) {
      bad += a[i] != int32_t(prev * 100000 + int(i));
      bad += b[i] != -int32_t(prev * 100000 + int(i));
    }
    CHECK(bad == 0);
  }
  c.barrier();
}

}  // namespace

TEST_CASE("world: rank, size and every call") {
  RANK_INFO();
  auto w = mpi_world();
  CHECK(w->size() == kRanks);
  CHECK(w->rank() == g_rank);
  int64_t ranks[kRanks] = {};
  ranks[w->rank()] = w->rank() + 1;
  w->allreduce_sum(ranks, kRanks);  // each slot set by exactly one rank: all distinct
  for (int r = 0; r < kRanks; ++r) CHECK(ranks[r] == r + 1);
  for (int64_t n : {int64_t(1), int64_t(37), int64_t(5000)}) {
    CAPTURE(n);
    check_collectives(*w, n);
  }
}

TEST_CASE("zero counts are fine") {
  RANK_INFO();
  auto w = mpi_world();
  float f = 1.f;
  double d = 2.0;
  int64_t i = 3;
  w->allreduce_sum(&f, 0);
  w->allreduce_max(&f, 0);
  w->allreduce_sum(&d, 0);
  w->allreduce_sum(&i, 0);
  w->allreduce_min(&i, 0);
  w->allreduce_max(&i, 0);
  w->iallreduce_sum(&f, 0)->wait();
  float out = 5.f;
  w->ireduce_scatter_sum(&f, &out, 0)->wait();
  w->iallgather_inplace(&f, 0)->wait();
  w->allgather_inplace(&f, 0);
  w->broadcast(&d, 0, 0);
  CHECK(f == 1.f);
  CHECK(d == 2.0);
  CHECK(i == 3);
  CHECK(out == 5.f);
}

TEST_CASE("chunked paths: counts above the per-call limit") {
  RANK_INFO();
  auto w = mpi_world();
  ChunkLimit limit(7);  // every call of more than 7 elements or bytes is split
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(7), int64_t(16), int64_t(30)}) {
    CAPTURE(n);
    check_collectives(*w, n);
  }
  auto x = awkward_floats(w->rank(), 40);
  w->allreduce_sum(x.data(), 40);
  CHECK(same_on_all(*w, x.data(), x.size() * sizeof(float)));
}

TEST_CASE("reductions are bit-identical on every rank") {
  RANK_INFO();
  auto w = mpi_world();
  for (int64_t n : {int64_t(1), int64_t(3), int64_t(1000), int64_t(100003)}) {
    CAPTURE(n);
    auto x = awkward_floats(w->rank(), n);
    w->allreduce_sum(x.data(), n);
    CHECK(same_on_all(*w, x.data(), x.size() * sizeof(float)));

    auto y = awkward_floats(w->rank(), n);
    w->iallreduce_sum(y.data(), n)->wait();
    CHECK(same_on_all(*w, y.data(), y.size() * sizeof(float)));

    auto m = awkward_floats(w->rank(), n);
    w->allreduce_max(m.data(), n);
    CHECK(same_on_all(*w, m.data(), m.size() * sizeof(float)));

    std::vector<double> d(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) d[size_t(i)] = 0.1 * w->rank() + 1e-17 * double(i) + (w->rank() % 2 ? 1e16 : -1e-3);
    w->allreduce_sum(d.data(), n);
    CHECK(same_on_all(*w, d.data(), d.size() * sizeof(double)));
  }
  // The classic: 0.1f*rank + 1e-7f.
  float v = 0.1f * float(w->rank()) + 1e-7f;
  w->allreduce_sum(&v, 1);
  CHECK(same_on_all(*w, &v, sizeof v));
  CHECK(std::fabs(v - 0.6f) < 1e-5f);
}

TEST_CASE("iallreduce overlaps other work") {
  RANK_INFO();
  auto w = mpi_world();
  const int64_t n = int64_t(1) << 20;
  std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    a[size_t(i)] = float(w->rank() + i % 7);
    b[size_t(i)] = float(-w->rank() - i % 5);
  }
  auto ra = w->iallreduce_sum(a.data(), n);
  auto rb = w->iallreduce_sum(b.data(), n);  // two in flight on one communicator
  // Local work while the reductions progress, polling as a training step would.
  std::vector<double> work(4096, 1.0);
  double acc = 0;
  int polls = 0;
  for (int it = 0; it < 200; ++it) {
    for (auto& v : work) v = std::sqrt(v + it);
    acc += std::accumulate(work.begin(), work.end(), 0.0);
    ra->test();
    ++polls;
  }
  CHECK(acc > 0);
  rb->wait();  // in the other order than started
  ra->wait();
  CHECK(ra->test());
  CHECK(polls == 200);
  int bad = 0;
  for (int64_t i = 0; i < n; ++i) {
    bad += a[size_t(i)] != float(6 + 4 * (i % 7));
    bad += b[size_t(i)] != float(-6 - 4 * (i % 5));
  }
  CHECK(bad == 0);
  CHECK(same_on_all(*w, a.data(), 4096 * sizeof(float)));

  // Destroying an unfinished request waits for it.
  std::vector<float> c(1000, 1.f);
  { auto rc = w->iallreduce_sum(c.data(), 1000); }
  CHECK(c[999] == 4.f);
}

TEST_CASE("split orders by key") {
  RANK_INFO();
  auto w = mpi_world();
  auto s = w->split(w->rank() % 2, -w->rank());  // reversed order inside each parity
  CHECK(s->size() == 2);
  CHECK(s->rank() == (w->rank() < 2 ? 1 : 0));
  int64_t x = w->rank();
  s->allreduce_sum(&x, 1);
  CHECK(x == (w->rank() % 2 ? 1 + 3 : 0 + 2));
  check_collectives(*s, 9);
}

TEST_CASE("grid dp2 x tp2 x pp1") {
  RANK_INFO();
  const GridShape shape{2, 2, 1};
  Grid g(mpi_world(), shape);
  const Coords c = coords_of(shape, g_rank);
  CHECK(g.rank() == g_rank);
  CHECK(g.world_size() == 4);
  CHECK(g.coords().dp == c.dp);
  CHECK(g.coords().tp == c.tp);
  CHECK(g.coords().pp == 0);
  CHECK(g.name() == "dp" + std::to_string(c.dp) + ".tp" + std::to_string(c.tp) + ".pp0");
  CHECK(g.first_stage());
  CHECK(g.last_stage());
  CHECK(g.prev_stage_rank() == -1);
  CHECK(g.next_stage_rank() == -1);
  CHECK(g.embed() == nullptr);
  CHECK(g.tp().size() == 2);
  CHECK(g.tp().rank() == c.tp);
  CHECK(g.dp().size() == 2);
  CHECK(g.dp().rank() == c.dp);
  CHECK(g.pp().size() == 1);
  CHECK(g.pp().rank() == 0);

  // Members, in order: gather the world ranks.
  float tp_members[2] = {}, dp_members[2] = {};
  tp_members[c.tp] = float(g_rank);
  dp_members[c.dp] = float(g_rank);
  g.tp().allgather_inplace(tp_members, 1);
  g.dp().allgather_inplace(dp_members, 1);
  for (int k = 0; k < 2; ++k) {
    CHECK(tp_members[k] == float(world_rank_of(shape, Coords{c.dp, k, 0})));
    CHECK(dp_members[k] == float(world_rank_of(shape, Coords{k, c.tp, 0})));
  }
  int64_t pp_sum = g_rank;
  g.pp().allreduce_sum(&pp_sum, 1);
  CHECK(pp_sum == g_rank);

  for (Communicator* sub : {&g.tp(), &g.dp()}) {
    check_collectives(*sub, 11);
    auto x = awkward_floats(g_rank, 777);
    sub->allreduce_sum(x.data(), 777);
    CHECK(same_on_all(*sub, x.data(), x.size() * sizeof(float)));
    CHECK(same_on_all(g.world(), x.data(), x.size() * sizeof(float)) == false);  // groups differ
  }
  check_collectives(g.pp(), 5);
}

TEST_CASE("grid dp1 x tp2 x pp2") {
  RANK_INFO();
  const GridShape shape{1, 2, 2};
  Grid g(mpi_world(), shape);
  const Coords c = coords_of(shape, g_rank);
  CHECK(g.coords().tp == c.tp);
  CHECK(g.coords().pp == c.pp);
  CHECK(g.first_stage() == (c.pp == 0));
  CHECK(g.last_stage() == (c.pp == 1));
  CHECK(g.prev_stage_rank() == (c.pp == 0 ? -1 : g_rank - 2));
  CHECK(g.next_stage_rank() == (c.pp == 1 ? -1 : g_rank + 2));
  CHECK(g.tp().size() == 2);
  CHECK(g.tp().rank() == c.tp);
  CHECK(g.dp().size() == 1);
  CHECK(g.pp().size() == 2);
  CHECK(g.pp().rank() == c.pp);

  // pp == 2: both stages are first or last, so every rank holds the embedding.
  Communicator* e = g.embed();
  CHECK(e != nullptr);
  if (e) {
    CHECK(e->size() == 2);
    CHECK(e->rank() == c.pp);
    float members[2] = {};
    members[e->rank()] = float(g_rank);
    e->allgather_inplace(members, 1);
    CHECK(members[0] == float(world_rank_of(shape, Coords{0, c.tp, 0})));
    CHECK(members[1] == float(world_rank_of(shape, Coords{0, c.tp, 1})));
    std::vector<float> grad(100, float(c.pp + 1));
    e->allreduce_sum(grad.data(), 100);
    CHECK(grad[99] == 3.f);
  }

  // Activations forward over the world communicator (blocking), gradients back over the pp
  // communicator (non-blocking).
  std::vector<float> act(513), back(513);
  const int tag = 10 + c.tp;
  if (g.first_stage()) {
    for (size_t i = 0; i < act.size(); ++i) act[i] = float(g_rank * 1000 + int(i));
    g.world().send(act.data(), act.size() * sizeof(float), g.next_stage_rank(), tag);
    auto r = g.pp().irecv(back.data(), back.size() * sizeof(float), 1, tag);
    r->wait();
    int bad = 0;
    for (size_t i = 0; i < back.size(); ++i) bad += back[i] != -float(g_rank * 1000 + int(i));
    CHECK(bad == 0);
  } else {
    g.world().recv(act.data(), act.size() * sizeof(float), g.prev_stage_rank(), tag);
    int bad = 0;
    for (size_t i = 0; i < act.size(); ++i) bad += act[i] != float(g.prev_stage_rank() * 1000 + int(i));
    CHECK(bad == 0);
    for (size_t i = 0; i < act.size(); ++i) back[i] = -act[i];
    auto s = g.pp().isend(back.data(), back.size() * sizeof(float), 0, tag);
    while (!s->test()) {
    }
  }
  for (Communicator* sub : {&g.tp(), &g.pp()}) check_collectives(*sub, 6);
}

TEST_CASE("grid dp1 x tp1 x pp4: embed only on the first and last stage") {
  RANK_INFO();
  const GridShape shape{1, 1, 4};
  Grid g(mpi_world(), shape);
  CHECK(g.coords().pp == g_rank);
  CHECK(g.pp().rank() == g_rank);
  CHECK(g.tp().size() == 1);
  CHECK(g.dp().size() == 1);
  CHECK(g.name() == "dp0.tp0.pp" + std::to_string(g_rank));
  const bool member = g_rank == 0 || g_rank == 3;
  CHECK((g.embed() != nullptr) == member);
  if (g.embed()) {
    CHECK(g.embed()->size() == 2);
    CHECK(g.embed()->rank() == (g_rank == 0 ? 0 : 1));
    int64_t x = g_rank;
    g.embed()->allreduce_sum(&x, 1);
    CHECK(x == 3);
  }
  // A value passed down the pipeline, each stage adding its rank.
  int64_t v = 0;
  if (!g.first_stage()) g.world().recv(&v, sizeof v, g.prev_stage_rank(), 0);
  v = v * 10 + g_rank + 1;
  if (!g.last_stage()) g.world().send(&v, sizeof v, g.next_stage_rank(), 0);
  if (g.last_stage()) CHECK(v == 1234);
}

TEST_CASE("grid dp4 and a mismatched shape") {
  RANK_INFO();
  Grid g(mpi_world(), GridShape{4, 1, 1});
  CHECK(g.dp().rank() == g_rank);
  CHECK(g.dp().size() == 4);
  CHECK(g.tp().size() == 1);
  CHECK(g.embed() == nullptr);
  check_collectives(g.dp(), 4);
  CHECK_THROWS_AS(Grid(mpi_world(), GridShape{2, 1, 1}), std::invalid_argument);
  CHECK_THROWS_AS(Grid(mpi_world(), GridShape{2, 2, 2}), std::invalid_argument);
}

int main(int argc, char** argv) {
  parallel::init_mpi(&argc, &argv);
  parallel::init_mpi(&argc, &argv);  // idempotent
  const int rc = mpi_doctest::run(argc, argv, "test_mpi_comm", &g_rank);
  parallel::finalize_mpi();
  parallel::finalize_mpi();  // idempotent
  return rc;
}
