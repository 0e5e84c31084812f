// `runner calibrate` (runner/perf/calibrate.h): --quick writes a profile that hardware.profile
// loads, with GEMM rates per dtype and thread count measured, attention, the memory-bound ops'
// bandwidths and the launch cost; under mpirun with 2 ranks it records the collectives' fits for
// a group of 2 and takes the intra-node link from the measured send_recv; bad options exit 2.
#include <doctest/doctest.h>

#include <cstdlib>
#include <string>

#include "runner/perf/calibrate.h"
#include "runner/perf/hardware_profile.h"
#include "runner/recipe/recipe.h"
#include "tests/support/process.h"
#include "tests/support/temp_dir.h"

using namespace runner;

namespace {

HardwareProfile load(const std::string& file) {
  HardwareConfig hw;
  hw.profile = file;
  return hardware_profile(hw);
}

}  // namespace

TEST_CASE("runner calibrate --quick writes a profile with every thread count and dtype it measured") {
  test_support::TempDir dir("calibrate");
  const std::string file = dir.file("p.json");
  const test_support::SplitResult r =
      test_support::runner_split("calibrate --quick --threads 1,2 --out " + file, dir, "OMP_NUM_THREADS=2 ");
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  CHECK(r.err.find("calibrate: gemm fp32 1 threads: 1/3") != std::string::npos);  // progress on stderr
  CHECK(r.out.find("gemm fp32") != std::string::npos);                            // the summary
  CHECK(r.out.find("wrote " + file) != std::string::npos);
  const HardwareProfile p = load(file);
  CHECK(p.device == "cpu");
  CHECK(p.source.find("runner calibrate --quick") != std::string::npos);
  REQUIRE(p.compute.size() == 2);
  for (int t : {1, 2}) {
    const ComputeProfile& c = p.at_threads(t);
    CHECK(c.threads == t);
    for (const char* dt : {"fp32", "bf16"}) {
      REQUIRE(c.gemm.count(dt) == 1);
      // The 3 Linears' forward shapes, and their backward GEMMs' (d(input) m x k x n, d(weight)
      // n x k x m): the squares' and 512x768x768's d(input) meet their forward shapes, leaving
      // 64^3, 256^3, 512x768x768 and 768x768x512.
      CHECK(c.gemm.at(dt).size() == 4);
      int found = 0;
      for (const GemmRate& g : c.gemm.at(dt))
        found += (g.m == 512 && g.n == 768 && g.k == 768) + (g.m == 768 && g.n == 768 && g.k == 512) +
                 (g.m == 64 && g.n == 64 && g.k == 64);
      CHECK(found == 3);
      for (const GemmRate& g : c.gemm.at(dt)) {
        CHECK(g.flops_per_s > 1e8);  // any CPU of this century
        // Exact at a measured shape: the peaks were raised to the best measured rate.
        CHECK(p.gemm_seconds(dt, g.m, g.n, g.k, t) == doctest::Approx(2.0 * g.m * g.n * g.k / g.flops_per_s));
      }
      REQUIRE(c.attention.count(dt) == 1);
      CHECK(c.attention.at(dt)[0].backward_flops_per_s > 0);
    }
    for (const char* op : {"layernorm", "rmsnorm", "gelu", "swiglu", "add", "embedding", "softmax_xent", "adamw", "sum_squares",
                           "zero"})
      CHECK(c.op_bandwidth.count(op) == 1);
    CHECK(c.memory_bandwidth > 1e8);
    CHECK(c.launch_s > 0);
    CHECK(c.launch_s < 1e-3);
  }
  CHECK(p.collectives.empty());  // one process
}

TEST_CASE("runner calibrate under mpirun with 2 ranks records the collectives of a group of 2") {
  test_support::TempDir dir("calibrate_mpi");
  const std::string file = dir.file("p.json");
  const test_support::SplitResult r =
      test_support::runner_split("calibrate --quick --threads 1 --out " + file, dir, test_support::mpirun(2));
  INFO(r.out, r.err);
  REQUIRE(r.code == 0);
  const HardwareProfile p = load(file);
  for (Collective op : {Collective::all_reduce, Collective::all_gather, Collective::reduce_scatter,
                        Collective::broadcast, Collective::send_recv}) {
    bool found = false;
    for (const CollectiveFit& f : p.collectives)
      if (f.op == op && f.ranks == 2 && !f.inter_node) {
        found = true;
        CHECK(f.bandwidth > 1e6);
        CHECK(f.latency_s >= 0);
        CHECK(f.latency_s < 1e-2);
      }
    CHECK_MESSAGE(found, to_string(op));
  }
  // The fit prices the collective; the intra-node link is the measured send_recv.
  for (const CollectiveFit& f : p.collectives) {
    if (f.op == Collective::send_recv) {
      CHECK(p.intra_node.bandwidth == f.bandwidth);
      CHECK(p.intra_node.latency_s == f.latency_s);
    }
    if (f.op == Collective::all_reduce)
      CHECK(p.collective_seconds(Collective::all_reduce, 2, 1e6, false) == doctest::Approx(f.latency_s + 1e6 / f.bandwidth));
  }
  CHECK(r.out.find("all_reduce") != std::string::npos);
}

TEST_CASE("runner calibrate: bad options exit 2 saying what to give") {
  test_support::TempDir dir("calibrate_bad");
  test_support::SplitResult r = test_support::runner_split("calibrate --quick --threads 0 --out x.json", dir);
  CHECK(r.code == 2);
  CHECK(r.err.find("--threads") != std::string::npos);
  r = test_support::runner_split("calibrate --quick --device tpu --out x.json", dir);
  CHECK(r.code == 2);
  CHECK(r.err.find("unknown device kind tpu") != std::string::npos);
  CHECK(r.err.find("h100-80gb") != std::string::npos);
}

TEST_CASE("the collectives' latency-bandwidth fit recovers a line and clamps a negative latency") {
  std::vector<std::pair<double, double>> pts;
  for (double b : {4096.0, 65536.0, 1048576.0, 16777216.0}) pts.emplace_back(b, 5e-6 + b / 2e9);
  auto [a, bw] = fit_latency_bandwidth(pts);
  CHECK(a == doctest::Approx(5e-6));
  CHECK(bw == doctest::Approx(2e9));
  // Noise that would make the intercept negative: latency 0, the bandwidth through the origin.
  pts = {{1000, 1e-7}, {2000, 1.5e-6}, {4000, 3.9e-6}};
  std::tie(a, bw) = fit_latency_bandwidth(pts);
  CHECK(a == 0);
  CHECK(bw > 0);
  CHECK(4000 / bw == doctest::Approx(3.9e-6).epsilon(0.3));
  CHECK(default_thread_counts(2) == std::vector<int>{1, 2});
  CHECK(default_thread_counts(12) == std::vector<int>{1, 2, 4, 8, 12});
  CHECK(default_thread_counts(1) == std::vector<int>{1});
}
