// The device table: every kind hardware.device names, with its memory, its peak throughput per
// compute format and whether it is the host or a GPU.
//
// One table, read by everything that asks what a device is: the plan (memory per device, peak
// for MFU, whether host-side copies of the state land in device memory), the backend choice
// (device.h), the Slurm launcher (whether to request GPUs) and test_device_select, which
// checks the schema's hardware.device enum against it both ways. A new device kind is one row
// here and one word in schemas/recipe.schema.json.
#pragma once
#include <span>
#include <string_view>

#include "runner/recipe/recipe.h"

namespace runner {

struct DeviceKind {
  std::string_view name;  // the hardware.device word
  // The CPU: its memory is the host's, so the host-side copies of the state (asynchronous
  // checkpoint buffers, rollback snapshots) count against it, and Slurm requests no GPUs.
  bool host = false;
  bool gpu = false;       // selects the CUDA backend (ops/cuda/)
  // Per device, in GB of 2^30 bytes as hardware.memory_gb counts them; 0: hardware.memory_gb,
  // else the host's memory.
  double memory_gb = 0;
  // Dense peak TFLOP/s per device for each precision.compute, from the vendor's data sheet
  // (SXM parts, no sparsity; fp32 without TF32, as the runner's fp32 GEMMs are exact fp32);
  // 0: unknown, measured on the host at start (ops/peak.h).
  double peak_tflops_fp32 = 0, peak_tflops_bf16 = 0, peak_tflops_fp16 = 0;
  // What the layout search's built-in hardware profile (runner/perf/hardware_profile.h) needs
  // beyond the peak, from published measurements (sources in devices.cpp); all 0 for a kind
  // without them (the host's profile is measured; `cuda` and `custom` are no one model, so a
  // search on them needs a calibrated profile and is refused without one).
  struct Figures {
    double mem_tbps = 0;        // memory bandwidth, data sheet, TB/s
    double link_gbps = 0;       // GPU-to-GPU link inside a node (NVLink, PCIe), per direction, GB/s
    double nic_gbps = 0;        // inter-node, one NIC per GPU, per direction, GB/s
    double intra_lat_us = 0, inter_lat_us = 0;  // collective latency inside a node and across nodes
    double gemm_eff[6] = {};    // bf16 GEMM efficiency at square 256, 512, ..., 8192 (and beyond)
    double attn_eff = 0;        // attention forward efficiency at seq >= 4096, head_dim 128
    constexpr bool known() const { return mem_tbps > 0; }
  };
  Figures figures{};
};

// Every kind, in the schema's order.
std::span<const DeviceKind> device_kinds();
// The kind named `name`, or null.
const DeviceKind* find_device_kind(std::string_view name);
// The recipe's kind. The schema admits only the table's words (test_device_select), so a name
// outside the table is an internal error (RUNNER_CHECK), not a user's.
const DeviceKind& device_kind(const HardwareConfig& hw);

// Bytes of memory per device: hardware.memory_gb, else the kind's, else the host's.
double device_memory_bytes(const HardwareConfig& hw);
// Peak FLOP/s per device for MFU: hardware.peak_tflops, else the kind's for `compute`; 0 when
// neither knows it (the CPU, custom, cuda): the trainer measures the host's at start.
double device_peak_flops(const HardwareConfig& hw, FloatFormat compute);

}  // namespace runner
