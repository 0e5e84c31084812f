// The hardware profile (profile.h). [i27: H fills this in; skeleton stubs]
#include "runner/device/profile.h"

#include "runner/errors.h"

namespace runner {

std::string to_string(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::all_gather: return "all_gather";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::send_recv: return "send_recv";
    case Collective::broadcast: return "broadcast";
  }
  return "?";
}

const ComputeProfile& HardwareProfile::at_threads(int) const {
  RUNNER_CHECK(!compute.empty(), "hardware profile without compute entries");
  return compute.front();
}
double HardwareProfile::gemm_seconds(const std::string&, int64_t, int64_t, int64_t, int) const { return 0; }
double HardwareProfile::op_seconds(const std::string&, double, int) const { return 0; }
double HardwareProfile::attention_seconds(const std::string&, int64_t, int64_t, int64_t, bool, int) const { return 0; }
double HardwareProfile::collective_seconds(Collective, int, double, bool) const { return 0; }
double HardwareProfile::peak_flops(FloatFormat f) const {
  return f == FloatFormat::fp32 ? peak_flops_fp32 : f == FloatFormat::bf16 ? peak_flops_bf16 : peak_flops_fp16;
}
nlohmann::json HardwareProfile::to_json() const { return nlohmann::json::object(); }
HardwareProfile HardwareProfile::from_json(const nlohmann::json&, const std::string& source) {
  HardwareProfile p;
  p.source = source;
  p.compute.emplace_back();
  return p;
}

HardwareProfile builtin_profile(const HardwareConfig& hw) {
  HardwareProfile p;
  p.device = hw.device;
  p.source = "built-in (device table)";
  p.devices_per_node = hw.devices_per_node;
  p.nodes = hw.nodes;
  p.compute.emplace_back();
  return p;
}
HardwareProfile hardware_profile(const HardwareConfig& hw) { return hardware_profile(hw, hw.profile); }
HardwareProfile hardware_profile(const HardwareConfig& hw, const std::string&) { return builtin_profile(hw); }

}  // namespace runner
