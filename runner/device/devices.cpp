// The device table (devices.h) and the figures the plan reads from it.
#include "runner/device/devices.h"

#include <fstream>
#include <string>

#include "runner/errors.h"

namespace runner {

namespace {

// name, host, gpu, memory GB, peak TFLOP/s fp32 / bf16 / fp16, then the figures of the built-in
// hardware profile. The V100 has no bf16 tensor cores: bf16 runs at its fp32 rate. `cuda` is
// whichever GPU is found and `custom` a device described by hardware.memory_gb; `cpu-strict`
// is the CPU as a checking device: the CPU kernels behind a GPU's rules
// (ops/strict/strict_backend.h), and hardware.peak_tflops (planned, run on the CPU backend).
//
// The figures, from published measurements:
// GEMM efficiency (bf16/fp16, square m = n = k, fraction of the dense peak) from published
// cuBLAS measurements: NVIDIA's "Matrix Multiplication Background" guide (A100: large fp16/bf16
// GEMMs at ~250-280 of 312 TFLOP/s), and the "maximum achievable matmul FLOPS" survey of
// S. Bekman's ml-engineering book (A100 SXM bf16 best ~271 TFLOP/s = 87%; H100 SXM best ~795 =
// 80% over a shape search, ~650-720 = 65-73% at ordinary shapes such as 8192^3); small shapes
// do not fill the SMs (a 512^3 GEMM is a few microseconds of launch and tail).
// Memory bandwidth: the data sheets (A100-40 1.555 TB/s, A100-80 2.039, H100 SXM 3.35, H200
// 4.8, V100 0.9, L40S 0.864).
// Links, per direction: NVLink 3 on A100 300 GB/s, NVLink 4 on H100/H200 450 GB/s, NVLink 2 on
// V100 SXM2 150 GB/s, PCIe 4 x16 on L40S ~25 GB/s; inter-node one NIC per GPU: HDR 200 Gb/s =
// 25 GB/s (A100), NDR 400 Gb/s = 50 GB/s (H100/H200), EDR 100 Gb/s = 12.5 GB/s (V100);
// latencies: NCCL's few microseconds inside a node, ~5-8 across InfiniBand.
// Attention: FlashAttention-2's published forward ~70% of the A100's peak at long sequences
// (head_dim 128; ~60% for the backward, less at head_dim 64), ~35% (forward) on H100 without
// Hopper-specific kernels (the FlashAttention-2 and -3 papers); the runner's kernel is
// flash-style, so these are optimistic until `runner calibrate --device cuda` measures it.
constexpr DeviceKind kDevices[] = {
    {"cpu", true, false, 0, 0, 0, 0},
    {"cpu-strict", true, false, 0, 0, 0, 0},
    {"cuda", false, true, 0, 0, 0, 0},
    {"a100-40gb", false, true, 40, 19.5, 312, 312, {1.555, 300, 25, 3, 6, {0.06, 0.25, 0.55, 0.78, 0.84, 0.86}, 0.70}},
    {"a100-80gb", false, true, 80, 19.5, 312, 312, {2.039, 300, 25, 3, 6, {0.06, 0.25, 0.55, 0.78, 0.85, 0.87}, 0.70}},
    {"h100-80gb", false, true, 80, 67, 989, 989, {3.35, 450, 50, 3, 5, {0.03, 0.12, 0.35, 0.58, 0.68, 0.72}, 0.35}},
    {"h200", false, true, 141, 67, 989, 989, {4.8, 450, 50, 3, 5, {0.03, 0.12, 0.36, 0.60, 0.70, 0.74}, 0.37}},
    {"v100-32gb", false, true, 32, 15.7, 15.7, 125, {0.9, 150, 12.5, 4, 8, {0.10, 0.35, 0.65, 0.80, 0.85, 0.86}, 0.50}},
    {"l40s", false, true, 48, 91.6, 362, 362, {0.864, 25, 25, 8, 8, {0.05, 0.20, 0.45, 0.62, 0.68, 0.70}, 0.40}},
    {"custom", false, false, 0, 0, 0, 0},
};

double host_memory_bytes() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (f >> key >> kb) {
    if (key == "MemTotal:") return kb * 1024.0;
    f.ignore(256, '\n');
  }
  return 16.0 * (1ull << 30);
}

}  // namespace

std::span<const DeviceKind> device_kinds() { return kDevices; }

const DeviceKind* find_device_kind(std::string_view name) {
  for (const DeviceKind& d : kDevices)
    if (d.name == name) return &d;
  return nullptr;
}

const DeviceKind& device_kind(const HardwareConfig& hw) {
  const DeviceKind* d = find_device_kind(hw.device);
  RUNNER_CHECK(d, "hardware.device " + hw.device + " is not in the device table (runner/device/devices.cpp)");
  return *d;
}

double device_memory_bytes(const HardwareConfig& hw) {
  if (hw.memory_gb > 0) return hw.memory_gb * (1ull << 30);
  const double gb = device_kind(hw).memory_gb;
  return gb > 0 ? gb * (1ull << 30) : host_memory_bytes();
}

double device_peak_flops(const HardwareConfig& hw, FloatFormat compute) {
  if (hw.peak_tflops > 0) return hw.peak_tflops * 1e12;
  const DeviceKind& d = device_kind(hw);
  switch (compute) {
    case FloatFormat::fp32: return d.peak_tflops_fp32 * 1e12;
    case FloatFormat::bf16: return d.peak_tflops_bf16 * 1e12;
    case FloatFormat::fp16: return d.peak_tflops_fp16 * 1e12;
  }
  return 0;
}

}  // namespace runner
