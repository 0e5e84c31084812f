// The plan of a GPU device kind prices the GPU's memory: its dry runs take
// cuBLASLt's GEMM paths (16-bit operands read as stored, ops::device_gemm_paths()) whatever
// this CPU measured, and its workspace adds the CUDA backend's own buffers
// (ops/cuda/cuda_workspace.h), which the backend allocates and counts when it starts. The CPU's
// plan is unchanged, and planning a GPU leaves the process's own GEMM choice alone.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "ops/cuda/cuda_workspace.h"
#include "ops/executor.h"
#include "ops/gemm_path.h"
#include "ops/node_graph.h"
#include "ops/ops.h"
#include "runner/plan/plan.h"
#include "runner/recipe/recipe.h"
#include "runner_source_dir.h"  // RUNNER_SOURCE_DIR: the checkout (generated)

namespace {

using ops::DType;
using ops::GemmMode;
using ops::GemmPath;

const std::string kRecipes = std::string(RUNNER_SOURCE_DIR) + "/recipes/";

struct ProcessPaths {  // the process's choice for the test, restored after
  ops::GemmPaths old = ops::gemm_paths();
  explicit ProcessPaths(GemmMode m) { ops::set_gemm_paths(ops::choose_gemm_paths(m)); }
  ~ProcessPaths() { ops::set_gemm_paths(old); }
};

// One all-bf16 Linear (x, W, y): the sgemm path widens x and W (forward) and x, W, dy
// (backward) into fp32 workspace; the device path reads them as stored. Peak Workspace bytes.
size_t linear_workspace() {
  ops::NodeGraph ng(ops::OpKind::Linear, 1, 256, "linear");
  ng.x({256, 512}, DType::BF16).param("W", {384, 512}, DType::BF16).out("y", {256, 384}, DType::BF16).done();
  return ops::Executor::simulate(ng.g).peak[static_cast<int>(ops::Account::Workspace)];
}

double workspace(const runner::Plan& p) { return p.worst_stage().workspace; }

}  // namespace

TEST_CASE("the GEMM paths of a scope: the device's read 16-bit operands as stored, and the process's choice returns after") {
  ProcessPaths cpu(GemmMode::Sgemm);
  const size_t widened = linear_workspace();
  CHECK(widened >= (256 * 512 + 384 * 512) * 4u);  // x and W in fp32 at least
  {
    ops::ScopedGemmPaths gpu(ops::device_gemm_paths());
    CHECK(ops::gemm_path(DType::BF16) == GemmPath::Device);
    CHECK(ops::gemm_path(DType::F16) == GemmPath::Device);
    CHECK(ops::gemm_path(DType::F32) == GemmPath::Sgemm);
    CHECK(ops::gemm_paths().bf16.path_name() == "cublaslt-bf16");
    // x and W are not widened (the fp32 y and d(x) the kernels write remain, on every path).
    CHECK(linear_workspace() + (256 * 512 + 384 * 512) * 4u <= widened);
  }
  CHECK(ops::gemm_path(DType::BF16) == GemmPath::Sgemm);
  CHECK_FALSE(ops::gemm_paths_on_device());
  CHECK(linear_workspace() == widened);
}

TEST_CASE("a GPU device's plan: the dry run under cuBLASLt's paths plus the CUDA backend's buffers; the CPU's unchanged") {
  ProcessPaths cpu(GemmMode::Sgemm);  // as on a CPU without oneDNN (CI): every 16-bit Linear widened
  const double fixed = static_cast<double>(ops::cuda::kFixedWorkspaceBytes);
  // `custom` is neither the host nor a GPU: the plain dry run, no host copies, no GPU buffers.
  auto plan = [](const std::string& recipe, const std::string& device, std::vector<std::string> sets) {
    sets.push_back("hardware.device=" + device);
    if (device == "custom") sets.push_back("hardware.memory_gb=80");
    return runner::make_plan(runner::load_recipe(kRecipes + recipe, sets));
  };
  for (const char* recipe : {"llama-7b-8xh100.yaml", "gpt2-124m.yaml", "quickstart.yaml"}) {
    CAPTURE(recipe);
    const std::vector<std::string> bf16 = {"precision.compute=bf16", "checkpoint.async=false"};
    const runner::Plan h100 = plan(recipe, "h100-80gb", bf16);
    // The host's 16-bit-native memory-bound kernels widen nothing; the GPU's
    // plan widens their operands (the CUDA backend has no such kernels). The GEMM paths are
    // compared with the host's widened plan, and the native one must need no more than it.
    const runner::Plan host_native = plan(recipe, "custom", bf16);
    ops::set_native16(false);
    const runner::Plan host_paths = plan(recipe, "custom", bf16);
    runner::Plan device_paths;
    {
      ops::ScopedGemmPaths gpu(ops::device_gemm_paths());
      device_paths = plan(recipe, "custom", bf16);
    }
    CHECK(workspace(h100) == workspace(device_paths) + fixed);
    CHECK(workspace(device_paths) <= workspace(host_paths));
    CHECK(h100.worst_stage().activations == device_paths.worst_stage().activations);
    // The CPU plans with the CPU's paths, as before.
    const runner::Plan on_cpu = plan(recipe, "cpu", bf16);
    CHECK(workspace(on_cpu) == workspace(host_paths));
    ops::set_native16(true);
    CHECK(workspace(plan(recipe, "cpu", bf16)) == workspace(host_native));
    CHECK(workspace(host_native) <= workspace(host_paths));
    CHECK(ops::gemm_path(DType::BF16) == GemmPath::Sgemm);  // planning a GPU left the process's choice
  }
  // recipes/llama-7b-8xh100.yaml on its H100s: the GPU figure. Its workspace used to be the
  // attention's fp32 T x T probabilities (32 heads x 4096^2 x 4 bytes = 2 GiB, widened from
  // bf16); the flash-style attention keeps a (B, NH, T) log-sum-exp instead: the workspace
  // falls from 2.69 GiB to about 1.3 GiB. What is left (the fp32 logits, the widened operands
  // of the fp32-only kernels, and a share that still grows faster than T between 2048 and 4096)
  // is above the ~290 MiB planned before the precision work: the 16-bit-native kernels.
  const runner::Plan p7 = plan("llama-7b-8xh100.yaml", "h100-80gb", {});
  const runner::Plan p7_2k = plan("llama-7b-8xh100.yaml", "h100-80gb", {"model.seq_len=2048"});
  const runner::Plan p7_1k = plan("llama-7b-8xh100.yaml", "h100-80gb", {"model.seq_len=1024"});
  const double GiB = double(1ull << 30);
  MESSAGE("llama-7b-8xh100 on h100-80gb: workspace " << workspace(p7) / GiB << " GiB at T=4096, "
                                                     << workspace(p7_2k) / GiB << " at T=2048, "
                                                     << workspace(p7_1k) / GiB << " GiB at T=1024");
  CHECK(workspace(p7_2k) > workspace(p7_1k));
  CHECK(workspace(p7) > workspace(p7_2k));
  CHECK(workspace(p7) < 1.5 * GiB);  // not the 2 GiB of T x T probabilities
}
