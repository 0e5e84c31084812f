// Which GEMM path each 16-bit dtype takes on this machine, chosen by measurement.
//
// A Linear over bf16 (or fp16) tensors can run two ways: widen its operands to fp32 and call
// OpenBLAS's sgemm ("fp32-sgemm", the executor's default for every operator), or hand the
// 16-bit operands as stored to oneDNN's matmul ("onednn-bf16": bf16 products accumulated in
// fp32). Which is faster depends on the CPU: with AMX oneDNN runs several times faster than
// sgemm; with only AVX512-BF16 it was measured slower than sgemm (~170 vs ~290 GFLOP/s on 2
// cores), conversions included. So the choice is measured once per process, at a representative
// shape, as the sgemm peak is (ops/peak.h), and reported. fp32 always takes sgemm.
//
// RUNNER_GEMM_PATH=auto|onednn|sgemm (environment) overrides the measurement: "onednn" takes
// oneDNN wherever it is available (and says so where it is not), "sgemm" never takes it.
//
// The executor's dry run reads the same choice (gemm_paths()) as the real run, so the ledger
// counts the fp32 copies of exactly the operators that are widened.
//
// On a GPU the choice is not measured: cuBLASLt reads 16-bit operands as stored with fp32
// accumulation ("cublaslt-bf16", GemmPath::Device), so nothing is widened. The CUDA backend's
// selection sets it for the process (runner/device/device.cpp), and the plan of a GPU device
// kind dry-runs under it (ScopedGemmPaths), so the ledger prices the GPU's memory, not the
// CPU executor's widening copies.
#pragma once
#include <cstdint>
#include <string>

#include "ops/tensor.h"

namespace ops {

// OneDnn and Device both hand 16-bit operands as stored to Backend::matmul16_* (no widening).
enum class GemmPath : uint8_t { Sgemm, OneDnn, Device };
enum class GemmMode : uint8_t { Auto, OneDnn, Sgemm, Device };

// "fp32-sgemm", "onednn-bf16" / "onednn-f16", or "cublaslt-bf16" / "cublaslt-f16".
std::string gemm_path_name(GemmPath p, DType t);

// One 16-bit dtype's choice and the measurements behind it.
struct GemmChoice {
  DType dtype = DType::BF16;
  GemmPath path = GemmPath::Sgemm;
  bool onednn_available = false;
  // Measured throughput of one Linear's three GEMMs (forward, d(input), d(weight)) at the
  // probe shape, counting the 16-bit -> fp32 conversions the sgemm path pays; 0: not measured.
  double sgemm_gflops = 0, onednn_gflops = 0;
  // The same Linear in fp32 (no conversions), measured alongside: what 16-bit compute is
  // compared with when the runner says whether it is slower than fp32 here; 0: not measured.
  double fp32_gflops = 0;
  std::string why;  // "measured", "RUNNER_GEMM_PATH=sgemm", or why oneDNN is unavailable
  std::string onednn_impl;  // oneDNN's kernel (e.g. "brg:avx512_core_amx"), empty when unavailable

  std::string path_name() const { return gemm_path_name(path, dtype); }
  // "bf16: fp32-sgemm (sgemm 290 GFLOP/s vs onednn-bf16 160 GFLOP/s)"
  std::string summary() const;
};

struct GemmPaths {
  GemmMode mode = GemmMode::Auto;
  GemmChoice bf16, f16;
  // The probe shape: a Linear of (N, C) -> (N, OC).
  int probe_N = 0, probe_C = 0, probe_OC = 0;

  const GemmChoice& of(DType t) const { return t == DType::F16 ? f16 : bf16; }
  // One line for the start-up log: "GEMM path: bf16: ...; f16: ...".
  std::string summary() const;
  // The same as one JSON object (for the run directory), e.g.
  // {"mode":"auto","probe":[512,768,2304],"bf16":{"path":"fp32-sgemm","sgemm_gflops":290.1,
  //  "onednn_gflops":161.3,"why":"measured","onednn_impl":"brg:avx512_core_bf16"},"f16":{...}}
  std::string to_json() const;
};

// RUNNER_GEMM_PATH from the environment (unset or empty: Auto). Throws std::invalid_argument
// naming the accepted values for anything else.
GemmMode gemm_mode_from_env();
const char* gemm_mode_name(GemmMode m);

// Measures (Auto) or resolves (forced) the path of each 16-bit dtype: a few hundred
// milliseconds for Auto where oneDNN is available, nothing otherwise.
GemmPaths choose_gemm_paths(GemmMode mode);
inline GemmPaths choose_gemm_paths() { return choose_gemm_paths(gemm_mode_from_env()); }

// The faster of two measured throughputs (ties and unmeasured oneDNN: sgemm).
GemmPath faster_path(double sgemm_gflops, double onednn_gflops);

// This process's choice: choose_gemm_paths() on the first call, then the same answer. The
// trainer prints gemm_paths().summary() at start-up and writes to_json() into the run directory.
const GemmPaths& gemm_paths();
// Replaces this process's choice (tests, or a caller that measured itself). Call it before any
// executor runs or simulates: a dry run and a real run must see the same paths.
void set_gemm_paths(const GemmPaths& p);

// The path a Linear whose operands are stored in t takes (fp32, and any non-16-bit dtype: Sgemm).
GemmPath gemm_path(DType t);
// Whether a Linear in t reads its 16-bit operands as stored (oneDNN or the device's GEMM).
inline bool reads_as_stored(GemmPath p) { return p != GemmPath::Sgemm; }

// The GPU's paths (mode Device): every 16-bit dtype on the backend's own GEMM, nothing measured.
GemmPaths device_gemm_paths();
// Whether this process's choice is device_gemm_paths() (set when the CUDA backend was selected):
// a GPU run keeps it whatever a run directory recorded for the CPU.
bool gemm_paths_on_device();
// The same for this thread's answer (a ScopedGemmPaths in force counts), without
// measuring: whether the executor plans for the GPU's kernels, which have no 16-bit-native ones.
bool gemm_paths_device_now();

// Within its scope, this thread's gemm_paths() and gemm_path() answer `p` (the plan of a GPU
// device kind dry-runs under device_gemm_paths() on any machine); the process's choice is
// untouched and returns at the end of the scope.
class ScopedGemmPaths {
 public:
  explicit ScopedGemmPaths(const GemmPaths& p);
  ~ScopedGemmPaths();
  ScopedGemmPaths(const ScopedGemmPaths&) = delete;
  ScopedGemmPaths& operator=(const ScopedGemmPaths&) = delete;

 private:
  GemmPaths paths_;
  const GemmPaths* prev_;
};

// Measured GFLOP/s of one Linear's three GEMMs at (N, C) -> (N, OC) in 16-bit dtype t on each
// path (the sgemm path includes widening its 16-bit operands), best of `reps` after a warm-up;
// onednn is 0 when oneDNN is unavailable for t; fp32 the same GEMMs on fp32 operands. Also used by bench/bench_kernels.
struct GemmMeasurement {
  double sgemm_gflops = 0, onednn_gflops = 0, fp32_gflops = 0;
};
GemmMeasurement measure_gemm_paths(DType t, int N, int C, int OC, int reps);

}  // namespace ops
