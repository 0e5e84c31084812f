// The MFU peak and its per-machine cache (see peak.h).
//
// The cache is one small JSON file per CPU model and thread count, written to a temporary name
// and renamed, so ranks on one node that measure at once never read half a file; the last
// writer wins, and they all measured the same machine under the same load.
#include "runner/perf/peak.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "ops/knobs.h"
#include "ops/peak.h"
#include "runner/device/devices.h"
#include "runner/errors.h"

namespace fs = std::filesystem;

namespace runner {

namespace {

constexpr int kRounds = 3;  // each the best of >= 0.4 s of 1024^3 sgemms (ops/peak.h)

enum class CacheMode { On, Off, Refresh };

CacheMode cache_mode() {
  const std::string& s = ops::knobs().peak_cache;
  if (s.empty() || s == "on") return CacheMode::On;
  if (s == "off") return CacheMode::Off;
  if (s == "refresh") return CacheMode::Refresh;
  throw UserError({}, fmt::format("RUNNER_PEAK_CACHE={} is not a cache mode", s),
                  "set it to on (the default: measure once per machine), off (measure at every start, no cache) or "
                  "refresh (measure now and replace the cached figure), or unset it");
}

std::string now_utc() {
  const std::time_t t = std::time(nullptr);
  std::tm tm{};
  ::gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

// "Intel(R) Xeon(R) Processor" -> "Intel_R_Xeon_R_Processor".
std::string file_word(const std::string& s) {
  std::string o;
  for (char c : s) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '.';
    if (ok) o += c;
    else if (!o.empty() && o.back() != '_') o += '_';
  }
  while (!o.empty() && o.back() == '_') o.pop_back();
  return o.empty() ? "cpu" : o;
}

std::string threads_word(int threads) { return fmt::format("{} thread{}", threads, threads == 1 ? "" : "s"); }

// The best of kRounds measurements, a short pause between them so that a neighbour's burst
// that spoils one round may have passed by the next.
double measure_best() {
  double best = 0;
  for (int i = 0; i < kRounds; ++i) {
    if (i > 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    best = std::max(best, ops::measure_cpu_gemm_peak_flops());
  }
  return best;
}

// The cached record of `file` when it is this machine's and sane; null otherwise.
nlohmann::json read_cache(const fs::path& file, const std::string& model, int threads) {
  try {
    std::ifstream in(file);
    if (!in) return nullptr;
    nlohmann::json j = nlohmann::json::parse(in);
    if (j.value("cpu_model", "") != model || j.value("threads", 0) != threads || !(j.value("flops", 0.0) > 0))
      return nullptr;
    return j;
  } catch (const std::exception&) {
    return nullptr;  // unreadable: measured again and rewritten
  }
}

// Writes the record; the reason it could not, else empty.
std::string write_cache(const fs::path& file, const nlohmann::json& j) {
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  if (ec) return ec.message();
  fs::path tmp = file;
  tmp += fmt::format(".tmp{}", ::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!(out << j.dump(2) << "\n")) return "cannot write " + tmp.string();
  }
  fs::rename(tmp, file, ec);
  if (ec) {
    fs::remove(tmp, ec);
    return "cannot rename into place";
  }
  return "";
}

MfuPeak host_peak(int threads) {
  const CacheMode mode = cache_mode();
  const std::string model = cpu_model(), dir = peak_cache_dir();
  const std::string what = fmt::format("fp32 sgemm peak of this CPU ({}, {})", model, threads_word(threads));
  MfuPeak p;
  fs::path file;
  if (!dir.empty()) file = fs::path(dir) / fmt::format("peak-{}-{}t.json", file_word(model), threads);
  if (mode == CacheMode::On && !file.empty()) {
    const nlohmann::json j = read_cache(file, model, threads);
    if (!j.is_null()) {
      p.flops = j["flops"].get<double>();
      p.kind = "cached";
      p.cache_file = file.string();
      p.source = fmt::format("{}, cached: best of {} rounds measured {}, in {}; RUNNER_PEAK_CACHE=refresh re-measures",
                             what, j.value("rounds", kRounds), j.value("measured_at", "?"), file.string());
      return p;
    }
  }
  p.flops = measure_best();
  p.kind = "measured";
  std::string cached;
  if (mode == CacheMode::Off) {
    cached = "not cached (RUNNER_PEAK_CACHE=off)";
  } else if (file.empty()) {
    cached = "not cached (neither XDG_CACHE_HOME nor HOME is set)";
  } else {
    const nlohmann::json j{{"cpu_model", model}, {"threads", threads}, {"flops", p.flops}, {"rounds", kRounds},
                           {"measured_at", now_utc()}};
    const std::string why = write_cache(file, j);
    cached = why.empty() ? "cached in " + file.string() : fmt::format("not cached ({}: {})", file.string(), why);
    if (why.empty()) p.cache_file = file.string();
  }
  p.source = fmt::format("{}, measured now: best of {} rounds, {}", what, kRounds, cached);
  return p;
}

}  // namespace

std::string peak_cache_dir() {
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return (fs::path(x) / "runner").string();
  if (const char* h = std::getenv("HOME"); h && *h) return (fs::path(h) / ".cache" / "runner").string();
  return "";
}

std::string cpu_model() {
  std::ifstream f("/proc/cpuinfo");
  for (std::string line; std::getline(f, line);) {
    if (line.rfind("model name", 0) != 0) continue;
    const size_t colon = line.find(':');
    if (colon == std::string::npos) break;
    std::string m = line.substr(colon + 1);
    m.erase(0, m.find_first_not_of(" \t"));
    if (!m.empty()) return m;
  }
  return "unknown CPU";
}

MfuPeak mfu_peak(const HardwareConfig& hw, FloatFormat compute, int threads) {
  MfuPeak p;
  if (hw.peak_tflops > 0) {
    p.flops = hw.peak_tflops * 1e12;
    p.kind = "recipe";
    p.source = fmt::format("hardware.peak_tflops {:g} TFLOP/s per device, from the recipe", hw.peak_tflops);
    return p;
  }
  if (const double table = device_peak_flops(hw, compute); table > 0) {
    p.flops = table;
    p.kind = "device table";
    p.source = fmt::format("the device table's dense {} peak of a {}, {:g} TFLOP/s per device", to_string(compute),
                           hw.device, table / 1e12);
    return p;
  }
  return host_peak(threads);
}

void check_peak_cache_env() { cache_mode(); }

}  // namespace runner
