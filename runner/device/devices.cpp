// The device table (devices.h) and the figures the plan reads from it.
#include "runner/device/devices.h"

#include <fstream>
#include <string>

#include "runner/errors.h"

namespace runner {

namespace {

// name, host, gpu, memory GB, peak TFLOP/s fp32 / bf16 / fp16. The V100 has no bf16 tensor
// cores: bf16 runs at its fp32 rate. `cuda` is whichever GPU is found and `custom` a device
// described by hardware.memory_gb; `cpu-strict` is the CPU as a checking device: the CPU
// kernels behind a GPU's rules (ops/strict/strict_backend.h), and hardware.peak_tflops (planned, run on the CPU backend).
constexpr DeviceKind kDevices[] = {
    {"cpu", true, false, 0, 0, 0, 0},
    {"cpu-strict", true, false, 0, 0, 0, 0},
    {"cuda", false, true, 0, 0, 0, 0},
    {"a100-40gb", false, true, 40, 19.5, 312, 312},
    {"a100-80gb", false, true, 80, 19.5, 312, 312},
    {"h100-80gb", false, true, 80, 67, 989, 989},
    {"h200", false, true, 141, 67, 989, 989},
    {"v100-32gb", false, true, 32, 15.7, 15.7, 125},
    {"l40s", false, true, 48, 91.6, 362, 362},
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
