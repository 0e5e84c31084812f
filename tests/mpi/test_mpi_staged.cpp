// The tensor-memory face of the communicators (parallel/comm.h, Communicator::tensors()) on
// the strict device (ops/strict/): 4 ranks, a dp2 x tp2 grid built with the strict backend as
// its device. Every call that takes tensor memory (the float collectives the executor makes,
// the typed non-blocking ones of gradient buckets and ZeRO, blocking and non-blocking
// point-to-point) is run on device memory, which host code cannot touch (a host read of it
// faults), and must give exactly the bytes the same host call gives on host copies of the
// data. Without staging the MPI library would read the PROT_NONE mapping and fault; without
// the wait before the host call, it would send copy_out's poison. Run under MPI with 4 ranks:
//   mpirun -n 4 --oversubscribe test_mpi_staged
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

#include "mpi_doctest.h"
#include "ops/convert.h"
#include "ops/strict/strict_backend.h"
#include "ops/tensor.h"
#include "parallel/comm.h"
#include "parallel/grad_sync.h"
#include "parallel/grid.h"

using namespace parallel;

namespace {

int g_rank = -1;
#define RANK_INFO() INFO("rank " << g_rank)

ops::Backend& dev() { return ops::strict::strict_backend(); }

// Values whose sums depend on the order of additions (so a different reduction would show).
std::vector<float> awkward(int rank, int64_t n, int salt = 0) {
  std::vector<float> x(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i)
    x[size_t(i)] = 0.1f * float(rank + salt) + 1e-7f * float(i) + (i % 3 ? 1.f / 3.f : 1e8f) * (rank % 2 ? 1 : -1);
  return x;
}

// A strict-device tensor holding `h` (fp32 bytes, or any bytes as U8).
ops::Tensor on_device(const void* h, size_t bytes) {
  ops::Tensor t({static_cast<int64_t>(bytes)}, ops::DType::U8, ops::Account::Communication, false, &dev());
  t.write_from_host(h);
  return t;
}
std::vector<char> to_host(const ops::Tensor& t) {
  std::vector<char> h(t.nbytes());
  t.read_to_host(h.data());
  return h;
}
bool same(const std::vector<char>& a, const void* b) { return std::memcmp(a.data(), b, a.size()) == 0; }

struct Fixture {
  Fixture() : grid(mpi_world(), {2, 2, 1}, &dev()) {}
  Grid grid;
};

}  // namespace

TEST_CASE("the grid's communicators stage tensor memory on a device the host cannot touch") {
  RANK_INFO();
  Fixture f;
  for (Communicator* c : f.grid.comms()) {
    CHECK(c->device() == &dev());
    CHECK(c->tensors().staged());
  }
  Grid host(mpi_world(), {2, 2, 1});
  CHECK_FALSE(host.dp().tensors().staged());
}

TEST_CASE("blocking float collectives on device memory equal the host calls") {
  RANK_INFO();
  Fixture f;
  Communicator& tp = f.grid.tp();
  const int64_t n = 1000;
  const int R = tp.size(), me = tp.rank();
  {
    auto h = awkward(g_rank, n);
    ops::Tensor d = on_device(h.data(), h.size() * 4);
    tp.tensors().allreduce_sum(d.data<float>(), n);
    tp.allreduce_sum(h.data(), n);
    CHECK(same(to_host(d), h.data()));
    auto m = awkward(g_rank, n, 3);
    ops::Tensor dm = on_device(m.data(), m.size() * 4);
    tp.tensors().allreduce_max(dm.data<float>(), n);
    tp.allreduce_max(m.data(), n);
    CHECK(same(to_host(dm), m.data()));
  }
  {  // sequence parallelism: all-gather and reduce-scatter
    auto in = awkward(g_rank, n);
    std::vector<float> out(size_t(n * R), -1.f);
    ops::Tensor din = on_device(in.data(), in.size() * 4);
    std::vector<float> fill(size_t(n * R), -1.f);
    ops::Tensor dout = on_device(fill.data(), fill.size() * 4);
    tp.tensors().allgather(din.data<float>(), dout.data<float>(), n);
    tp.allgather(in.data(), out.data(), n);
    CHECK(same(to_host(dout), out.data()));
    auto full = awkward(g_rank, n * R, 5);
    std::vector<float> part(static_cast<size_t>(n));
    ops::Tensor dfull = on_device(full.data(), full.size() * 4);
    ops::Tensor dpart = on_device(part.data(), part.size() * 4);
    tp.tensors().reduce_scatter_sum(dfull.data<float>(), dpart.data<float>(), n);
    tp.reduce_scatter_sum(full.data(), part.data(), n);
    CHECK(same(to_host(dpart), part.data()));
    CHECK(me < R);
  }
}

TEST_CASE("non-blocking typed collectives on device memory: buckets in flight at once, bf16 and fp32") {
  RANK_INFO();
  Fixture f;
  Communicator& dp = f.grid.dp();
  const int64_t n = 4096;
  const int R = dp.size();
  // Three buckets in flight together (each with its own staging buffer), completed out of order.
  std::vector<std::vector<float>> h;
  std::vector<ops::Tensor> d;
  std::vector<std::unique_ptr<Request>> reqs;
  for (int b = 0; b < 3; ++b) {
    h.push_back(awkward(g_rank, n, b));
    d.push_back(on_device(h.back().data(), h.back().size() * 4));
    reqs.push_back(dp.tensors().iallreduce_sum(d.back().raw(), ops::DType::F32, n));
  }
  for (int b = 2; b >= 0; --b) reqs[size_t(b)]->wait();
  for (int b = 0; b < 3; ++b) {
    dp.iallreduce_sum(h[size_t(b)].data(), ops::DType::F32, n)->wait();
    CHECK(same(to_host(d[size_t(b)]), h[size_t(b)].data()));
  }
  // bf16: summed in fp32, rounded, as the host call does.
  std::vector<uint16_t> b16(static_cast<size_t>(n));
  auto f32 = awkward(g_rank, n, 7);
  ops::from_f32(b16.data(), ops::DType::BF16, f32.data(), n);
  ops::Tensor db = on_device(b16.data(), b16.size() * 2);
  auto rq = dp.tensors().iallreduce_sum(db.raw(), ops::DType::BF16, n);
  while (!rq->test()) {
  }
  dp.iallreduce_sum(b16.data(), ops::DType::BF16, n)->wait();
  CHECK(same(to_host(db), b16.data()));
  // ZeRO-1: reduce-scatter of a bucket, all-gather of the parameters in place.
  auto in = awkward(g_rank, n * R, 11);
  std::vector<float> out(static_cast<size_t>(n));
  ops::Tensor din = on_device(in.data(), in.size() * 4), dout = on_device(out.data(), out.size() * 4);
  dp.tensors().ireduce_scatter_sum(din.raw(), dout.raw(), ops::DType::F32, n)->wait();
  dp.ireduce_scatter_sum(in.data(), out.data(), ops::DType::F32, n)->wait();
  CHECK(same(to_host(dout), out.data()));
  std::vector<float> g(size_t(n * R), -2.f);
  for (int64_t i = 0; i < n; ++i) g[size_t(dp.rank() * n + i)] = float(g_rank * 100 + i);
  ops::Tensor dg = on_device(g.data(), g.size() * 4);
  dp.tensors().iallgather_inplace(dg.raw(), ops::DType::F32, n)->wait();
  dp.iallgather_inplace(g.data(), ops::DType::F32, n)->wait();
  CHECK(same(to_host(dg), g.data()));
  CHECK(dp.tensors().staging_peak_bytes() > 0);
}

TEST_CASE("point-to-point on device memory: pipeline activations between neighbours") {
  RANK_INFO();
  Fixture f;
  Communicator& w = f.grid.world();
  const int64_t n = 777;
  const int peer = g_rank ^ 1;
  auto mine = awkward(g_rank, n);
  std::vector<float> zeros(size_t(n), 0.f);
  ops::Tensor out = on_device(mine.data(), mine.size() * 4), in = on_device(zeros.data(), zeros.size() * 4);
  // Non-blocking both ways, then blocking both ways (the lower rank sends first).
  auto r = w.tensors().irecv(in.raw(), in.nbytes(), peer, 5);
  auto s = w.tensors().isend(out.raw(), out.nbytes(), peer, 5);
  s->wait();
  r->wait();
  CHECK(same(to_host(in), awkward(peer, n).data()));
  ops::Tensor in2 = on_device(zeros.data(), zeros.size() * 4);
  if (g_rank < peer) {
    w.tensors().send(out.raw(), out.nbytes(), peer, 6);
    w.tensors().recv(in2.raw(), in2.nbytes(), peer, 6);
  } else {
    w.tensors().recv(in2.raw(), in2.nbytes(), peer, 6);
    w.tensors().send(out.raw(), out.nbytes(), peer, 6);
  }
  CHECK(same(to_host(in2), awkward(peer, n).data()));
  // The calls were counted on the communicator, as host calls are.
  CHECK(w.counts()[size_t(CommOp::Isend)] == 1);
  CHECK(w.counts()[size_t(CommOp::Recv)] == 1);
}

// The gradient synchronisation of a dp group with its parameters on the device: the flat
// buffers are packed with device copies, the buckets (small: several in flight) reduced
// through the staged path, ZeRO-1's pieces copied into place and the parameters gathered.
// Everything must equal the same GradSync over host tensors, byte for byte.
TEST_CASE("GradSync over device tensors equals GradSync over host tensors, with and without ZeRO-1") {
  RANK_INFO();
  Fixture f;
  Grid host_grid(mpi_world(), {2, 2, 1});
  const std::vector<int64_t> sizes = {37, 100, 5, 64};
  for (bool zero1 : {false, true}) {
    CAPTURE(zero1);
    std::vector<ops::Tensor> hv, hg, dv, dg;
    for (size_t k = 0; k < sizes.size(); ++k) {
      auto v = awkward(f.grid.tp().rank(), sizes[k], int(k));  // the same on both dp ranks
      hv.push_back(ops::Tensor::host({sizes[k]}, ops::DType::F32, ops::Account::Parameters));
      hg.push_back(ops::Tensor::host({sizes[k]}, ops::DType::F32, ops::Account::Gradients));
      std::memcpy(hv.back().host_data<float>(), v.data(), v.size() * 4);
      dv.push_back(ops::Tensor({sizes[k]}, ops::DType::F32, ops::Account::Parameters, false, &dev()));
      dg.push_back(ops::Tensor({sizes[k]}, ops::DType::F32, ops::Account::Gradients, true, &dev()));
      dv.back().write_from_host(v.data());
    }
    std::vector<GradTensor> hp, dp;
    for (size_t k = 0; k < sizes.size(); ++k) {
      hp.push_back({&hv[k], &hg[k]});
      dp.push_back({&dv[k], &dg[k]});
    }
    GradSync hs(host_grid.dp(), hp, 120.0, zero1), ds(f.grid.dp(), dp, 120.0, zero1);
    CHECK(ds.bucket_count() > 1);
    hs.start_step();
    ds.start_step();
    for (size_t k = sizes.size(); k-- > 0;) {
      auto g = awkward(g_rank, sizes[k], 10 + int(k));
      std::memcpy(hg[k].host_data<float>(), g.data(), g.size() * 4);
      dg[k].write_from_host(g.data());
      hs.grad_ready(int(k));
      ds.grad_ready(int(k));
    }
    hs.finish_grads();
    ds.finish_grads();
    for (size_t k = 0; k < sizes.size(); ++k) {
      CAPTURE(k);
      auto [a, e] = ds.owned(int(k));
      CHECK(hs.owned(int(k)) == std::make_pair(a, e));
      auto got = to_host(dg[k]);
      CHECK(std::memcmp(got.data() + a * 4, hg[k].host_data<float>() + a, size_t(e - a) * 4) == 0);
      CHECK(same(to_host(dv[k]), hv[k].host_data<float>()));  // packed into the flat buffer unchanged
    }
    // An "update" of the owned pieces, then ZeRO-1's gather of the parameters.
    for (size_t k = 0; k < sizes.size(); ++k) {
      auto [a, e] = ds.owned(int(k));
      std::vector<float> v(size_t(sizes[k]));
      dv[k].read_to_host(v.data());
      for (int64_t i = a; i < e; ++i) v[size_t(i)] += float(g_rank + 1);
      dv[k].write_from_host(v.data());
      for (int64_t i = a; i < e; ++i) hv[k].host_data<float>()[i] += float(g_rank + 1);
    }
    hs.gather_params();
    ds.gather_params();
    for (size_t k = 0; k < sizes.size(); ++k) CHECK(same(to_host(dv[k]), hv[k].host_data<float>()));
  }
}

int main(int argc, char** argv) {
  parallel::init_mpi(&argc, &argv);
  int rc = mpi_doctest::run(argc, argv, "test_mpi_staged", &g_rank);
  parallel::finalize_mpi();
  return rc;
}
