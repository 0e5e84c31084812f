// libFuzzer target: the hardware profile reader (HardwareProfile::from_json, the file
// hardware.profile and `plan --profile` name), on arbitrary bytes (scripts/fuzz.sh runs it).
// Bytes that are not JSON are the file loader's refusal and end here; JSON must be read or
// refused with a UserError. A profile it accepts must hold figures the cost model can price
// with (finite, positive rates and bandwidths, latencies >= 0, counts >= 1) and read back from
// its own JSON; anything else, or a crash, sanitizer report or timeout, is a bug.
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include <nlohmann/json.hpp>

#include "runner/errors.h"
#include "runner/perf/hardware_profile.h"

namespace {

void need(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "fuzz_hardware_profile: accepted a profile with %s\n", what);
  std::abort();
}

bool positive(double v) { return std::isfinite(v) && v > 0; }
bool latency(double v) { return std::isfinite(v) && v >= 0; }

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const nlohmann::json j = nlohmann::json::parse(reinterpret_cast<const char*>(data),
                                                 reinterpret_cast<const char*>(data) + size, nullptr, false);
  if (j.is_discarded()) return 0;
  runner::HardwareProfile p;
  try {
    p = runner::HardwareProfile::from_json(j, "fuzz.json");
  } catch (const runner::UserError&) {
    return 0;  // the expected refusal
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_hardware_profile: not a UserError: %s\n", e.what());
    std::abort();
  }
  need(positive(p.peak_flops_fp32) && positive(p.peak_flops_bf16) && positive(p.peak_flops_fp16), "a bad peak");
  need(p.nodes >= 1 && p.devices_per_node >= 1 && p.cores >= 0, "a bad count");
  need(positive(p.intra_node.bandwidth) && positive(p.inter_node.bandwidth) && latency(p.intra_node.latency_s) &&
           latency(p.inter_node.latency_s), "a bad link");
  for (const runner::ComputeProfile& c : p.compute) {
    need(c.threads >= 0 && positive(c.memory_bandwidth) && latency(c.launch_s), "a bad compute entry");
    for (const auto& [dt, rs] : c.gemm)
      for (const runner::GemmRate& r : rs) need(positive(r.flops_per_s) && r.m > 0 && r.n > 0 && r.k > 0, "a bad GEMM rate");
    for (const auto& [dt, rs] : c.attention)
      for (const runner::AttentionRate& r : rs)
        need(positive(r.forward_flops_per_s) && positive(r.backward_flops_per_s), "a bad attention rate");
    for (const auto& [op, bw] : c.op_bandwidth) need(bw == 0 || positive(bw), "a bad op bandwidth");
  }
  for (const runner::CollectiveFit& f : p.collectives) need(positive(f.bandwidth) && latency(f.latency_s), "a bad collective fit");
  try {
    (void)runner::HardwareProfile::from_json(nlohmann::json::parse(p.to_json().dump()), "again.json");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fuzz_hardware_profile: an accepted profile does not read back: %s\n", e.what());
    std::abort();
  }
  return 0;
}
