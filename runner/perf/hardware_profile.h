// The hardware profile: what the layout search's cost model (runner/perf/cost.h) knows about
// the machines a recipe runs on. Compute throughput measured against shape and dtype (GEMMs),
// memory bandwidth per operator kind, attention throughput, and the links between devices
// inside a node and across nodes, with measured collectives where calibrated.
//
// Two sources, one shape:
// - built in: from the device table (devices.h) for the GPU kinds (A100, H100, H200, ...) and
//   conservative defaults for the CPU, with the recipe's hardware topology (devices_per_node,
//   nodes, intra/inter-node bandwidth and latency) on top;
// - calibrated: `runner calibrate [--out FILE]` measures this machine (runner/perf/calibrate.h)
//   and writes a JSON profile; hardware.profile (or `plan --profile FILE`) names it.
// The search and the monitor read only this struct; the cost model's tests build one by hand.
// The API below is shared by the search, the monitor and calibrate: change it only together.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "runner/recipe/recipe.h"

namespace runner {

// One GEMM shape as measured: C(m x n) = A(m x k) B(k x n), at `flops_per_s` (2mnk / seconds).
struct GemmRate {
  int64_t m = 0, n = 0, k = 0;
  double flops_per_s = 0;
};

// Attention (the flash-style kernel: scores, softmax, weighted sum, forward and backward
// measured separately) at one sequence length and head size, in FLOP/s of its matmul work
// (forward 4*B*H*T*T*hd, halved by the causal mask as the kernel skips; backward 2x forward).
struct AttentionRate {
  int64_t seq = 0, head_dim = 0;
  double forward_flops_per_s = 0, backward_flops_per_s = 0;
};

// What one device computes. On the CPU a device is a rank with its threads: the rates depend on
// the thread count, so the profile holds one entry per measured thread count.
struct ComputeProfile {
  int threads = 0;                                   // CPU: threads per rank; GPU: 0
  std::map<std::string, std::vector<GemmRate>> gemm; // "fp32", "bf16", "fp16" -> measured shapes
  std::map<std::string, std::vector<AttentionRate>> attention;  // per dtype
  double memory_bandwidth = 0;                       // bytes/s, a streaming read+write kernel
  // bytes/s of reads+writes per operator kind (ops' op names: "layernorm", "gelu", "adamw", ...);
  // kinds not here fall back to memory_bandwidth.
  std::map<std::string, double> op_bandwidth;
  double launch_s = 0;                               // fixed cost per kernel launch / op call
};

// A point-to-point link: a message of b bytes takes latency_s + b / bandwidth.
struct Link {
  double latency_s = 0;
  double bandwidth = 0;  // bytes/s, one direction
};

enum class Collective { all_reduce, all_gather, reduce_scatter, send_recv, broadcast };
std::string to_string(Collective c);

// A measured collective: latency and bandwidth (alpha-beta fit of time = latency_s + bytes /
// bandwidth, `bytes` as collective_seconds counts it: the full buffer) for one op, group size
// and level.
struct CollectiveFit {
  Collective op = Collective::all_reduce;
  int ranks = 2;
  bool inter_node = false;
  double latency_s = 0, bandwidth = 0;
};

struct HardwareProfile {
  std::string device;   // the hardware.device kind it describes ("cpu", "h100-80gb", ...)
  std::string source;   // "built-in (device table)" or "calibrated: FILE (host, date)"
  std::string host;     // where it was calibrated (CPU model name / GPU name); empty: built in
  int64_t devices_per_node = 1, nodes = 1;
  int cores = 0;        // CPU: the node's cores (threads per rank = cores / ranks per node)
  std::vector<ComputeProfile> compute;  // at least one; CPU: by thread count, GPU: one
  Link intra_node, inter_node;
  std::vector<CollectiveFit> collectives;  // measured; empty: the link model prices them
  double peak_flops_fp32 = 0, peak_flops_bf16 = 0, peak_flops_fp16 = 0;  // for MFU

  // The compute entry for `threads` (the nearest measured; GPU: the one entry).
  const ComputeProfile& at_threads(int threads) const;
  // Seconds of one GEMM of this shape and dtype ("fp32"/"bf16"/"fp16"): interpolated between the
  // measured shapes in log space of (m, n, k) with a roofline bound; never faster than peak.
  // The measured rates time whole calls, so no launch_s is added (nor to attention_seconds).
  double gemm_seconds(const std::string& dtype, int64_t m, int64_t n, int64_t k, int threads) const;
  // Seconds of a memory-bound operator of kind `op` moving `bytes` (reads + writes):
  // bytes / op_bandwidth[op] (else memory_bandwidth) + launch_s.
  double op_seconds(const std::string& op, double bytes, int threads) const;
  // Seconds of attention forward (backward: `backward` true) over B x heads sequences of length T.
  double attention_seconds(const std::string& dtype, int64_t batch_heads, int64_t seq, int64_t head_dim,
                           bool backward, int threads) const;
  // Seconds of a collective over `ranks` ranks, inside one node or across nodes: a measured fit
  // when there is one for (op, ranks, level) (the nearest group size, its latency term scaled by
  // (n-1) and its bandwidth term by the ring's (n-1)/n, when the exact one is missing), else the
  // link model, ring (bandwidth-bound) or tree (latency-bound), whichever is faster.
  // `bytes` is always the FULL buffer, never a shard: all_reduce the buffer each rank holds
  // before and after; all_gather the gathered output (each rank contributes bytes/ranks);
  // reduce_scatter the input (each rank keeps bytes/ranks); broadcast the buffer; send_recv the
  // message (ranks ignored). With bandwidth bw and latency a of the level's link, n = ranks:
  //   all_reduce      min(ring 2(n-1)/n*bytes/bw + 2(n-1)a, tree 2*ceil(log2 n)*(a + bytes/bw))
  //   all_gather, reduce_scatter   (n-1)/n*bytes/bw + (n-1)a
  //   broadcast       min(ceil(log2 n)*(a + bytes/bw), bytes/bw + (n-1)a)
  //   send_recv       a + bytes/bw
  // Links hold the achieved (bus) bandwidth, so these are NCCL's busbw formulas. 0 for ranks <= 1.
  double collective_seconds(Collective op, int ranks, double bytes, bool inter_node) const;
  double peak_flops(FloatFormat f) const;

  nlohmann::json to_json() const;
  static HardwareProfile from_json(const nlohmann::json& j, const std::string& source);
};

// The profile a recipe plans with: hardware.profile when set (a file written by `runner
// calibrate`; a missing or malformed file is a UserError at hardware.profile), else the built-in
// profile of hardware.device; the recipe's topology (devices_per_node, nodes, link bandwidths
// and latencies when given) overrides the file's.
HardwareProfile hardware_profile(const HardwareConfig& hw);
HardwareProfile hardware_profile(const HardwareConfig& hw, const std::string& profile_file);
// The built-in profile of a device kind (no file).
HardwareProfile builtin_profile(const HardwareConfig& hw);

}  // namespace runner
