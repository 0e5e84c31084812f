// The GPU communicators (parallel/cuda/gpu_comm.h) on device buffers: NCCL at world size 1
// (the one-GPU machine; NCCL cannot put two ranks on one GPU) and the host-staged
// communicator, at size 1 and, under mpirun (ctest entry test_cuda_comm_mpi2), with two ranks
// sharing the GPU: sums, max, reduce-scatter, all-gather, send/recv, split, bf16 buffers, all
// through the communicator's tensors() face (device memory; its own calls take host memory).
// Without a GPU: exit 77, reported as skipped by ctest. Not yet run on a GPU.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "ops/convert.h"
#include "ops/cuda/cuda_backend.h"
#include "parallel/comm.h"
#include "parallel/cuda/gpu_comm.h"

namespace cu = ops::cuda;
using parallel::Communicator;

namespace {

bool g_mpi = false;

std::unique_ptr<Communicator> boot() { return g_mpi ? parallel::mpi_world() : parallel::self_comm(); }

std::vector<float> to_host(const cu::DeviceBuffer& b, size_t n) {
  std::vector<float> h(n);
  cu::copy_to_host(h.data(), b.ptr(), n * sizeof(float));
  return h;
}
cu::DeviceBuffer to_dev(const std::vector<float>& h) {
  cu::DeviceBuffer b(h.size() * sizeof(float), ops::Account::Communication, false);
  cu::copy_to_device(b.ptr(), h.data(), h.size() * sizeof(float));
  return b;
}

// Rank r's element i: (r + 1) * 1000 + i (never zero; sums over ranks are exact in fp32).
std::vector<float> values(int rank, size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; i++) v[i] = static_cast<float>((rank + 1) * 1000 + static_cast<int>(i));
  return v;
}

void exercise(Communicator& c) {
  const int R = c.size(), me = c.rank();
  const size_t n = 1000;
  CAPTURE(R);
  {  // all-reduce sum and max
    auto d = to_dev(values(me, n));
    c.tensors().allreduce_sum(d.as<float>(), n);
    auto h = to_host(d, n);
    for (size_t i = 0; i < n; i += 97) {
      float want = 0;
      for (int r = 0; r < R; r++) want += values(r, n)[i];
      CHECK(h[i] == want);
    }
    auto m = to_dev(values(me, n));
    c.tensors().allreduce_max(m.as<float>(), n);
    CHECK(to_host(m, n)[5] == values(R - 1, n)[5]);
  }
  {  // non-blocking bf16 all-reduce: small integers are exact in bf16
    std::vector<float> f(n, static_cast<float>(me + 1));
    std::vector<uint16_t> b(n);
    ops::from_f32(b.data(), ops::DType::BF16, f.data(), n);
    cu::DeviceBuffer d(n * 2, ops::Account::Communication, false);
    cu::copy_to_device(d.ptr(), b.data(), n * 2);
    c.tensors().iallreduce_sum(d.ptr(), ops::DType::BF16, n)->wait();
    cu::copy_to_host(b.data(), d.ptr(), n * 2);
    CHECK(ops::bf16_to_f32(b[7]) == static_cast<float>(R * (R + 1) / 2));
  }
  {  // reduce-scatter then all-gather in place
    auto in = to_dev(values(me, n * R));
    cu::DeviceBuffer out(n * sizeof(float), ops::Account::Communication, false);
    c.tensors().ireduce_scatter_sum(in.ptr(), out.ptr(), ops::DType::F32, n)->wait();
    auto h = to_host(out, n);
    float want = 0;
    for (int r = 0; r < R; r++) want += values(r, n * R)[me * n + 3];
    CHECK(h[3] == want);
    auto g = to_dev(std::vector<float>(n * R, -1.0f));
    cu::copy_to_device(g.as<float>() + me * n, values(me, n).data(), n * sizeof(float));
    c.tensors().iallgather_inplace(g.ptr(), ops::DType::F32, n)->wait();
    auto gh = to_host(g, n * R);
    for (int r = 0; r < R; r++) CHECK(gh[r * n + 11] == values(r, n)[11]);
  }
  if (R > 1) {  // point to point: rank 0 -> rank 1
    auto d = to_dev(me == 0 ? values(42, n) : std::vector<float>(n, 0.5f));
    if (me == 0) c.tensors().send(d.ptr(), n * sizeof(float), 1, 7);
    if (me == 1) {
      c.tensors().recv(d.ptr(), n * sizeof(float), 0, 7);
      CHECK(to_host(d, n)[9] == values(42, n)[9]);
    }
  }
  {  // split: every rank alone
    auto sub = c.split(me, 0);
    CHECK(sub->size() == 1);
    auto d = to_dev(values(me, 10));
    sub->tensors().allreduce_sum(d.as<float>(), 10);
    CHECK(to_host(d, 10)[2] == values(me, 10)[2]);
  }
  double s = 1.5;
  c.allreduce_sum(&s, 1);  // host scalars go to the bootstrap
  CHECK(s == 1.5 * R);
}

}  // namespace

TEST_CASE("host-staged communicator on device buffers") {
  auto c = parallel::host_staged_comm(boot());
  exercise(*c);
}

TEST_CASE("NCCL communicator on device buffers (one rank per GPU)") {
  int ndev = 0;
  auto b = boot();
  if (b->size() > 1) {
    MESSAGE("NCCL needs one GPU per rank: checked at world size 1 only");
    return;
  }
  (void)ndev;
  auto c = parallel::nccl_comm(std::move(b));
  exercise(*c);
}

int main(int argc, char** argv) {
  std::string why;
  if (!cu::device_available(&why)) {
    std::printf("SKIPPED: no CUDA device (%s)\n", why.c_str());
    return 77;
  }
  if (parallel::mpi_launched()) {
    parallel::init_mpi(&argc, &argv);
    g_mpi = true;
  }
  doctest::Context ctx(argc, argv);
  int rc = ctx.run();
  if (g_mpi) parallel::finalize_mpi();
  return rc;
}
