// Profiling on a device (ops/device_timer.h), proven on the CPU with a fake device timer: with
// one installed, the executor's per-operator table takes each node's time from two marks on the
// device's queue (never the host clock), names a range after the operator around it, returns
// every mark it took, and the step clock waits for the queue; without one, host clocks as
// before. The CUDA timer (ops/cuda/cuda_timer.cpp: events, NVTX) is the same interface on a GPU.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ops/backend.h"
#include "ops/device_timer.h"
#include "ops/executor.h"
#include "ops/node_graph.h"
#include "runner/observe/step_timer.h"
#include "runner/report/format.h"

#include <nlohmann/json.hpp>

namespace {

// Marks are numbered; the "device" says every pair of consecutive marks is 0.25 ms apart.
struct FakeTimer final : ops::DeviceTimer {
  int64_t next = 0, released = 0, waits = 0, depth = 0;
  std::vector<std::string> ranges;
  int64_t record() override { return next++; }
  double elapsed_ms(int64_t a, int64_t b) override { return 0.25 * static_cast<double>(b - a); }
  void release(int64_t) override { ++released; }
  void wait() override { ++waits; }
  void push_range(const char* op, char pass) override {
    ranges.push_back(std::string(op) + (pass == 'b' ? " backward" : pass == 'r' ? " recompute" : ""));
    ++depth;
  }
  void pop_range() override { --depth; }
  Memory memory() override { return {1, 2, 3, 4}; }
};

struct Installed {
  explicit Installed(ops::DeviceTimer* t) { ops::set_device_timer(t); }
  ~Installed() { ops::set_device_timer(nullptr); }
};

// One fp32 Linear (x (64,32) -> y (64,16)), run forward and backward `steps` times.
std::vector<ops::OpProfile> run_linear(int steps) {
  const ops::DType f32 = ops::DType::F32;
  ops::NodeGraph ng(ops::OpKind::Linear, 1, 64, "linear");
  const ops::Graph& g = ng.x({64, 32}, f32).param("W", {16, 32}, f32).out("y", {64, 16}, f32).done().g;
  const int w = ng.n.in[1];
  ops::Tensor W = ops::Tensor::host({16, 32}, ops::DType::F32, ops::Account::Parameters);
  ops::Tensor dW = ops::Tensor::host({16, 32}, ops::DType::F32, ops::Account::Gradients);
  ops::Executor ex(g, ops::cpu_backend());
  ex.bind_param(w, &W, &dW);
  std::vector<float> x(64 * 32, 0.5f), y(64 * 16), dy(64 * 16, 1.0f), dx(64 * 32);
  for (int s = 0; s < steps; ++s) {
    ex.forward(nullptr, nullptr, true, 1, 0, x.data(), y.data());
    ex.backward(1.0f, dy.data(), dx.data());
  }
  return ex.profile();
}

}  // namespace

TEST_CASE("with a device timer, the operator table holds the device's times, ranges named like the operators") {
  FakeTimer t;
  std::vector<ops::OpProfile> prof;
  {
    Installed on(&t);
    prof = run_linear(3);
  }
  REQUIRE(prof.size() == 1);
  CHECK(prof[0].name == "linear");
  CHECK(prof[0].calls == 3);
  CHECK(prof[0].forward_ms == doctest::Approx(3 * 0.25));   // one mark pair per node and pass
  CHECK(prof[0].backward_ms == doctest::Approx(3 * 0.25));  // (a host clock would give anything else)
  CHECK(t.next == 12);
  CHECK(t.released == t.next);  // every mark returned once read
  CHECK(t.depth == 0);
  CHECK(t.ranges == std::vector<std::string>{"linear", "linear backward", "linear", "linear backward", "linear",
                                             "linear backward"});
}

TEST_CASE("without a device timer: host clocks, and the step clock does not wait") {
  REQUIRE(ops::device_timer() == nullptr);
  const std::vector<ops::OpProfile> prof = run_linear(1);
  REQUIRE(prof.size() == 1);
  CHECK(prof[0].forward_ms >= 0);
  FakeTimer t;
  runner::StepTimer::now();
  CHECK(t.waits == 0);
  {
    Installed on(&t);
    const int64_t a = runner::StepTimer::now();
    CHECK(t.waits == 1);  // the phase boundary waited for the device's queue
    CHECK(runner::StepTimer::now() >= a);
    CHECK(ops::device_timer()->memory().total == 4);
  }
}

TEST_CASE("the report's monitor table shows a device's own memory figures beside the accounts' peak") {
  const nlohmann::json cpu = {{"monitor", true}, {"step", 10}, {"peak_bytes", 1 << 20}};
  for (const auto& [k, v] : runner::report::monitor_rows(cpu)) CHECK(k != "device memory (CUDA)");
  nlohmann::json gpu = cpu;
  gpu["device_reported"] = {{"pool_used", 3 << 20}, {"pool_reserved", 4 << 20}, {"driver_used", 5 << 20}, {"total", 8 << 20}};
  std::string shown;
  for (const auto& [k, v] : runner::report::monitor_rows(gpu))
    if (k == "device memory (CUDA)") shown = v;
  CHECK(shown == "allocator in use 3.0 MiB, reserved 4.0 MiB; driver used 5.0 MiB of 8.0 MiB");
}
