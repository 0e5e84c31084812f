// The GEMM path of a run's compute format, in words (see gemm_report.h).
#include "runner/perf/gemm_report.h"

#include <fmt/format.h>

#include "ops/gemm_path.h"

namespace runner {

namespace {

// The instruction set behind oneDNN's kernel name, for a reader who knows AMX but not "brg".
std::string isa_of(const std::string& impl) {
  if (impl.find("amx") != std::string::npos) return "AMX";
  if (impl.find("avx512_core_bf16") != std::string::npos) return "AVX512-BF16";
  if (impl.find("avx512_core_fp16") != std::string::npos) return "AVX512-FP16";
  if (impl.find("avx512") != std::string::npos) return "AVX-512";
  if (impl.find("avx2") != std::string::npos) return "AVX2";
  return "";
}

std::string measured(const ops::GemmChoice& c, const ops::GemmPaths& p) {
  if (c.sgemm_gflops <= 0 && c.onednn_gflops <= 0) return "";
  std::string s = fmt::format(" | measured at a {}x{} -> {} Linear: ", p.probe_N, p.probe_C, p.probe_OC);
  if (c.onednn_gflops > 0) s += fmt::format("{} {:.0f} GFLOP/s, ", c.path == ops::GemmPath::OneDnn ? "this path" : "oneDNN",
                                            c.onednn_gflops);
  s += fmt::format("widened to sgemm {:.0f}", c.sgemm_gflops);
  if (c.fp32_gflops > 0) s += fmt::format(", fp32 compute {:.0f}", c.fp32_gflops);
  return s;
}

std::string slower_warning(const std::string& name, const ops::GemmChoice& c) {
  const std::string then = fmt::format("; {} saves memory here, not time: precision.compute: fp32 trains faster", name);
  if (c.path == ops::GemmPath::OneDnn) {
    if (c.fp32_gflops <= 0 || c.onednn_gflops <= 0 || c.onednn_gflops >= c.fp32_gflops) return "";
    return fmt::format("{} compute is slower than fp32 on this machine: oneDNN's {} GEMMs measured {:.0f} GFLOP/s against "
                       "fp32's {:.0f}{}", name, name, c.onednn_gflops, c.fp32_gflops, then);
  }
  std::string s = fmt::format("{} compute is slower than fp32 on this machine: its GEMMs widen the operands to fp32 and run "
                              "fp32's own sgemm with the conversions on top", name);
  // The figures are quoted only where they agree: on a small probe the widened GEMM can
  // measure as fast as fp32's (noise), which a "slower" beside it would contradict.
  if (c.sgemm_gflops > 0 && c.fp32_gflops > 0 && c.sgemm_gflops < c.fp32_gflops)
    s += fmt::format(" (measured {:.0f} against fp32's {:.0f} GFLOP/s)", c.sgemm_gflops, c.fp32_gflops);
  else if (c.sgemm_gflops > 0 && c.fp32_gflops > 0)
    s += fmt::format(" (the probe's GEMM alone measured alike, {:.0f} and fp32's {:.0f} GFLOP/s; the conversions of every "
                     "operand in training come on top)", c.sgemm_gflops, c.fp32_gflops);
  s += then;
  if (c.why.find("RUNNER_GEMM_PATH=sgemm") != std::string::npos && c.onednn_available)
    s += "; or unset RUNNER_GEMM_PATH=sgemm, which keeps it off oneDNN's path";
  return s;
}

}  // namespace

GemmReport gemm_report(FloatFormat compute) {
  GemmReport g;
  const std::string fp32 = "fp32: fp32-sgemm (OpenBLAS sgemm on fp32 operands)";
  if (compute == FloatFormat::fp32) {
    g.lines.push_back(ops::gemm_paths_on_device() ? "fp32: cublaslt-fp32 (cuBLASLt, fp32 compute, no TF32)" : fp32);
    return g;
  }
  const ops::GemmPaths& p = ops::gemm_paths();
  const ops::GemmChoice& c = p.of(compute == FloatFormat::bf16 ? ops::DType::BF16 : ops::DType::F16);
  const std::string name = to_string(compute);
  if (c.path == ops::GemmPath::Device) {  // a GPU: nothing measured, nothing widened
    g.lines.push_back(fmt::format("{}: {} (cuBLASLt on {} operands as stored, fp32 accumulation)", name, c.path_name(), name));
    g.lines.push_back("fp32: cublaslt-fp32 (cuBLASLt, fp32 compute, no TF32)");
    return g;
  }
  std::string line = name + ": " + c.path_name();
  const std::string why = c.why == "measured" ? "" : "; " + c.why;  // the measurement follows
  if (c.path == ops::GemmPath::OneDnn) {
    const std::string isa = isa_of(c.onednn_impl);
    line += fmt::format(" (oneDNN's {} matmul, kernel {}{}{})", name, c.onednn_impl.empty() ? "?" : c.onednn_impl,
                        isa.empty() ? "" : ": " + isa, why);
  } else {
    line += fmt::format(" (operands widened to fp32, then OpenBLAS sgemm{})", why);
  }
  g.lines.push_back(line + measured(c, p));
  g.lines.push_back(fp32);  // what the run's format is compared with
  g.warning = slower_warning(name, c);
  return g;
}

}  // namespace runner
