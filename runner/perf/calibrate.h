// `runner calibrate`: measures this machine with the runner's own code paths and returns the
// hardware profile (hardware_profile.h) the layout search prices layouts with.
//
// Why through the runner's own paths: the search must predict what the runner does, not what
// the hardware could do. So every compute figure comes from a one-node graph run by ops'
// Executor on the run's backend, exactly as a training step runs that operator: GEMMs are
// Linear nodes (the executor's GEMM entry, on whatever ops::gemm_path this machine takes for
// the dtype: fp32 sgemm, 16-bit widened to sgemm or oneDNN, cuBLASLt on a GPU), attention the
// flash-style Attention node forward and backward, memory-bound kinds their own nodes (and the
// optimizer step its backend calls: AdamW, sum of squares, zeroing). Collectives go through
// parallel::Communicator's tensor calls, the ones gradient sync, tensor and pipeline
// parallelism make.
//
// What is recorded:
// - per thread count (CPU; one entry on a GPU): GEMM FLOP/s of the Linear forward on a grid of
//   (m = rows, n = output features, k = input features) per dtype; attention FLOP/s (forward
//   2*BH*T^2*hd for the causal kernel, backward twice that) per (seq, head_dim) and dtype;
//   op_bandwidth per kind = (forward + backward bytes) / (forward + backward seconds), bytes as
//   op_bytes() below counts them; memory_bandwidth (CPU: a STREAM triad, ops/peak.h; GPU: the
//   "add" kind's); launch_s = the time of an 8-element Add's forward + backward, halved.
// - under mpirun/srun with N ranks: for each group size 2..N (the first g ranks) an alpha-beta
//   fit (time = latency + bytes / bandwidth, least squares in relative error) of all_reduce,
//   all_gather, reduce_scatter and broadcast over messages of 4 KiB..64 MiB (the full buffer,
//   hardware_profile.h's convention), each time the slowest rank's mean, best of three chunks; send_recv
//   between ranks 0 and 1 (half a ping-pong). A group spanning several hostnames is recorded as
//   inter_node.
//   Rank 0 measures the compute alone while the others wait without spinning.
#pragma once
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "parallel/comm.h"
#include "runner/perf/hardware_profile.h"

namespace runner {

struct CalibrateOptions {
  std::string device = "cpu";  // a hardware.device kind; a GPU kind measures the CUDA backend
  bool quick = false;          // a few shapes and sizes, a few seconds (tests)
  std::vector<int> threads;    // CPU thread counts; empty: 1, 2, 4, ... below the cores, and the cores
  // A progress line ("gemm fp32 2 threads: 5/18 (1024x768x768)"); null: silent.
  std::function<void(const std::string&)> progress;
};

// Measures and returns the profile. `world`: the job's communicator under mpirun/srun (null or
// one rank: no collectives measured). Every rank returns the same collective fits; the compute
// entries are rank 0's.
HardwareProfile calibrate(const CalibrateOptions& o, parallel::Communicator* world);

// The alpha-beta fit of (bytes, seconds) points: {latency_s, bandwidth} of time = latency +
// bytes / bandwidth, least squares in relative error (weights 1/t^2), so that the small
// messages fix the latency and the large ones the bandwidth; a negative latency is clamped to 0
// (and the bandwidth refitted through the origin).
std::pair<double, double> fit_latency_bandwidth(const std::vector<std::pair<double, double>>& pts);

// The default thread counts for `cores`: powers of two below it, and `cores`.
std::vector<int> default_thread_counts(int cores);

// A few lines: best GEMM GFLOP/s per dtype and thread count, memory bandwidth, attention,
// collective fits.
std::string calibrate_summary(const HardwareProfile& p);

}  // namespace runner
