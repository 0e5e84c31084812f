// The hardware profile (runner/perf/hardware_profile.h) the layout search prices layouts with: its JSON
// file round-trips exactly; GEMM and attention rates interpolate between measured shapes (exact
// at them, between neighbours between them, never above the peak); the collective model matches
// the ring/tree formulas computed by hand and prefers measured fits; the recipe's links override
// the profile's; a bad file is a UserError naming hardware.profile; the built-in GPU profiles
// give figures in the range published cuBLAS/NCCL measurements report.
#include <doctest/doctest.h>

#include <cmath>
#include <fstream>
#include <string>

#include "ops/gemm_path.h"
#include "runner/device/devices.h"
#include "runner/errors.h"
#include "runner/perf/hardware_profile.h"
#include "runner/recipe/recipe.h"
#include "tests/support/temp_dir.h"

using namespace runner;

namespace {

// A hand-made CPU profile: GEMM rates on a cube grid at 1 and 2 threads, attention at two
// sequence lengths, two links, one measured collective fit.
HardwareProfile hand_profile() {
  HardwareProfile p;
  p.device = "cpu";
  p.source = "hand-made";
  p.host = "test host";
  p.cores = 2;
  p.peak_flops_fp32 = p.peak_flops_bf16 = p.peak_flops_fp16 = 100e9;
  for (int t : {1, 2}) {
    ComputeProfile c;
    c.threads = t;
    c.gemm["fp32"] = {{256, 256, 256, 10e9 * t}, {512, 512, 512, 20e9 * t}, {1024, 1024, 1024, 40e9 * t},
                      {2048, 2048, 2048, 45e9 * t}};
    c.gemm["bf16"] = {{256, 256, 256, 5e9 * t}, {1024, 1024, 1024, 30e9 * t}};
    c.attention["fp32"] = {{128, 64, 2e9 * t, 1e9 * t}, {512, 64, 8e9 * t, 4e9 * t}};
    c.memory_bandwidth = 10e9 * t;
    c.op_bandwidth["layernorm"] = 4e9 * t;
    c.launch_s = 3e-6;
    p.compute.push_back(c);
  }
  p.intra_node = {2e-6, 8e9};
  p.inter_node = {20e-6, 1e9};
  p.collectives.push_back({Collective::all_reduce, 2, false, 10e-6, 2e9});
  return p;
}

double gemm_rate(const HardwareProfile& p, const std::string& dt, int64_t m, int64_t n, int64_t k, int t) {
  return 2.0 * m * n * k / p.gemm_seconds(dt, m, n, k, t);
}

void write(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

}  // namespace

TEST_CASE("a profile's JSON round-trips exactly") {
  const HardwareProfile p = hand_profile();
  const nlohmann::json j = p.to_json();
  CHECK(j["format"] == "runner-hardware-profile");
  CHECK(j["version"] == 1);
  const HardwareProfile q = HardwareProfile::from_json(nlohmann::json::parse(j.dump()), "file.json");
  CHECK(q.to_json() == j);
  CHECK(q.source == p.source);
  REQUIRE(q.compute.size() == 2);
  CHECK(q.compute[1].gemm.at("fp32")[2].flops_per_s == p.compute[1].gemm.at("fp32")[2].flops_per_s);
  CHECK(q.compute[0].attention.at("fp32")[1].backward_flops_per_s == 4e9);
  CHECK(q.collectives.at(0).latency_s == 10e-6);
  CHECK(q.inter_node.bandwidth == 1e9);
}

TEST_CASE("GEMM rates interpolate: exact at measured shapes, between neighbours, never above peak") {
  HardwareProfile p = hand_profile();
  CHECK(gemm_rate(p, "fp32", 512, 512, 512, 1) == doctest::Approx(20e9).epsilon(1e-9));
  CHECK(gemm_rate(p, "fp32", 1024, 1024, 1024, 2) == doctest::Approx(80e9).epsilon(1e-9));
  const double mid = gemm_rate(p, "fp32", 724, 724, 724, 1);
  CHECK(mid > 20e9);
  CHECK(mid < 40e9);
  // Beyond the grid: the edge's rate, not an extrapolation.
  CHECK(gemm_rate(p, "fp32", 8192, 8192, 8192, 1) == doctest::Approx(45e9).epsilon(1e-6));
  // Below the grid the roofline (operands through memory at 10 GB/s) slows a tiny GEMM.
  const double tiny = p.gemm_seconds("fp32", 8, 8, 8, 1);
  CHECK(tiny >= 4.0 * 3 * 64 / 10e9);
  // Inside the grid the measurement stands even when faster than the roofline (operands in
  // cache); below it the roofline binds.
  p.compute[0].memory_bandwidth = 1e6;
  CHECK(gemm_rate(p, "fp32", 512, 512, 512, 1) == doctest::Approx(20e9).epsilon(1e-9));
  CHECK(p.gemm_seconds("fp32", 8, 8, 8, 1) == doctest::Approx(4.0 * 3 * 64 / 1e6));
  CHECK(p.gemm_seconds("fp32", 8, 512, 512, 1) == doctest::Approx(4.0 * (2 * 8 * 512 + 512 * 512) / 1e6));
  p.compute[0].memory_bandwidth = 10e9;
  // Never faster than the peak, whatever was measured.
  p.peak_flops_fp32 = 30e9;
  CHECK(gemm_rate(p, "fp32", 2048, 2048, 2048, 1) == doctest::Approx(30e9));
  // A dtype measured on its own grid uses it; one not measured falls back to fp32's.
  CHECK(gemm_rate(p, "bf16", 256, 256, 256, 1) == doctest::Approx(5e9));
  CHECK(gemm_rate(p, "fp16", 512, 512, 512, 1) == doctest::Approx(20e9));
}

TEST_CASE("attention, memory-bound ops and thread counts") {
  const HardwareProfile p = hand_profile();
  // forward FLOPs of the causal kernel: 2 * BH * T^2 * hd
  const double f = 2.0 * 8 * 512 * 512 * 64;
  CHECK(p.attention_seconds("fp32", 8, 512, 64, false, 1) == doctest::Approx(f / 8e9));
  CHECK(p.attention_seconds("fp32", 8, 512, 64, true, 1) == doctest::Approx(2 * f / 4e9));
  const double mid = 2.0 * 8 * 256 * 256 * 64 / p.attention_seconds("fp32", 8, 256, 64, false, 1);
  CHECK(mid > 2e9);
  CHECK(mid < 8e9);
  CHECK(p.op_seconds("layernorm", 4e9, 1) == doctest::Approx(1.0 + 3e-6));
  CHECK(p.op_seconds("gelu", 10e9, 1) == doctest::Approx(1.0 + 3e-6));  // falls back to memory_bandwidth
  CHECK(p.at_threads(1).threads == 1);
  CHECK(p.at_threads(2).threads == 2);
  CHECK(p.at_threads(8).threads == 2);  // nearest measured
  CHECK(p.at_threads(0).threads == 2);  // unspecified: the whole machine
}

TEST_CASE("collectives: the ring and tree link model by hand, measured fits preferred") {
  HardwareProfile p = hand_profile();
  p.collectives.clear();
  const double a = 2e-6, bw = 8e9, B = 64e6;
  // 4 ranks, large message: ring all-reduce 2*3/4*B/bw + 2*3*a beats the tree 2*2*(a + B/bw).
  CHECK(p.collective_seconds(Collective::all_reduce, 4, B, false) == doctest::Approx(1.5 * B / bw + 6 * a));
  // 8 ranks, tiny message: the tree 2*3*(a + b/bw) beats the ring's 14 latencies.
  CHECK(p.collective_seconds(Collective::all_reduce, 8, 64, false) == doctest::Approx(6 * (a + 64 / bw)));
  CHECK(p.collective_seconds(Collective::all_gather, 4, B, false) == doctest::Approx(0.75 * B / bw + 3 * a));
  CHECK(p.collective_seconds(Collective::reduce_scatter, 4, B, true) ==
        doctest::Approx(0.75 * B / 1e9 + 3 * 20e-6));
  CHECK(p.collective_seconds(Collective::send_recv, 2, B, true) == doctest::Approx(20e-6 + B / 1e9));
  CHECK(p.collective_seconds(Collective::all_reduce, 1, B, false) == 0);
  // A measured fit at (all_reduce, 2, intra) prices exactly that; at 4 ranks it scales by the
  // ring's (n-1) latencies and (n-1)/n bandwidth term; across nodes the link model still prices.
  p.collectives.push_back({Collective::all_reduce, 2, false, 10e-6, 2e9});
  CHECK(p.collective_seconds(Collective::all_reduce, 2, B, false) == doctest::Approx(10e-6 + B / 2e9));
  CHECK(p.collective_seconds(Collective::all_reduce, 4, B, false) ==
        doctest::Approx(3 * 10e-6 + (0.75 / 0.5) * B / 2e9));
  CHECK(p.collective_seconds(Collective::all_reduce, 2, B, true) == doctest::Approx(1.0 * B / 1e9 + 2 * 20e-6));
}

TEST_CASE("the recipe's links and topology override the profile's") {
  test_support::TempDir dir("hwprofile");
  const std::string file = dir.file("p.json");
  write(file, hand_profile().to_json().dump(2));
  HardwareConfig hw;
  hw.profile = file;
  hw.devices_per_node = 2;
  hw.nodes = 3;
  HardwareProfile p = hardware_profile(hw);
  CHECK(p.nodes == 3);
  CHECK(p.devices_per_node == 2);
  CHECK(p.intra_node.bandwidth == 8e9);
  CHECK(p.collectives.size() == 1);
  CHECK(p.source.find(file) != std::string::npos);
  hw.intra_node_gbps = 100;
  hw.inter_node_latency_us = 7;
  p = hardware_profile(hw);
  CHECK(p.intra_node.bandwidth == 100e9);
  CHECK(p.intra_node.latency_s == 2e-6);
  CHECK(p.inter_node.latency_s == doctest::Approx(7e-6));
  CHECK(p.inter_node.bandwidth == 1e9);
  CHECK(p.collectives.empty());  // measured on the link the recipe replaced
  // The built-in profiles take the same overrides.
  HardwareConfig g;
  g.device = "h100-80gb";
  g.inter_node_gbps = 12.5;
  CHECK(builtin_profile(g).inter_node.bandwidth == 12.5e9);
}

TEST_CASE("a missing, malformed or wrong-version profile is a UserError naming hardware.profile") {
  test_support::TempDir dir("hwprofile");
  HardwareConfig hw;
  auto problem = [&](const std::string& file) -> std::string {
    hw.profile = file;
    try {
      hardware_profile(hw);
    } catch (const UserError& e) {
      CHECK(e.fix().find("runner calibrate --out FILE") != std::string::npos);
      return e.problem();
    }
    return "no error";
  };
  CHECK(problem(dir.file("absent.json")).find("hardware.profile names") != std::string::npos);
  write(dir.file("bad.json"), "{ not json");
  CHECK(problem(dir.file("bad.json")).find("not JSON") != std::string::npos);
  nlohmann::json j = hand_profile().to_json();
  j["version"] = 2;
  write(dir.file("v2.json"), j.dump());
  CHECK(problem(dir.file("v2.json")).find("version 2") != std::string::npos);
  j = hand_profile().to_json();
  j["compute"][0].erase("memory_bandwidth");
  write(dir.file("field.json"), j.dump());
  CHECK(problem(dir.file("field.json")).find("malformed") != std::string::npos);
  write(dir.file("other.json"), R"({"format": "something-else"})");
  CHECK(problem(dir.file("other.json")).find("not a hardware profile") != std::string::npos);
  // A profile of another device kind does not price this recipe's.
  write(dir.file("cpu.json"), hand_profile().to_json().dump());
  hw.device = "h100-80gb";
  CHECK(problem(dir.file("cpu.json")).find("hardware.device is h100-80gb") != std::string::npos);
  // plan --profile FILE is named as such.
  hw.profile = "";
  try {
    hardware_profile(hw, dir.file("absent.json"));
    FAIL("no error");
  } catch (const UserError& e) {
    CHECK(e.problem().find("--profile names") != std::string::npos);
  }
}

TEST_CASE("built-in GPU profiles give figures in the published range") {
  HardwareConfig hw;
  hw.device = "h100-80gb";
  const HardwareProfile h = builtin_profile(hw);
  CHECK(h.peak_flops_bf16 == 989e12);
  CHECK(h.source.find("runner calibrate") != std::string::npos);
  const double big = gemm_rate(h, "bf16", 8192, 8192, 8192, 0) / 989e12;
  CHECK(big > 0.6);
  CHECK(big < 0.8);
  // A transformer-shaped GEMM (tokens x hidden x hidden) lands in the same range; a small one far below.
  const double layer = gemm_rate(h, "bf16", 16384, 8192, 8192, 0) / 989e12;
  CHECK(layer > 0.6);
  CHECK(layer < 0.8);
  CHECK(gemm_rate(h, "bf16", 256, 256, 256, 0) / 989e12 < 0.1);
  CHECK(h.compute[0].memory_bandwidth == doctest::Approx(3.35e12 * 0.88));
  CHECK(h.intra_node.bandwidth > 300e9);   // NVLink 4: 450 GB/s per direction, ~75% achieved
  CHECK(h.intra_node.bandwidth < 450e9);
  CHECK(h.inter_node.bandwidth > 30e9);    // NDR 400 Gb/s per GPU
  CHECK(h.inter_node.bandwidth < 50e9);
  // A 1 GiB all-reduce over 8 GPUs of a node takes a few milliseconds (nccl-tests: ~340-360 GB/s busbw).
  const double ar = h.collective_seconds(Collective::all_reduce, 8, double(1 << 30), false);
  CHECK(ar > 2e-3);
  CHECK(ar < 8e-3);
  hw.device = "a100-80gb";
  const HardwareProfile a = builtin_profile(hw);
  const double abig = gemm_rate(a, "bf16", 8192, 8192, 8192, 0) / 312e12;
  CHECK(abig > 0.8);
  CHECK(abig < 0.9);
  CHECK(a.inter_node.bandwidth < h.inter_node.bandwidth);
  // Attention below the GEMM's efficiency, the backward slower than the forward.
  const double fwd = a.attention_seconds("bf16", 64, 4096, 128, false, 0);
  CHECK(a.attention_seconds("bf16", 64, 4096, 128, true, 0) > 2 * fwd);
  // The kinds that are no one model (`cuda`: whichever GPU is found; `custom`) have no built-in
  // profile, even with a peak: another GPU's figures would price every layout wrongly.
  for (const char* d : {"cuda", "custom"}) {
    hw.device = d;
    hw.peak_tflops = 0;
    CHECK_THROWS_AS(builtin_profile(hw), UserError);
    hw.peak_tflops = 100;
    try {
      builtin_profile(hw);
      FAIL("hardware.device " << d << " got a built-in profile");
    } catch (const UserError& e) {
      CHECK(std::string(e.what()).find("no built-in hardware profile") != std::string::npos);
      CHECK(e.fix().find("runner calibrate") != std::string::npos);
      CHECK(e.fix().find("h100-80gb") != std::string::npos);
    }
  }
  hw.peak_tflops = 0;
  // Every GPU model the device table names has the figures its built-in profile is made of.
  for (const DeviceKind& k : device_kinds()) {
    if (!k.gpu || k.name == "cuda") continue;
    CAPTURE(k.name);
    CHECK(k.figures.known());
    hw.device = std::string(k.name);
    const HardwareProfile g = builtin_profile(hw);
    CHECK(g.peak_flops_bf16 == k.peak_tflops_bf16 * 1e12);
    CHECK(g.intra_node.bandwidth == doctest::Approx(k.figures.link_gbps * 1e9 * 0.75));
  }
}

TEST_CASE("the built-in CPU profile: this host's peak, an entry per thread count") {
  HardwareConfig hw;
  hw.peak_tflops = 0.2;  // keeps the test from measuring: the recipe's peak wins (peak.h)
  const HardwareProfile c = builtin_profile(hw);
  CHECK(c.peak_flops_fp32 == 0.2e12);
  CHECK(c.cores >= 1);
  CHECK(c.at_threads(c.cores).threads == c.cores);
  CHECK(c.at_threads(1).threads == 1);
  const double r1 = gemm_rate(c, "fp32", 2048, 2048, 2048, 1), rn = gemm_rate(c, "fp32", 2048, 2048, 2048, c.cores);
  CHECK(rn == doctest::Approx(0.9 * 0.2e12));
  CHECK(r1 == doctest::Approx(0.9 * 0.2e12 / c.cores));
  // 16-bit GEMMs at the speed of the path this machine's executor takes for them.
  const ops::GemmChoice& b = ops::gemm_paths().bf16;
  const double chosen = b.path == ops::GemmPath::Sgemm ? b.sgemm_gflops : b.onednn_gflops;
  const double want = chosen > 0 && b.fp32_gflops > 0 ? chosen / b.fp32_gflops : 1.0;
  CHECK(gemm_rate(c, "bf16", 2048, 2048, 2048, c.cores) / rn == doctest::Approx(want));
  CHECK(c.source.find("built-in") != std::string::npos);
  CHECK(c.source.find("runner calibrate") != std::string::npos);
}

TEST_CASE("a profile value the cost model cannot price with is refused, naming the key and the value") {
  // Each case: a field set to a value that would make step times negative, infinite or NaN (or
  // a count that makes no machine), the key the message must name, and the value as printed.
  struct Case {
    std::vector<std::string> path;
    nlohmann::json value;
    std::string key, shown;
  };
  const std::vector<Case> cases = {
      {{"compute", "0", "launch_s"}, -1.0, "compute[0].launch_s", "-1"},
      {{"compute", "1", "memory_bandwidth"}, 1e-300, "compute[1].memory_bandwidth", "1e-300"},
      {{"compute", "0", "gemm", "fp32", "0", "3"}, 1e-300, "compute[0].gemm.fp32[0]'s rate", "1e-300"},
      {{"compute", "0", "gemm", "bf16", "1", "3"}, -5e9, "compute[0].gemm.bf16[1]'s rate", "-5e+09"},
      {{"compute", "0", "attention", "fp32", "0", "2"}, 1e-300, "compute[0].attention.fp32[0]'s forward rate", "1e-300"},
      {{"compute", "0", "op_bandwidth", "layernorm"}, -1.0, "compute[0].op_bandwidth.layernorm", "-1"},
      {{"compute", "0", "threads"}, 0, "compute[0].threads", "0"},
      {{"compute", "1", "threads"}, -4, "compute[1].threads", "-4"},
      {{"cores"}, 0, "cores", "0"},
      {{"nodes"}, -1, "nodes", "-1"},
      {{"devices_per_node"}, 0, "devices_per_node", "0"},
      {{"peak_flops", "fp32"}, 0.0, "peak_flops.fp32", "0"},
      {{"peak_flops", "bf16"}, -1e12, "peak_flops.bf16", "-1e+12"},
      {{"links", "inter_node", "latency_s"}, -1.0, "links.inter_node.latency_s", "-1"},
      {{"links", "intra_node", "bandwidth"}, 1e300, "links.intra_node.bandwidth", "1e+300"},
      {{"collectives", "0", "latency_s"}, -2.0, "collectives[0].latency_s", "-2"},
      {{"collectives", "0", "bandwidth"}, 1e-300, "collectives[0].bandwidth", "1e-300"},
  };
  for (const Case& c : cases) {
    nlohmann::json j = hand_profile().to_json();
    nlohmann::json* at = &j;
    for (const std::string& k : c.path) at = at->is_array() ? &(*at)[std::stoul(k)] : &(*at)[k];
    *at = c.value;
    INFO(c.key);
    try {
      HardwareProfile::from_json(j, "bad.json");
      FAIL("accepted");
    } catch (const UserError& e) {
      CHECK(e.loc().file == "bad.json");
      CHECK(e.problem().find(c.key + " is " + c.shown) != std::string::npos);
    }
  }
  // The hand-made profile itself and a built-in GPU one (threads 0: a GPU's entry) stay inside.
  CHECK_NOTHROW(HardwareProfile::from_json(hand_profile().to_json(), "good.json"));
  HardwareConfig hw;
  hw.device = "h100-80gb";
  CHECK_NOTHROW(HardwareProfile::from_json(builtin_profile(hw).to_json(), "h100.json"));
}
