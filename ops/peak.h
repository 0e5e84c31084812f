// The machine's measured fp32 GEMM peak, the denominator of MFU on the CPU.
#pragma once

namespace ops {

// FLOP/s of this CPU's sgemm at the current thread count: the best of 0.4 s of 1024^3 GEMMs
// (shorter measurements caught the cores before they reached their sustained clock and gave
// MFU above 100%).
double measure_cpu_gemm_peak_flops();

}  // namespace ops
