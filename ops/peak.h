// The machine's measured fp32 GEMM peak, the denominator of MFU on the CPU, and its memory
// bandwidth: the two roofs of the roofline.
#pragma once

namespace ops {

// FLOP/s of this CPU's sgemm at the current thread count: the best of 0.4 s of 1024^3 GEMMs
// (shorter measurements caught the cores before they reached their sustained clock and gave
// MFU above 100%).
double measure_cpu_gemm_peak_flops();

// Bytes/s of this CPU's memory at the current thread count, measured the same way: the best
// of ~0.2 s of STREAM triads (a = b + s*c over 3 x 32 MiB of fp32, 12 bytes per element) over
// the OpenMP pool. With the sgemm peak, the roofline of medium-depth profiling.
double measure_cpu_memory_bandwidth();

}  // namespace ops
